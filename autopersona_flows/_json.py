"""The one place that turns data into bytes: storage lines, canonical JSON and digests."""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

__all__ = ["JSONDecodeError", "canonical", "digest", "dumps", "loads"]

loads = orjson.loads
JSONDecodeError = orjson.JSONDecodeError


def dumps(value: Any) -> bytes:
    """Serialize compactly, keeping key order (used for storage lines)."""
    return orjson.dumps(value)


def canonical(value: Any) -> bytes:
    """Serialize with sorted keys, so equal data gives equal bytes in every process."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def digest(value: Any) -> str:
    """SHA-256 hex digest of the canonical JSON of ``value``."""
    return hashlib.sha256(canonical(value)).hexdigest()
