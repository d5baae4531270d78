"""Step locks: of two runs replaying one episode at once, one runs a step, the other waits.

Prefect's cache does not lock by default (``READ_COMMITTED``): two runs that miss
the same key both run the step. Persona tasks are ``SERIALIZABLE`` with the
`FileLockManager` below, so the second waits for the first's result and reads it,
for ``step_lock_timeout`` seconds at most (the setting; 15 minutes by default).
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import socket
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prefect.context import FlowRunContext
from prefect.filesystems import LocalFileSystem, WritableFileSystem
from prefect.locking.protocol import LockManager
from prefect.settings import get_current_settings

from autopersona_flows import _json
from autopersona_flows.errors import StepLockTimeoutError
from autopersona_flows.flows.settings import load_settings

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
    or until its process ends. A caller that gives no timeout (Prefect's
    transactions and result reads give none) waits ``step_lock_timeout`` seconds,
    then gets `StepLockTimeoutError` naming the holder, which each lock file
    describes (process, host, flow run, since when). The lock file is removed on
    release, while still held; a waiter that opened it before then finds it
    replaced and tries again.
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

    def _describe_holder(self, fd: int) -> None:
        """Write who holds the lock into its file, for a waiter that gives up to name."""
        run = FlowRunContext.get()
        held = {
            "process": os.getpid(),
            "host": socket.gethostname(),
            "flow_run": str(run.flow_run.id) if run and run.flow_run else None,
            "since": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, _json.dumps(held), 0)

    def _gave_up(self, key: str, waited: float) -> StepLockTimeoutError:
        try:
            held = _json.loads(self._path(key).read_bytes())
            who = (
                f"process {held['process']} on {held['host']}"
                + (f" (flow run {held['flow_run']})" if held["flow_run"] else "")
                + f", held since {held['since']}"
            )
        except (OSError, ValueError, KeyError, TypeError):  # released meanwhile, or mid-write
            who = "another run (which one is unknown), held since before the wait began"
        return StepLockTimeoutError(
            key,
            f"step {key!r} is being run by {who}; gave up waiting for it after {waited:.0f} s. "
            "Its tool may be stuck: cancel that run, or wait longer with "
            "PREFECT_INTEGRATIONS_AUTOPERSONA_STEP_LOCK_TIMEOUT (seconds).",
        )

    def _take(self, key: str, holder: str) -> bool:
        """Whether the lock is now ``holder``'s (taken, or held already); False if another's."""
        with self._guard:
            held = self._held.get(key)
        if held is not None and held[0] == holder:
            return True
        fd = self._try_acquire(key)
        if fd is None:
            return False
        self._describe_holder(fd)
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

        Raises:
            StepLockTimeoutError: If no timeout was given and ``step_lock_timeout``
                passed.
        """
        patience = _Patience(self, key, acquire_timeout)
        while not self._take(key, holder):
            if patience.spent():
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
        patience = _Patience(self, key, acquire_timeout)
        while not self._take(key, holder):
            if patience.spent():
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
        """Wait until nobody holds the lock on ``key``; False after ``timeout`` s.

        Raises:
            StepLockTimeoutError: If no timeout was given and ``step_lock_timeout``
                passed.
        """
        patience = _Patience(self, key, timeout)
        while self.is_locked(key):
            if patience.spent():
                return False
            time.sleep(_POLL)
        return True

    async def await_for_lock(self, key: str, timeout: float | None = None) -> bool:
        """`wait_for_lock`, waiting without blocking the event loop."""
        patience = _Patience(self, key, timeout)
        while self.is_locked(key):
            if patience.spent():
                return False
            await asyncio.sleep(_POLL)
        return True


class _Patience:
    """How long one caller waits: its own timeout, else the setting, then loudly."""

    def __init__(self, locks: FileLockManager, key: str, timeout: float | None) -> None:
        self._locks, self._key, self._timeout = locks, key, timeout
        self._start = time.monotonic()
        self._limit = timeout

    def spent(self) -> bool:
        """Whether the caller's timeout passed (then it gets False).

        Raises:
            StepLockTimeoutError: If the caller gave no timeout and the setting passed.
        """
        if self._limit is None:  # read once a wait begins: an uncontended lock never does
            self._limit = load_settings().step_lock_timeout
        waited = time.monotonic() - self._start
        if waited < self._limit:
            return False
        if self._timeout is None:
            raise self._locks._gave_up(self._key, waited)
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
