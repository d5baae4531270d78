"""File primitives: atomic replacement, directory fsync, advisory locks, staying inside."""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import stat
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

from autopersona_flows.errors import MemoryStoreCorruptionError, UnsafeLinkError

__all__ = [
    "StoreRoot",
    "atomic_write",
    "erase_entry",
    "fsync_dir",
    "keep_as_corrupt",
    "lock_file",
    "locks_path",
    "make_dirs",
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


class StoreRoot:
    """A store's folder, and the one way its files are opened: never outside it.

    The folder itself may be a link: where it leads is the store. Below it, a path
    is followed only as far as it stays inside; a bank, history, lock or folder
    linked elsewhere raises `UnsafeLinkError` and is neither read nor written.

    Args:
        given: The folder as given (messages name paths under it).
    """

    def __init__(self, given: Path) -> None:
        self.given = given
        self.real = Path(os.path.realpath(given))

    def inside(self, path: Path) -> Path:
        """Return where ``path`` (under `given`) leads, after checking it stays inside.

        A path that does not exist yet leads where it would be created.

        Raises:
            UnsafeLinkError: If ``path`` leads outside the store.
        """
        try:
            parts = path.relative_to(self.given).parts
        except ValueError:
            parts = None
        if parts is not None:
            # The common case in a few lstat calls, not a realpath of the whole path
            # (~10x dearer): no part below the root is a link.
            current = self.real
            for part in parts:
                current = current / part
                try:
                    mode = os.lstat(current).st_mode
                except (FileNotFoundError, NotADirectoryError):
                    return self.real.joinpath(*parts)  # nothing further exists to be a link
                if stat.S_ISLNK(mode):
                    break
            else:
                return current
        real = Path(os.path.realpath(path))
        if not real.is_relative_to(self.real):
            raise UnsafeLinkError(path, real, self.real)
        return real

    def open(self, path: Path, flags: int, mode: int = 0o644) -> int:
        """`os.open` the file ``path`` leads to, if that is inside the store (see `inside`).

        Raises:
            MemoryStoreCorruptionError: If it is not a regular file (e.g. a folder).
        """
        # O_NOFOLLOW: a link put in place after the check is refused, not followed.
        # O_NONBLOCK: a pipe in a file's place must not hang the open (files ignore it).
        flags |= os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
        fd = os.open(self.inside(path), flags, mode)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise MemoryStoreCorruptionError(path, None, "not a file (a folder, pipe or device)")
        return fd

    def reader(self, path: Path) -> BinaryIO:
        """Open ``path`` for reading where it leads, if that is inside the store."""
        return os.fdopen(self.open(path, os.O_RDONLY), "rb")


def write_all(fd: int, data: bytes) -> None:
    """Write every byte of ``data`` to ``fd``; `os.write` may write only part of it."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def atomic_write(path: Path, data: bytes, *, make_parents: bool = True) -> None:
    """Replace ``path`` with ``data``: written to a temporary file, fsynced, renamed.

    A reader (or a crash) sees the old content or the new, never a mix. Missing
    parent folders are created (durably, see `make_dirs`) unless ``make_parents``
    is false.
    """
    if make_parents:
        make_dirs(path.parent)
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


def make_dirs(folder: Path) -> None:
    """Create ``folder`` and whatever parents it lacks, each one durably.

    The folder holding each new one is fsynced, so that a crash cannot lose the
    new folder (and what is then written into it) after the call returns.

    Raises:
        NotADirectoryError: If something that is not a folder is in the way.
    """
    missing = []
    while True:
        # One stat per step: `is_dir()` then `exists()` would take a folder another
        # writer creates between the two calls for a file in the way.
        try:
            if stat.S_ISDIR(folder.stat().st_mode):
                break
        except FileNotFoundError:
            if not folder.is_symlink():  # a dangling link is in the way too
                missing.append(folder)
                folder = folder.parent
                continue
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(folder))
    for new in reversed(missing):
        new.mkdir(exist_ok=True)  # another writer may have made it meanwhile
        fsync_dir(new.parent)


def lock_file(path: Path, *, exclusive: bool) -> int | None:
    """Take an advisory lock on ``path`` and return its descriptor.

    An exclusive lock creates the lock file; a shared one does not, and returns
    ``None`` when the file does not exist yet (nothing has been written that a
    reader could see half of). The lock is held until `unlock_file`. Locks taken
    through different descriptors exclude each other, across processes and
    threads alike.
    """
    try:
        flags = os.O_RDWR | os.O_CREAT if exclusive else os.O_RDONLY
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
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


def locks_path(fd: int, path: Path) -> bool:
    """Whether the lock ``fd`` (from `lock_file`) is still on the file named ``path``.

    An erase removes a lock file while writers may wait on it: a writer that then
    gets that lock holds it on a file nobody else will open, and must lock anew.
    """
    try:
        named = os.lstat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_ino, held.st_dev) == (named.st_ino, named.st_dev)


def unlock_file(fd: int) -> None:
    """Release a lock taken by `lock_file`."""
    os.close(fd)  # closing the last descriptor releases the flock


def keep_as_corrupt(path: Path) -> Path:
    """Give ``path``'s file a second name, timestamped and ending in ``.corrupt``.

    A hard link: whatever then replaces or removes ``path`` leaves the old bytes
    where a person can read them. ``persona.history.jsonl`` is kept as e.g.
    ``persona.history.20260314T091500123456Z.corrupt``. What is not a regular file
    (a folder where a bank belongs) cannot be linked: it is moved there instead.

    Returns:
        The new name.
    """
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    kept = path.with_name(f"{path.name.removesuffix('.jsonl')}.{stamp}.corrupt")
    if stat.S_ISREG(os.lstat(path).st_mode):
        os.link(path, kept)
    else:
        path.replace(kept)
    fsync_dir(path.parent)
    return kept


def erase_entry(folder: Path, name: str) -> bool:
    """Remove ``folder / name`` and all it holds, durably, never following a link.

    ``folder`` must be a real path (no links: see `StoreRoot.inside`). The entry is
    first renamed to ``.<name>.erasing`` beside it and ``folder`` fsynced, so that
    readers, and a crash, find it whole or not at all; then that is removed and
    ``folder`` fsynced again. A ``.<name>.erasing`` left by an erase cut short is
    removed first, so calling this again finishes the job. A link is removed as a
    link, at the top or anywhere below (``shutil.rmtree`` does not follow them):
    what it points to is never touched.

    Returns:
        Whether there was anything to remove.
    """
    tomb = folder / f".{name}.erasing"
    found = _remove(tomb)
    try:
        (folder / name).rename(tomb)
    except FileNotFoundError:
        if found:
            fsync_dir(folder)
        return found
    fsync_dir(folder)
    _remove(tomb)
    fsync_dir(folder)
    return True


def _remove(path: Path) -> bool:
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return False
    if stat.S_ISDIR(mode):
        shutil.rmtree(path)
    else:
        path.unlink()
    return True


def stat_key(result: os.stat_result) -> tuple[int, ...]:
    """What identifies one state of a file: inode, device, size and timestamps."""
    return (result.st_ino, result.st_dev, result.st_size, result.st_mtime_ns, result.st_ctime_ns)
