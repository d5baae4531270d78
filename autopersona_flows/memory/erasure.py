"""Erasing a person: their memories in the store, and the snapshots written of them.

`erase_user` is what a person's request to be forgotten calls. It returns an
`ErasureReport` of counts and paths, never contents. What it cannot reach (Prefect's
result storage and artifacts, exports written elsewhere, backups, the disk's free
blocks) is listed in the README's "Erasing a person" section.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from autopersona_flows.memory._files import StoreRoot, erase_entry
from autopersona_flows.memory.protocol import MemoryStore
from autopersona_flows.memory.users import check_user_id, user_key

__all__ = ["ErasureReport", "erase_user"]


class ErasureReport(BaseModel):
    """What `erase_user` removed: counts and file names, never contents.

    Attributes:
        user_id: Whose memory was erased.
        found: Whether anything of the user was there to remove, in the store or
            among the snapshots. ``False`` means nothing was changed: a mistyped
            user id, or a user erased before.
        memories: Live memories removed from the store, in all layers.
        changes: Change-history entries removed from the store.
        snapshots: The snapshot files removed, by path (they were under
            ``<snapshots>/<user folder>/``, which is removed whole).
    """

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    user_id: str
    found: bool
    memories: int = Field(default=0, ge=0)
    changes: int = Field(default=0, ge=0)
    snapshots: list[str] = Field(default_factory=list)


def erase_user(
    store: MemoryStore, user_id: str, *, snapshots: str | os.PathLike[str] | None = None
) -> ErasureReport:
    """Erase a person: everything the store holds of them, and their snapshots.

    Runs `MemoryStore.erase`, then removes the folder the maintenance flow writes
    the user's snapshots to (``<snapshots>/<user folder>/``, see
    ``memory_maintenance``), durably and without following links. A maintenance
    run at the same time cannot leave a snapshot of what was erased: it writes no
    snapshot of a user with no memories, and removes the one it has just written
    if the user has none by then.

    Erasing a user of whom nothing is stored is not an error, so a request can be
    retried until it succeeds: the report's ``found`` is then ``False``.

    Args:
        store: The memory store.
        user_id: Whose memory to erase.
        snapshots: The maintenance flow's snapshot folder (its ``snapshot_dir``,
            or the ``snapshots`` setting); ``None`` leaves snapshots alone.

    Returns:
        What was removed.

    Raises:
        InvalidUserIdError: If ``user_id`` is not a valid user id.
        UnsafeLinkError: If the user's snapshot folder, or the store's ``users/``
            folder, leads out of its folder; the store is erased before snapshots,
            so a snapshot link leaves the store erased and the snapshots as they were.
    """
    check_user_id(user_id)
    erased = store.erase(user_id)
    # After the store: a maintenance run that snapshotted the user before the erase
    # has written its file by now (it holds a bank lock the erase takes), and one
    # that snapshots after it finds nothing and writes nothing.
    removed = [] if snapshots is None else _erase_snapshots(Path(snapshots), user_key(user_id))
    return ErasureReport(
        user_id=user_id,
        found=erased.found or bool(removed),
        memories=erased.memories,
        changes=erased.changes,
        snapshots=removed,
    )


def _erase_snapshots(snapshots: Path, key: str) -> list[str]:
    root = StoreRoot(snapshots)  # the snapshot folder may be a link; nothing below it
    folder = root.inside(snapshots / key)
    if folder != root.real / key:  # a link inside the folder: remove it, not its target
        folder = root.real / key
    try:
        names = sorted(entry.name for entry in os.scandir(folder) if entry.is_file())
    except (FileNotFoundError, NotADirectoryError):
        names = []
    found = erase_entry(root.real, key)
    return [str(snapshots / key / name) for name in names] if found else []
