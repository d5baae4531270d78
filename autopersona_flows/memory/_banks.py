"""One bank's log file: its line format, its lock, and a process's parsed view of it.

The file format is described in `autopersona_flows.memory.jsonl`; `JsonlMemoryStore`
is the public face of this module.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, BinaryIO, Final, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationError,
)

from autopersona_flows import _json
from autopersona_flows.errors import (
    MemoryNotFoundError,
    MemoryStoreCorruptionError,
)
from autopersona_flows.memory._files import (
    StoreRoot,
    atomic_write,
    fsync_dir,
    keep_as_corrupt,
    lock_file,
    locks_path,
    make_dirs,
    stat_key,
    unlock_file,
    write_all,
)
from autopersona_flows.memory._histories import History, diagnose
from autopersona_flows.memory.protocol import ChangeSet
from autopersona_flows.memory.records import (
    MemoryLayer,
    MemoryRecord,
    UtcDatetime,
)
from autopersona_flows.memory.snapshots import MemoryChange

__all__ = [
    "BANK_FORMAT",
    "FORMAT_VERSION",
    "STORE_FORMAT",
    "Bank",
    "Delete",
    "Header",
    "LogEntry",
    "ensure_store",
    "now",
    "record_line",
    "scan_entries",
]

_log = logging.getLogger(__name__)

_CHANGE_LOG = 4096  # recent changes kept per bank view for incremental `changes` calls
BANK_FORMAT: Final = "autopersona-memory-bank"  # Final: the checker sees the Literal
STORE_FORMAT: Final = "autopersona-jsonl-store"
FORMAT_VERSION: Final = 1


class _Line(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class Header(_Line):
    format: Literal["autopersona-memory-bank"]
    version: Literal[1]
    user_id: str
    layer: MemoryLayer
    generation: str


class Delete(_Line):
    op: Literal["delete"]
    id: str
    at: UtcDatetime


class _Batch(_Line):
    op: Literal["batch"]
    count: Annotated[int, Field(ge=2)]


def _entry_kind(value: Any) -> str:
    if isinstance(value, dict) and "op" in value:
        return str(value["op"])
    return "record"


_ENTRY: TypeAdapter[MemoryRecord | Delete | _Batch] = TypeAdapter(
    Annotated[
        Annotated[MemoryRecord, Tag("record")]
        | Annotated[Delete, Tag("delete")]
        | Annotated[_Batch, Tag("batch")],
        Discriminator(_entry_kind),
    ]
)


@dataclass(frozen=True)
class LogEntry:
    """A complete entry of a bank file, and where its line lies in the file.

    Attributes:
        offset: The byte offset of the entry's line.
        length: The line's length in bytes, its newline included.
        record: The record it adds or replaces; ``None`` for a delete.
        deleted: The id it deletes; ``None`` for a record.
    """

    offset: int
    length: int
    record: MemoryRecord | None
    deleted: str | None = None


def scan_entries(
    data: bytes, start: int, path: Path, layer: MemoryLayer
) -> tuple[list[LogEntry], int]:
    """Parse the complete entries of ``data``, the bytes of a bank file from offset ``start``.

    A batch counts only whole; an incomplete last line or batch (a torn write) is
    left out. Unlike a view's reading (`Bank.sync`), this does not know the records
    before ``start``: a delete is returned as it is, for the caller to apply.

    Returns:
        The entries, and the offset just after the last complete one.

    Raises:
        MemoryStoreCorruptionError: If a complete line is not an entry of this bank;
            the message names its byte offset.
    """
    entries: list[LogEntry] = []
    batch: list[LogEntry] = []
    batch_size = 0
    pos = committed = 0
    while (end := data.find(b"\n", pos)) >= 0:
        raw = data[pos:end]
        where = f"the line at byte {start + pos}"
        try:
            entry = _ENTRY.validate_json(raw)
        except ValidationError as exc:
            raise MemoryStoreCorruptionError(path, None, f"{where}: {diagnose(raw, exc)}") from None
        if isinstance(entry, MemoryRecord) and entry.layer != layer:
            raise MemoryStoreCorruptionError(path, None, f"{where}: a {entry.layer} record")
        located = start + pos, end + 1 - pos
        if batch_size:
            if not isinstance(entry, MemoryRecord):
                raise MemoryStoreCorruptionError(path, None, f"{where}: a batch ended early")
            batch.append(LogEntry(*located, entry))
            if len(batch) == batch_size:
                entries += batch
                batch, batch_size = [], 0
        elif isinstance(entry, _Batch):
            batch_size = entry.count
        elif isinstance(entry, Delete):
            entries.append(LogEntry(*located, None, entry.id))
        else:
            entries.append(LogEntry(*located, entry))
        pos = end + 1
        if not batch_size:
            committed = pos
    return entries, start + committed


def now() -> datetime:
    return datetime.now(UTC)


def record_line(record: MemoryRecord) -> bytes:
    return record.model_dump_json().encode() + b"\n"


class Bank:
    """One (user, layer) log: its lock, and this process's parsed view of it.

    Every file is opened through ``root``: a link leading out of the store raises
    `UnsafeLinkError`.
    """

    def __init__(self, folder: Path, user_id: str, layer: MemoryLayer, *, root: StoreRoot) -> None:
        self.folder = folder
        self.user_id = user_id
        self.layer: MemoryLayer = layer
        self.root = root
        self.path = folder / f"{layer}.jsonl"
        self.history = History(folder / f"{layer}.history.jsonl", layer, root=root)
        self.lock_path = folder / f"{layer}.lock"
        self._thread_lock = threading.RLock()
        self._lock_fd: int | None = None
        self._depth = 0
        self._exclusive = False
        self._reset()

    def forget(self, *, keep_generation: bool) -> None:
        """Drop the parsed view (e.g. of a corrupt file that is about to be replaced)."""
        self._reset("unreadable" if keep_generation else None)

    def set_aside(self) -> Path:
        """Keep a corrupt bank file under a ``.corrupt`` name before it is replaced."""
        kept = keep_as_corrupt(self.path)
        _log.warning("%s was corrupt; kept it as %s", self.path, kept)
        return kept

    def _reset(self, generation: str | None = None) -> None:
        self.records: dict[str, MemoryRecord] = {}
        # Change feed: every put or removal gets the next sequence number; a reset
        # starts a new epoch, which tells `changes` callers to start over.
        self.epoch = secrets.token_hex(4)
        self.seq = 0
        self.changed: deque[tuple[int, str]] = deque(maxlen=_CHANGE_LOG)
        self.generation = generation
        self.offset = 0  # end of the last complete entry
        self.lines = 0  # complete lines up to offset, header included
        self.entries = 0  # entry lines up to offset, header excluded
        self.size = 0  # file size when last read; > offset means a torn tail
        self.stat_key: tuple[int, ...] | None = None
        # The update or delete the last entry made, until this process knows that its
        # history entry is written: a writer killed between the two writes leaves it out.
        self.unrecorded: MemoryChange | None = None

    # -- locking ---------------------------------------------------------------------------

    @contextmanager
    def hold(self, *, exclusive: bool) -> Iterator[None]:
        """Hold this bank's lock; re-entrant within a thread."""
        with self._thread_lock:
            if self._depth == 0:
                self._lock_fd = self._take(exclusive)
                self._exclusive = exclusive
            elif exclusive and not self._exclusive:
                raise RuntimeError("a shared bank lock cannot be upgraded to an exclusive one")
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
                if self._depth == 0 and self._lock_fd is not None:
                    unlock_file(self._lock_fd)
                    self._lock_fd = None

    def _take(self, exclusive: bool) -> int | None:
        while True:
            if exclusive and not self.folder.is_dir():
                make_dirs(self.root.inside(self.folder))  # durably: fsynced parents
            path = self.root.inside(self.lock_path)
            try:
                fd = lock_file(path, exclusive=exclusive)
            except FileNotFoundError:  # the folder was erased between the two steps
                continue
            if fd is None or locks_path(fd, path):
                return fd
            # The user was erased while this waited: that lock guards nothing now.
            unlock_file(fd)

    def appeared(self) -> bool:
        """Whether this bank, held shared before its lock file existed, has one now.

        A shared hold of a bank nobody has written takes no lock (there is no file
        to lock): a writer may create and fill the bank meanwhile.
        """
        return self._lock_fd is None and self.root.inside(self.lock_path).exists()

    def erased(self) -> None:
        """Drop this process's view of the bank and its history: the files are gone."""
        self._reset()
        self.history.forget()

    @contextmanager
    def reading(self) -> Iterator[None]:
        """Hold this bank for a read, with the parsed view up to date.

        A warm view of an unchanged file is read without taking the file lock: one
        ``stat`` instead of the lock, an ``open`` and the header. Retrieval reads
        every layer on every decision from task threads, and each system call there
        hands the GIL to the flow's thread and waits to get it back.
        """
        with self._thread_lock:
            if self._depth == 0 and self._unchanged():
                yield
                return
        with self.hold(exclusive=False):
            self.sync()
            yield

    def _unchanged(self) -> bool:
        """Whether the file is exactly what the view was built from.

        A writer changes the size or the modification time before it lets go of
        the lock, and a rewrite is a new file (a new inode while the old one still
        exists). What this cannot tell apart, a file rewritten twice since the
        view was built whose second version reuses the first inode, with the same
        size and timestamps, only delays a read until the next write; writers
        always take the lock and read the header (`sync`).
        """
        if self.stat_key is None or self.size != self.offset:  # never read, or a torn tail
            return False
        try:
            stat = self.path.stat()
        except OSError:
            return False
        return stat_key(stat) == self.stat_key

    # -- reading ---------------------------------------------------------------------------

    def open_log(self) -> tuple[BinaryIO, Header, int] | None:
        """Open the bank file to read it from byte offsets (call with the lock held).

        The caller owns the file; it keeps reading the same bytes even after a
        compaction or restore renames a new file over the bank.

        Returns:
            The file, its header and the header line's length; ``None`` if there is
            no bank file.

        Raises:
            MemoryStoreCorruptionError: If the header is malformed or names another bank.
        """
        try:
            file = self.root.reader(self.path)
        except FileNotFoundError:
            return None
        try:
            line = file.readline()
            return file, self._parse_header(line), len(line)
        except BaseException:
            file.close()
            raise

    def sync(self) -> None:
        """Bring the parsed view up to date with the file (call with the lock held)."""
        try:
            file = self.root.reader(self.path)
        except FileNotFoundError:
            self._reset()
            return
        with file:
            stat = os.fstat(file.fileno())
            key = stat_key(stat)
            header_line = file.readline()
            # The key alone is not proof of "unchanged": with coarse timestamps a torn
            # tail can be cut and refilled to the same size within one tick, and a
            # replaced file can reuse the old inode. So a known torn tail is always
            # re-read, and the header's generation always checked.
            header = self._parse_header(header_line)
            if (key, self.size, header.generation) == (self.stat_key, self.offset, self.generation):
                return
            same_file = (
                self.stat_key is not None
                and header.generation == self.generation
                and key[:2] == self.stat_key[:2]
                and stat.st_size >= self.offset
            )
            if not same_file:
                self._reset(header.generation)
                self.offset, self.lines = len(header_line), 1
            file.seek(self.offset)
            data = file.read()
        try:
            self._apply(data)
        except MemoryStoreCorruptionError:
            self._reset()  # a half-applied view must not survive; the next call starts over
            raise
        self.stat_key = key

    def _parse_header(self, line: bytes) -> Header:
        if not line.endswith(b"\n"):
            raise MemoryStoreCorruptionError(self.path, 1, "the header line is missing or cut")
        try:
            header = Header.model_validate_json(line)
        except ValidationError as exc:
            raise MemoryStoreCorruptionError(self.path, 1, diagnose(line, exc)) from None
        if header.user_id != self.user_id or header.layer != self.layer:
            raise MemoryStoreCorruptionError(
                self.path,
                1,
                f"the header names user {header.user_id!r}, layer {header.layer!r}; "
                f"this file belongs to user {self.user_id!r}, layer {self.layer!r}",
            )
        return header

    def _apply(self, data: bytes) -> None:
        """Parse appended ``data`` and commit its complete entries to the view."""
        pos = committed = 0
        line_no = self.lines
        batch: list[MemoryRecord] = []
        batch_size = 0
        while (end := data.find(b"\n", pos)) >= 0:
            raw = data[pos:end]
            line_no += 1
            try:
                entry = _ENTRY.validate_json(raw)
            except ValidationError as exc:
                raise MemoryStoreCorruptionError(self.path, line_no, diagnose(raw, exc)) from None
            if isinstance(entry, MemoryRecord) and entry.layer != self.layer:
                raise MemoryStoreCorruptionError(
                    self.path, line_no, f"a {entry.layer} record in the {self.layer} bank"
                )
            if batch_size:
                if not isinstance(entry, MemoryRecord):
                    raise MemoryStoreCorruptionError(
                        self.path, line_no, f"a batch of {batch_size} records ended early"
                    )
                batch.append(entry)
                if len(batch) == batch_size:
                    self._commit(batch, batch_size + 1)
                    self.unrecorded = None
                    batch, batch_size = [], 0
            elif isinstance(entry, _Batch):
                batch_size = entry.count
            elif isinstance(entry, Delete):
                if entry.id not in self.records:
                    raise MemoryStoreCorruptionError(
                        self.path, line_no, f"deletes {entry.id!r}, which is not in the bank"
                    )
                self.unrecorded = _change("delete", entry.at, self.records[entry.id])
                self.remove(entry.id)
                self.entries += 1
            else:
                before = self.records.get(entry.id)
                self.unrecorded = (
                    None if before is None else _change("update", entry.updated_at, before, entry)
                )
                self._commit([entry], 1)
            pos = end + 1
            if not batch_size:
                committed, self.lines = pos, line_no
        self.offset += committed
        self.size = self.offset + len(data) - committed

    def _commit(self, records: list[MemoryRecord], lines: int) -> None:
        for record in records:
            self.put(record)
        self.entries += lines

    def put(self, record: MemoryRecord) -> None:
        self.records[record.id] = record
        self.seq += 1
        self.changed.append((self.seq, record.id))

    def remove(self, memory_id: str) -> None:
        del self.records[memory_id]
        self.seq += 1
        self.changed.append((self.seq, memory_id))

    def changes_since(self, cursor: str | None) -> ChangeSet:
        now = f"{self.epoch}:{self.seq}"
        epoch, _, seq_text = (cursor or "").partition(":")
        known = seq_text.isascii() and seq_text.isdigit()
        since = int(seq_text) if epoch == self.epoch and known else -1
        oldest = self.changed[0][0] if self.changed else self.seq + 1
        if since < 0 or since > self.seq or since < oldest - 1:
            return ChangeSet(cursor=now, full=True, records=[*self.records.values()])
        if since == self.seq:
            return ChangeSet(cursor=now, full=False, records=[])
        # In change order, so that every view indexes records in the same order.
        ids = dict.fromkeys(memory_id for seq, memory_id in self.changed if seq > since)
        return ChangeSet(
            cursor=now,
            full=False,
            records=[self.records[i] for i in ids if i in self.records],
            deleted=[i for i in ids if i not in self.records],
        )

    def history_changes(self) -> list[MemoryChange]:
        """The history, with the bank's last change even if its entry is not written yet.

        Call with the lock held and the view synced.
        """
        return self.history.read(landed=self.unrecorded)

    def require(self, memory_id: str) -> MemoryRecord:
        try:
            return self.records[memory_id]
        except KeyError:
            raise MemoryNotFoundError(self.user_id, self.layer, memory_id) from None

    # -- writing (exclusive lock held, view synced) ----------------------------------------

    def settle(self) -> None:
        """Write the history entry of the bank's last change, if its writer did not.

        Call before writing, with the history checked. The bank's log holds the
        superseded version until a compaction, and every compaction comes after
        this: no change is ever left out of the history.
        """
        if self.unrecorded is not None:
            self.history.recover(self.unrecorded)
            self.unrecorded = None

    def record(self, change: MemoryChange) -> None:
        """Append the history entry of a change just written to the bank."""
        self.unrecorded = change
        try:
            self.history.append(change)
        except OSError as exc:
            # The change has landed; failing it now would make a caller retry (and
            # repeat) it. The next write records it, reason and all (`settle`).
            _log.warning("writing to %s failed (%s); will retry", self.history.path, exc)
            return
        self.unrecorded = None

    def append(self, data: bytes, lines: int, *, create_store: Path) -> None:
        """Append complete entry lines durably, repairing a torn tail first."""
        if self.generation is None:
            self._create(create_store)
        fd = self.root.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            if self.size > self.offset:
                # An earlier writer died mid-append; its entry was never acknowledged.
                os.ftruncate(fd, self.offset)
            write_all(fd, data)
            os.fsync(fd)
            stat = os.fstat(fd)
        finally:
            os.close(fd)
        self.offset += len(data)
        self.size = self.offset
        self.lines += lines
        self.entries += lines
        self.stat_key = stat_key(stat)

    def rewrite(
        self, records: Iterable[MemoryRecord], *, create_store: Path, compacting: bool = False
    ) -> None:
        """Replace the bank with exactly ``records`` under a new generation.

        A compaction keeps the same records, so this process's change feed goes on
        uninterrupted; any other rewrite starts a new epoch.
        """
        self.root.inside(self.path)  # the folder, too, must not lead elsewhere
        if self.generation is None:
            ensure_store(create_store)
        # Only the holder of the exclusive lock writes this bank's temporary files, so
        # any left over are from a writer killed mid-rewrite.
        for stale in self.folder.glob(f".{self.path.name}.*.tmp"):
            stale.unlink(missing_ok=True)
        records = list(records)
        header = Header(
            format=BANK_FORMAT,
            version=FORMAT_VERSION,
            user_id=self.user_id,
            layer=self.layer,
            generation=secrets.token_hex(8),
        )
        head = header.model_dump_json().encode() + b"\n"
        atomic_write(self.path, head + b"".join(record_line(record) for record in records))
        stat = self.path.stat()
        self.unrecorded = None  # recorded before any rewrite (`settle`)
        if compacting:
            self.generation = header.generation
        else:
            self._reset(header.generation)
            for record in records:
                self.put(record)
        self.offset = self.size = stat.st_size
        self.lines, self.entries = 1 + len(records), len(records)
        self.stat_key = stat_key(stat)

    def _create(self, store_root: Path) -> None:
        self.rewrite([], create_store=store_root)
        # Make the new user folder itself durable, not only the file inside it.
        fsync_dir(self.folder.parent)
        fsync_dir(store_root)

    @property
    def dead(self) -> int:
        """Log entries that no longer count: superseded versions, tombstones, batch markers."""
        return self.entries - len(self.records)

    def compact(self, *, create_store: Path) -> int:
        """Rewrite the bank to its live records if it has dead entries; return how many."""
        dead = self.dead
        if dead:
            self.rewrite(self.records.values(), create_store=create_store, compacting=True)
        return dead

    def maybe_compact(self, min_dead: int, *, create_store: Path) -> None:
        # Not while a change awaits its history entry: its superseded version would go.
        if self.unrecorded is None and self.dead > max(min_dead, len(self.records)):
            try:
                self.compact(create_store=create_store)
            except OSError as exc:
                # The write that triggered this has landed; failing it now would make a
                # caller retry (and duplicate) it. Compaction is retried on a later write.
                _log.warning("compacting %s failed (%s); will retry later", self.path, exc)


def _change(
    operation: Literal["update", "delete"],
    at: datetime,
    before: MemoryRecord,
    after: MemoryRecord | None = None,
) -> MemoryChange:
    # Built for every update and delete line a view reads: no need to validate again.
    return MemoryChange.model_construct(operation=operation, at=at, before=before, after=after)


def ensure_store(root: Path) -> None:
    marker = root / "store.json"
    if not marker.exists():
        atomic_write(
            marker, _json.dumps({"format": STORE_FORMAT, "version": FORMAT_VERSION}) + b"\n"
        )
