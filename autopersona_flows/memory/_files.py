"""Durable file primitives: atomic replacement, directory fsync and advisory locks."""

from __future__ import annotations

import fcntl
import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path

__all__ = [
    "atomic_write",
    "fsync_dir",
    "keep_as_corrupt",
    "lock_file",
    "stat_key",
    "unlock_file",
    "write_all",
]


def fsync_dir(path: Path) -> None:
    """Flush a directory entry change (a create or rename) to disk."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes) -> None:
    """Write every byte of ``data`` to ``fd``; `os.write` may write only part of it."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def atomic_write(path: Path, data: bytes, *, make_parents: bool = True) -> None:
    """Replace ``path`` with ``data``: written to a temporary file, fsynced, renamed.

    A reader (or a crash) sees the old content or the new, never a mix. Missing
    parent folders are created unless ``make_parents`` is false.
    """
    if make_parents:
        path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        try:
            write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        Path(tmp).replace(path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def lock_file(path: Path, *, exclusive: bool) -> int | None:
    """Take an advisory lock on ``path`` and return its descriptor.

    An exclusive lock creates the lock file; a shared one does not, and returns
    ``None`` when the file does not exist yet (nothing has been written that a
    reader could see half of). The lock is held until `unlock_file`. Locks taken
    through different descriptors exclude each other, across processes and
    threads alike.
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT if exclusive else os.O_RDONLY, 0o644)
    except FileNotFoundError:
        if exclusive:
            raise
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
    except BaseException:
        os.close(fd)
        raise
    return fd


def unlock_file(fd: int) -> None:
    """Release a lock taken by `lock_file`."""
    os.close(fd)  # closing the last descriptor releases the flock


def keep_as_corrupt(path: Path) -> Path:
    """Give ``path``'s file a second name, timestamped and ending in ``.corrupt``.

    A hard link: whatever then replaces or removes ``path`` leaves the old bytes
    where a person can read them. ``persona.history.jsonl`` is kept as e.g.
    ``persona.history.20260314T091500123456Z.corrupt``.

    Returns:
        The new name.
    """
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    kept = path.with_name(f"{path.name.removesuffix('.jsonl')}.{stamp}.corrupt")
    os.link(path, kept)
    fsync_dir(path.parent)
    return kept


def stat_key(stat: os.stat_result) -> tuple[int, ...]:
    """What identifies one state of a file: inode, device, size and timestamps."""
    return (stat.st_ino, stat.st_dev, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
