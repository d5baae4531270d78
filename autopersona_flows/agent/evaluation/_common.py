"""What the evaluations share: ratios, reading JSONL cases, telling which kind a file is."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Literal, TypeVar

from pydantic import BaseModel, ValidationError

from autopersona_flows import _json
from autopersona_flows._validation import describe
from autopersona_flows.errors import EvaluationError

__all__ = ["cases_kind", "f1", "lines", "ratio", "read_cases"]

Case = TypeVar("Case", bound=BaseModel)


def ratio(numerator: float, denominator: float) -> float:
    """``numerator / denominator``, and 1.0 for 0/0: a vacuous ratio is perfect."""
    return numerator / denominator if denominator else 1.0


def f1(precision: float, recall: float) -> float:
    """The harmonic mean of precision and recall; 0.0 when both are."""
    total = precision + recall
    return 2 * precision * recall / total if total else 0.0


def lines(path: str | Path) -> Iterator[tuple[int, bytes]]:
    """The non-blank lines of a file, numbered from 1.

    Raises:
        EvaluationError: If the file cannot be read.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise EvaluationError(f"cannot read {path}: {exc.strerror}") from exc
    for number, line in enumerate(data.split(b"\n"), start=1):
        if line.strip():
            yield number, line


def cases_kind(
    path: str | Path,
) -> Literal["judgement", "clarification", "timeline", "situations", "chats"]:
    """Which evaluation a cases file is for.

    A context-dependent episode has ``rounds``; a long-term chat case ``probes``; a
    memory-over-time case ``sessions``; a clarification set's cases have no
    ``expect``; the rest are judgement cases.

    Only the first case is looked at; whichever reader then runs checks every line.

    Raises:
        EvaluationError: If the file cannot be read.
    """
    for _, line in lines(path):
        try:
            first = _json.loads(line)
        except _json.JSONDecodeError:
            return "judgement"  # its reader reports the line
        if isinstance(first, dict) and "rounds" in first:
            return "situations"
        if isinstance(first, dict) and "probes" in first:
            return "chats"
        if isinstance(first, dict) and "sessions" in first:
            return "timeline"
        return "clarification" if isinstance(first, dict) and "expect" not in first else "judgement"
    return "judgement"


def read_cases(path: str | Path, model: type[Case], what: str) -> list[Case]:
    """Read one ``model`` as JSON a line (blank lines skipped); ``what`` names the set.

    Raises:
        EvaluationError: If the file cannot be read, a line is not a valid case
            (the message names the line and the field), two cases share a name,
            or the file holds no case.
    """
    cases: list[Case] = []
    names: dict[str, int] = {}
    for number, line in lines(path):
        try:
            raw = _json.loads(line)
        except _json.JSONDecodeError as exc:
            raise EvaluationError(f"{path}:{number}: not valid JSON ({exc})") from None
        try:
            case = model.model_validate(raw)
        except ValidationError as exc:
            raise EvaluationError(f"{path}:{number}: invalid case: {describe(exc)}") from None
        name = case.name  # type: ignore[attr-defined]  # every case model has one
        if name in names:
            raise EvaluationError(
                f"{path}:{number}: case {name!r} was already defined on line {names[name]}"
            )
        names[name] = number
        cases.append(case)
    if not cases:
        raise EvaluationError(f"{path} holds no case: {what} is empty")
    return cases
