"""What both evaluations share: ratios, reading JSONL, describing validation errors."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from pydantic import ValidationError

from autopersona_flows.errors import EvaluationError

__all__ = ["describe", "f1", "lines", "ratio"]


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


def describe(exc: ValidationError) -> str:
    """Every error of ``exc`` as ``field.path: message``, on one line."""
    return "; ".join(
        f"{'.'.join(map(str, error['loc'])) or 'value'}: {error['msg']}" for error in exc.errors()
    )
