"""User ids: what is accepted, and the file-system name each one maps to."""

from __future__ import annotations

import hashlib
import re
from typing import Any

from autopersona_flows.errors import InvalidUserIdError

__all__ = ["check_user_id", "is_user_key", "user_key"]

_MAX_LENGTH = 1024
_SLUG_LENGTH = 32
_UNSAFE = re.compile(r"[^a-z0-9]+")
_KEY = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,30}[a-z0-9])?-[0-9a-f]{32}")


def check_user_id(user_id: Any) -> str:
    """Return ``user_id`` if it is a usable user id.

    Any non-empty string of valid Unicode up to 1024 characters is a user id, and
    it is used exactly as given: ``"Alice"``, ``"alice"`` and ``" alice"`` are three users.

    Raises:
        InvalidUserIdError: If it is not a string, is empty, is too long, or holds a
            lone surrogate.
    """
    if not isinstance(user_id, str):
        raise InvalidUserIdError(f"a user id must be a str, not {type(user_id).__name__}")
    if not user_id:
        raise InvalidUserIdError("a user id must not be empty")
    if len(user_id) > _MAX_LENGTH:
        raise InvalidUserIdError(f"a user id must be at most {_MAX_LENGTH} characters")
    try:
        user_id.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidUserIdError(
            f"user id {user_id!r} holds a lone surrogate at index {exc.start}"
        ) from None
    return user_id


def user_key(user_id: str) -> str:
    """Return the file-system name of a user's bank: a readable slug plus a digest.

    The digest is the SHA-256 of the exact id, so two different ids never share a
    name (case, non-ASCII text, spaces and separators all count), and the name holds
    only ``[a-z0-9-]``, so it can never leave the folder it is joined to.
    """
    slug = _UNSAFE.sub("-", check_user_id(user_id).lower()).strip("-")[:_SLUG_LENGTH].strip("-")
    digest = hashlib.sha256(user_id.encode("utf-8")).hexdigest()[:32]
    return f"{slug or 'user'}-{digest}"


def is_user_key(name: str) -> bool:
    """Whether ``name`` has the shape `user_key` gives every user folder.

    A name of any other shape was not made by the store (``.DS_Store``, ``notes``),
    so it is never a user's folder.
    """
    return _KEY.fullmatch(name) is not None
