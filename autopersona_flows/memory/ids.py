"""Time-sortable, unique memory ids.

An id is 26 characters of Crockford base32 encoding 128 bits: a 48-bit Unix time
in milliseconds followed by 80 random bits (the ULID layout). Ids sort by
creation time as plain strings; within one process they are strictly increasing,
because ids made in the same millisecond increment the previous random part.
"""

from __future__ import annotations

import re
import secrets
import threading
import time

__all__ = ["MEMORY_ID_PATTERN", "new_memory_id"]

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_RANDOM_BITS = 80
_RANDOM_MAX = (1 << _RANDOM_BITS) - 1

MEMORY_ID_PATTERN = re.compile(r"^[0-7][0-9A-HJKMNP-TV-Z]{25}$")
"""What a valid memory id looks like."""

_lock = threading.Lock()
_last_ms = -1
_last_random = 0


def _encode(value: int) -> str:
    chars = []
    for _ in range(26):
        value, index = divmod(value, 32)
        chars.append(_ALPHABET[index])
    return "".join(reversed(chars))


def new_memory_id() -> str:
    """Return a new id, greater than every id this process made before."""
    global _last_ms, _last_random  # noqa: PLW0603 - process-wide monotonic clock state
    with _lock:
        now_ms = time.time_ns() // 1_000_000
        if now_ms > _last_ms:
            _last_ms, _last_random = now_ms, secrets.randbits(_RANDOM_BITS)
        elif _last_random < _RANDOM_MAX:
            # Same millisecond (or the clock stepped back): keep order by counting up.
            _last_random += 1
        else:
            _last_ms, _last_random = _last_ms + 1, secrets.randbits(_RANDOM_BITS)
        return _encode((_last_ms << _RANDOM_BITS) | _last_random)
