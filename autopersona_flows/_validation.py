"""Validation errors as one line a person can act on."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from autopersona_flows.errors import IngestionError

__all__ = ["describe", "valid_lines"]

_M = TypeVar("_M", bound=BaseModel)

LISTED = 50  # bad lines named in one error; a file of the wrong kind would fill a screen


def describe(exc: ValidationError, whole: str = "value") -> str:
    """Every error of ``exc`` as ``field.path: message``, on one line.

    Args:
        exc: The validation error.
        whole: What to call the validated thing when an error is about all of it.
    """
    return "; ".join(
        f"{'.'.join(map(str, error['loc'])) or whole}: {error['msg']}" for error in exc.errors()
    )


def valid_lines(
    lines: Iterable[bytes], source: str | Path, model: type[_M], what: str
) -> list[tuple[int, _M]]:
    """Every non-blank JSONL line as a ``model``, with its line number; all or nothing.

    Every line is read before anything is returned, so one error lists every bad
    line (up to `LISTED`), and a caller that writes only what this returns writes
    nothing of a file with a bad line in it.

    Args:
        lines: The file's lines.
        source: The file, as the messages name it.
        model: What each line must be.
        what: What a line is, in the messages (``"task"``: "not valid tasks").

    Raises:
        IngestionError: If any line is not JSON or not a valid ``model``: a line
            ``source: N of M lines are not valid ...`` and then each bad one as
            ``source:line: field: what is wrong``.
    """
    parsed: list[tuple[int, _M]] = []
    bad: list[str] = []
    total = 0
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        total += 1
        try:
            parsed.append((number, model.model_validate_json(line)))
        except ValidationError as exc:
            bad.append(f"  {source}:{number}: {describe(exc, 'line')}")
    if bad:
        more = [f"  ... and {len(bad) - LISTED} more"] if len(bad) > LISTED else []
        if len(bad) == 1:
            heading = f"{source}: 1 of {total} lines is not a valid {what}"
        else:
            heading = f"{source}: {len(bad)} of {total} lines are not valid {what}s"
        heading += ", so nothing is ingested:"
        raise IngestionError("\n".join([heading, *bad[:LISTED], *more]))
    return parsed
