"""Opening a memory store from its address, as settings and the command line give it."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from autopersona_flows.errors import MemoryStoreError, SnapshotError
from autopersona_flows.memory.jsonl import JsonlMemoryStore
from autopersona_flows.memory.protocol import MemoryStore
from autopersona_flows.memory.snapshots import MemorySnapshot

__all__ = ["is_postgres", "migrate", "open_store"]

_POSTGRES = re.compile(r"^postgres(ql)?(\+\w+)?://", re.IGNORECASE)
_KEYWORDS = re.compile(r"^\s*\w+\s*=")  # libpq's "host=... dbname=..." form


def open_store(address: str | os.PathLike[str]) -> MemoryStore:
    """The store at ``address``.

    Args:
        address: ``postgresql://user:password@host:port/db`` (also ``postgres://`` or
            ``postgresql+driver://``) for a `PostgresMemoryStore` (the ``postgres``
            extra), with ``?search=database`` for its search inside PostgreSQL (the
            other query parameters go to libpq); ``jsonl:FOLDER`` or a folder path
            for a `JsonlMemoryStore`.

    Raises:
        MemoryStoreError: If ``address`` looks like another kind of URL or a libpq
            keyword string (it would otherwise become a local folder of that name),
            or its ``search`` is neither ``memory`` nor ``database``.
    """
    text = os.fspath(address)
    if match := _POSTGRES.match(text):
        # Imported here: it needs the postgres extra, which a JSONL user may not have.
        from autopersona_flows.memory.postgres import PostgresMemoryStore  # noqa: PLC0415

        dsn = "postgresql://" + text[match.end() :]
        url = urlsplit(dsn)
        query = parse_qsl(url.query, keep_blank_values=True)
        search = [value for key, value in query if key == "search"]
        if not search:
            return PostgresMemoryStore(dsn)
        libpq = urlencode([(key, value) for key, value in query if key != "search"])
        dsn = urlunsplit(url._replace(query=libpq))
        return PostgresMemoryStore(dsn, search=search[-1])  # type: ignore[arg-type]  # checked there
    if text.startswith("jsonl:"):
        return JsonlMemoryStore(Path(text.removeprefix("jsonl:")).expanduser())
    if "://" in text or _KEYWORDS.match(text):
        scheme = text.split("://", 1)[0] if "://" in text else "a keyword string"
        raise MemoryStoreError(
            f"unsupported store address ({scheme}): use postgresql://..., jsonl:FOLDER or a folder"
        )
    return JsonlMemoryStore(Path(text).expanduser())


def is_postgres(address: str | os.PathLike[str]) -> bool:
    """Whether ``address`` names a PostgreSQL store."""
    return bool(_POSTGRES.match(os.fspath(address)))


def migrate(
    source: MemoryStore,
    dest: MemoryStore,
    *,
    users: Iterable[str] | None = None,
    replace: bool = False,
) -> list[MemorySnapshot]:
    """Copy users' memories from one store to another, verifying each by fingerprint.

    Each user is one snapshot of the source restored into the destination; ids,
    timestamps and embeddings are kept, so the fingerprints must agree.

    Args:
        source: Where the memories are.
        dest: Where they go.
        users: Only these users; every user of the source by default.
        replace: Overwrite users who already have memories in ``dest``.

    Returns:
        The snapshots copied, one per user.

    Raises:
        SnapshotError: If a user already has memories in ``dest`` and ``replace`` is
            false (nothing of that user is written), or the copy's fingerprint differs.
    """
    copied = []
    for user_id in source.users() if users is None else users:
        snapshot = source.snapshot(user_id)
        dest.restore(snapshot, replace=replace)
        landed = dest.snapshot_fingerprint(user_id)
        if landed != snapshot.fingerprint:
            raise SnapshotError(
                f"user {user_id!r} landed with fingerprint {landed}, "
                f"expected {snapshot.fingerprint}"
            )
        copied.append(snapshot)
    return copied
