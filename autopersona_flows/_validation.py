"""Validation errors as one line a person can act on."""

from __future__ import annotations

from pydantic import ValidationError

__all__ = ["describe"]


def describe(exc: ValidationError, whole: str = "value") -> str:
    """Every error of ``exc`` as ``field.path: message``, on one line.

    Args:
        exc: The validation error.
        whole: What to call the validated thing when an error is about all of it.
    """
    return "; ".join(
        f"{'.'.join(map(str, error['loc'])) or whole}: {error['msg']}" for error in exc.errors()
    )
