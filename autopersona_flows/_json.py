"""orjson in one place: canonical JSON and digests (fingerprints, content identity).

Records themselves are serialised by pydantic (``model_dump_json``), which writes
the same compact JSON; this module is for data that is not a model.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

__all__ = [
    "Fragment",
    "JSONDecodeError",
    "JSONEncodeError",
    "canonical",
    "digest",
    "dumps",
    "loads",
]

loads = orjson.loads
Fragment = orjson.Fragment  # JSON already dumped, written as it is inside a value
JSONDecodeError = orjson.JSONDecodeError
JSONEncodeError = orjson.JSONEncodeError


def dumps(value: Any) -> bytes:
    """Serialize compactly, keeping key order (used for storage lines)."""
    return orjson.dumps(value)


def canonical(value: Any) -> bytes:
    """Serialize with sorted keys, so equal data gives equal bytes in every process."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def digest(value: Any) -> str:
    """SHA-256 hex digest of the canonical JSON of ``value``."""
    return hashlib.sha256(canonical(value)).hexdigest()
