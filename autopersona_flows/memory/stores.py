"""Opening a memory store from its address, as settings and the command line give it."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from autopersona_flows.errors import SnapshotError
from autopersona_flows.memory.jsonl import JsonlMemoryStore
from autopersona_flows.memory.protocol import MemoryStore
from autopersona_flows.memory.snapshots import MemorySnapshot

__all__ = ["is_postgres", "migrate", "open_store"]

_POSTGRES = ("postgresql://", "postgres://")


def open_store(address: str | os.PathLike[str]) -> MemoryStore:
    """The store at ``address``.

    Args:
        address: ``postgresql://user:password@host:port/db`` (or ``postgres://``) for a
            `PostgresMemoryStore` (the ``postgres`` extra); ``jsonl:FOLDER`` or a plain
            folder path for a `JsonlMemoryStore`.
    """
    text = os.fspath(address)
    if text.startswith(_POSTGRES):
        # Imported here: it needs the postgres extra, which a JSONL user may not have.
        from autopersona_flows.memory.postgres import PostgresMemoryStore  # noqa: PLC0415

        return PostgresMemoryStore(text)
    return JsonlMemoryStore(Path(text.removeprefix("jsonl:")).expanduser())


def is_postgres(address: str | os.PathLike[str]) -> bool:
    """Whether ``address`` names a PostgreSQL store."""
    return os.fspath(address).startswith(_POSTGRES)


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
