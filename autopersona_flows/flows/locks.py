"""Step locks: of two runs replaying one episode at once, one runs a step, the other waits.

Prefect's cache does not lock by default (``READ_COMMITTED``): two runs that miss
the same key both run the step. Persona tasks are ``SERIALIZABLE`` with the
`FileLockManager` below, so the second waits for the first's result and reads it.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import threading
import time
from pathlib import Path
from typing import Any

from prefect.filesystems import LocalFileSystem, WritableFileSystem
from prefect.locking.protocol import LockManager
from prefect.settings import get_current_settings

__all__ = ["FileLockManager", "step_locks"]

_POLL = 0.05  # seconds between attempts while another holder has the lock


class FileLockManager(LockManager):
    """A Prefect lock manager on ``flock`` advisory locks, one file per key.

    Why not Prefect's own: `FileSystemLockManager` marks a lock by a file's existence,
    so a holder killed mid-step leaves a lock nobody frees (the task engine waits
    without a timeout: every replay of a crashed episode would hang), and a waiter
    may read the file between its creation and its contents; `MemoryLockManager`
    works within one process only. The kernel drops a ``flock`` when the process
    holding it dies, so a crash never blocks a replay.

    Locks exclude each other across processes and threads alike (each acquisition
    opens its own file). ``hold_timeout`` is ignored: a lock is held until released
    or until its process ends. The lock file is removed on release, while still
    held; a waiter that opened it before then finds it replaced and tries again.
    Across machines, locks hold only on a shared file system that supports
    ``flock`` (NFS with locking does).

    Args:
        folder: Where the lock files go; by default
            ``$PREFECT_HOME/autopersona/locks``, read at each use.
    """

    def __init__(self, folder: Path | None = None) -> None:
        self._folder = folder
        self._guard = threading.Lock()
        self._held: dict[str, tuple[str, int]] = {}  # key -> (holder, descriptor)

    def __repr__(self) -> str:
        return f"FileLockManager({self.folder})"

    def __deepcopy__(self, memo: dict[int, Any]) -> FileLockManager:
        return self  # a service shared by whoever holds it, as Prefect's managers are

    def __reduce__(self) -> tuple[Any, ...]:
        # A task sent to another process (Dask) takes the manager of its folder there:
        # the locks this process holds are this process's, its files shared by both.
        return (_manager, (self._folder,))

    @property
    def folder(self) -> Path:
        """The folder of the lock files."""
        if self._folder is not None:
            return self._folder
        return Path(get_current_settings().home) / "autopersona" / "locks"

    def _path(self, key: str) -> Path:
        return self.folder / f"{key}.lock"

    def _try_acquire(self, key: str) -> int | None:
        path = self._path(key)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:  # the first lock here: its folder is made once
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            opened = os.fstat(fd)
            current = path.stat()
        except (BlockingIOError, FileNotFoundError):  # held; or removed by its last holder
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        if (opened.st_dev, opened.st_ino) != (current.st_dev, current.st_ino):
            os.close(fd)  # the file locked is one its last holder removed
            return None
        return fd

    def _take(self, key: str, holder: str) -> bool:
        """Whether the lock is now ``holder``'s (taken, or held already); False if another's."""
        with self._guard:
            held = self._held.get(key)
        if held is not None and held[0] == holder:
            return True
        fd = self._try_acquire(key)
        if fd is None:
            return False
        with self._guard:
            self._held[key] = (holder, fd)
        return True

    def acquire_lock(
        self,
        key: str,
        holder: str,
        acquire_timeout: float | None = None,
        hold_timeout: float | None = None,
    ) -> bool:
        """Take the lock on ``key`` for ``holder``, waiting up to ``acquire_timeout`` s.

        Returns:
            True if taken (or already held by ``holder``); False on timeout.
        """
        deadline = None if acquire_timeout is None else time.monotonic() + acquire_timeout
        while not self._take(key, holder):
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(_POLL)
        return True

    async def aacquire_lock(
        self,
        key: str,
        holder: str,
        acquire_timeout: float | None = None,
        hold_timeout: float | None = None,
    ) -> bool:
        """`acquire_lock`, waiting without blocking the event loop."""
        deadline = None if acquire_timeout is None else time.monotonic() + acquire_timeout
        while not self._take(key, holder):
            if deadline is not None and time.monotonic() >= deadline:
                return False
            await asyncio.sleep(_POLL)
        return True

    def release_lock(self, key: str, holder: str) -> None:
        """Release ``holder``'s lock on ``key``.

        Raises:
            ValueError: If ``holder`` does not hold it (as Prefect's managers do).
        """
        with self._guard:
            held = self._held.get(key)
            if held is None or held[0] != holder:
                raise ValueError(f"No lock held by {holder} for transaction with key {key}")
            del self._held[key]
        self._path(key).unlink(missing_ok=True)  # before unlocking: see the class docstring
        os.close(held[1])  # closing the only descriptor releases the flock

    def is_locked(self, key: str) -> bool:
        """Whether anyone, in any process, holds the lock on ``key``."""
        with self._guard:
            if key in self._held:
                return True
        try:
            fd = os.open(self._path(key), os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # a probe; closing releases it
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False

    def is_lock_holder(self, key: str, holder: str) -> bool:
        """Whether ``holder`` holds the lock on ``key``."""
        with self._guard:
            held = self._held.get(key)
        return held is not None and held[0] == holder

    def wait_for_lock(self, key: str, timeout: float | None = None) -> bool:
        """Wait until nobody holds the lock on ``key``; False after ``timeout`` s."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.is_locked(key):
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(_POLL)
        return True

    async def await_for_lock(self, key: str, timeout: float | None = None) -> bool:
        """`wait_for_lock`, waiting without blocking the event loop."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.is_locked(key):
            if deadline is not None and time.monotonic() >= deadline:
                return False
            await asyncio.sleep(_POLL)
        return True


_MANAGERS: dict[Path | None, FileLockManager] = {}
_MANAGERS_GUARD = threading.Lock()


def step_locks(storage: Path | WritableFileSystem | None) -> FileLockManager:
    """The lock manager of persona steps whose results go to ``storage``.

    Beside local results (a ``.locks`` folder in them), so every process that shares
    the results shares the locks; for Prefect's default storage and remote blocks
    (S3, GCS), in ``$PREFECT_HOME``: replays are then serialised per machine only.
    """
    folder: Path | None = None
    if isinstance(storage, Path):
        folder = storage / ".locks"
    elif isinstance(storage, LocalFileSystem):
        folder = Path(storage.basepath or ".").expanduser() / ".locks"
    return _manager(folder.resolve() if folder is not None else None)


def _manager(folder: Path | None) -> FileLockManager:
    with _MANAGERS_GUARD:
        return _MANAGERS.setdefault(folder, FileLockManager(folder))
