"""The embedded default store: one append-only JSONL log per (user, layer).

Layout under the root folder::

    store.json                       format marker
    users/<slug>-<digest>/
        persona.jsonl                the bank: a header line, then entries
        persona.history.jsonl        superseded and deleted versions
        persona.lock                 advisory lock guarding both

A bank's first line is a header naming its user, layer and *generation*. Each
following line is an entry: a record (adds it, or replaces the record with that
id), ``{"op": "delete", ...}``, or ``{"op": "batch", "count": N}`` followed by N
records that count only together. Every write is one append, flushed and fsynced
before the call returns, so an add costs the same at 10 records as at 100,000.
When dead entries outnumber live records the log is compacted: rewritten to a
temporary file, fsynced and renamed over the bank, with a new generation.

A crash in the middle of an append leaves an incomplete last entry. Readers
ignore it; the next writer truncates it away. Any other malformed line raises
`MemoryStoreCorruptionError` naming the file and line, and leaves the bank
untouched and unwritable until a person repairs it.

Each process keeps what it parsed of a bank in memory, keyed by the file's
identity and size, and reads only what was appended since; a compaction by any
process changes the generation and the cached view is rebuilt.

Locks are POSIX advisory locks (``flock``), one per bank, shared for reads and
exclusive for writes, plus a thread lock per bank within the process.
"""

from __future__ import annotations

import builtins
import logging
import os
import secrets
import threading
from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

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
    DuplicateMemoryError,
    MemoryNotFoundError,
    MemoryStoreCorruptionError,
    MemoryStoreError,
    SnapshotError,
)
from autopersona_flows.memory._files import (
    atomic_write,
    fsync_dir,
    lock_file,
    unlock_file,
    write_all,
)
from autopersona_flows.memory.protocol import ChangeSet
from autopersona_flows.memory.records import (
    LAYERS,
    Embedding,
    LayerContent,
    MemoryLayer,
    MemoryRecord,
    PersonaMemory,
    TrajectoryMemory,
    UtcDatetime,
    WorkspaceMemory,
    as_content,
    content_type,
)
from autopersona_flows.memory.snapshots import MemoryChange, MemorySnapshot
from autopersona_flows.memory.users import check_user_id, user_key

__all__ = ["JsonlMemoryStore"]

_log = logging.getLogger(__name__)

_STORE_FORMAT = "autopersona-jsonl-store"
_CHANGE_LOG = 4096  # recent changes kept per bank view for incremental `changes` calls
_BANK_FORMAT = "autopersona-memory-bank"
_VERSION = 1


class _Line(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class _Header(_Line):
    format: Literal["autopersona-memory-bank"]
    version: Literal[1]
    user_id: str
    layer: MemoryLayer
    generation: str


class _Delete(_Line):
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


_ENTRY: TypeAdapter[MemoryRecord | _Delete | _Batch] = TypeAdapter(
    Annotated[
        Annotated[MemoryRecord, Tag("record")]
        | Annotated[_Delete, Tag("delete")]
        | Annotated[_Batch, Tag("batch")],
        Discriminator(_entry_kind),
    ]
)


def _diagnose(raw: bytes, error: ValidationError) -> str:
    """Say in plain words why a line failed to parse."""
    try:
        value = _json.loads(raw)
    except _json.JSONDecodeError as exc:
        return f"not valid JSON ({exc})"
    if not isinstance(value, dict):
        return f"a line must be a JSON object, found {type(value).__name__}"
    return f"invalid entry: {error}"


def _now() -> datetime:
    return datetime.now(UTC)


def _record_line(record: MemoryRecord) -> bytes:
    return record.model_dump_json().encode() + b"\n"


class _Bank:
    """One (user, layer) log: its lock, and this process's parsed view of it."""

    def __init__(self, folder: Path, user_id: str, layer: MemoryLayer) -> None:
        self.folder = folder
        self.user_id = user_id
        self.layer: MemoryLayer = layer
        self.path = folder / f"{layer}.jsonl"
        self.history_path = folder / f"{layer}.history.jsonl"
        self.lock_path = folder / f"{layer}.lock"
        self._thread_lock = threading.RLock()
        self._lock_fd: int | None = None
        self._depth = 0
        self._exclusive = False
        self._reset()

    def forget(self, *, keep_generation: bool) -> None:
        """Drop the parsed view (e.g. of a corrupt file that is about to be replaced)."""
        self._reset("unreadable" if keep_generation else None)

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

    # -- locking ---------------------------------------------------------------------------

    @contextmanager
    def hold(self, *, exclusive: bool) -> Iterator[None]:
        """Hold this bank's lock; re-entrant within a thread."""
        with self._thread_lock:
            if self._depth == 0:
                if exclusive and not self.folder.is_dir():
                    self.folder.mkdir(parents=True, exist_ok=True)
                self._lock_fd = lock_file(self.lock_path, exclusive=exclusive)
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

    # -- reading ---------------------------------------------------------------------------

    def sync(self) -> None:
        """Bring the parsed view up to date with the file (call with the lock held)."""
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            self._reset()
            return
        key = (stat.st_ino, stat.st_dev, stat.st_size, stat.st_mtime_ns)
        with self.path.open("rb") as file:
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

    def _parse_header(self, line: bytes) -> _Header:
        if not line.endswith(b"\n"):
            raise MemoryStoreCorruptionError(self.path, 1, "the header line is missing or cut")
        try:
            header = _Header.model_validate_json(line)
        except ValidationError as exc:
            raise MemoryStoreCorruptionError(self.path, 1, _diagnose(line, exc)) from None
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
                raise MemoryStoreCorruptionError(self.path, line_no, _diagnose(raw, exc)) from None
            if batch_size:
                if not isinstance(entry, MemoryRecord):
                    raise MemoryStoreCorruptionError(
                        self.path, line_no, f"a batch of {batch_size} records ended early"
                    )
                batch.append(entry)
                if len(batch) == batch_size:
                    self._commit(batch, batch_size + 1)
                    batch, batch_size = [], 0
            elif isinstance(entry, _Batch):
                batch_size = entry.count
            elif isinstance(entry, _Delete):
                if entry.id not in self.records:
                    raise MemoryStoreCorruptionError(
                        self.path, line_no, f"deletes {entry.id!r}, which is not in the bank"
                    )
                self.remove(entry.id)
                self.entries += 1
            else:
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
        since = int(seq_text) if epoch == self.epoch and seq_text.isdigit() else -1
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

    def require(self, memory_id: str) -> MemoryRecord:
        try:
            return self.records[memory_id]
        except KeyError:
            raise MemoryNotFoundError(self.user_id, self.layer, memory_id) from None

    def read_history(self) -> builtins.list[MemoryChange]:
        try:
            data = self.history_path.read_bytes()
        except FileNotFoundError:
            return []
        changes = []
        for line_no, raw in enumerate(data.split(b"\n")[:-1], start=1):
            try:
                changes.append(MemoryChange.model_validate_json(raw))
            except ValidationError as exc:
                raise MemoryStoreCorruptionError(
                    self.history_path, line_no, _diagnose(raw, exc)
                ) from None
        return changes

    # -- writing (exclusive lock held, view synced) ----------------------------------------

    def append(self, data: bytes, lines: int, *, create_store: Path) -> None:
        """Append complete entry lines durably, repairing a torn tail first."""
        if self.generation is None:
            self._create(create_store)
        elif self.size > self.offset:
            # An earlier writer died mid-append; its entry was never acknowledged.
            os.truncate(self.path, self.offset)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            write_all(fd, data)
            os.fsync(fd)
            stat = os.fstat(fd)
        finally:
            os.close(fd)
        self.offset += len(data)
        self.size = self.offset
        self.lines += lines
        self.entries += lines
        self.stat_key = (stat.st_ino, stat.st_dev, stat.st_size, stat.st_mtime_ns)

    def append_history(self, change: MemoryChange) -> None:
        """Append one change to the history file, cutting a torn last line first."""
        fd = os.open(self.history_path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                os.ftruncate(fd, _after_last_newline(fd, size))
            write_all(fd, change.model_dump_json().encode() + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)

    def rewrite(
        self, records: Iterable[MemoryRecord], *, create_store: Path, compacting: bool = False
    ) -> None:
        """Replace the bank with exactly ``records`` under a new generation.

        A compaction keeps the same records, so this process's change feed goes on
        uninterrupted; any other rewrite starts a new epoch.
        """
        if self.generation is None:
            _ensure_store(create_store)
        # Only the holder of the exclusive lock writes this bank's temporary files, so
        # any left over are from a writer killed mid-rewrite.
        for stale in self.folder.glob(f".{self.path.name}.*.tmp"):
            stale.unlink(missing_ok=True)
        records = list(records)
        header = _Header(
            format=_BANK_FORMAT,
            version=_VERSION,
            user_id=self.user_id,
            layer=self.layer,
            generation=secrets.token_hex(8),
        )
        head = header.model_dump_json().encode() + b"\n"
        atomic_write(self.path, head + b"".join(_record_line(record) for record in records))
        stat = self.path.stat()
        if compacting:
            self.generation = header.generation
        else:
            self._reset(header.generation)
            for record in records:
                self.put(record)
        self.offset = self.size = stat.st_size
        self.lines, self.entries = 1 + len(records), len(records)
        self.stat_key = (stat.st_ino, stat.st_dev, stat.st_size, stat.st_mtime_ns)

    def _create(self, store_root: Path) -> None:
        self.rewrite([], create_store=store_root)
        # Make the new user folder itself durable, not only the file inside it.
        fsync_dir(self.folder.parent)
        fsync_dir(store_root)

    def maybe_compact(self, min_dead: int, *, create_store: Path) -> None:
        dead = self.entries - len(self.records)
        if dead > max(min_dead, len(self.records)):
            try:
                self.rewrite(self.records.values(), create_store=create_store, compacting=True)
            except OSError as exc:
                # The write that triggered this has landed; failing it now would make a
                # caller retry (and duplicate) it. Compaction is retried on a later write.
                _log.warning("compacting %s failed (%s); will retry later", self.path, exc)


def _after_last_newline(fd: int, size: int, chunk: int = 1 << 20) -> int:
    """The offset just past the last newline before ``size`` (0 if there is none)."""
    end = size
    while end > 0:
        start = max(0, end - chunk)
        found = os.pread(fd, end - start, start).rfind(b"\n")
        if found >= 0:
            return start + found + 1
        end = start
    return 0


def _ensure_store(root: Path) -> None:
    marker = root / "store.json"
    if not marker.exists():
        atomic_write(marker, _json.dumps({"format": _STORE_FORMAT, "version": _VERSION}) + b"\n")


class JsonlMemoryStore:
    """Memory banks as JSONL files under a folder: the embedded default store.

    Durable (every write is fsynced before it returns), safe across threads and
    processes, and readable with ``cat``. See the module documentation for the
    file format. Requires a POSIX system (``flock``).

    Args:
        root: The store's folder; created on the first write.

    Raises:
        MemoryStoreError: If ``root`` holds a store of an unknown format or version.
    """

    compact_min_dead: ClassVar[int] = 1024
    """A bank is compacted once it has more dead entries than this and than live records."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self._banks: dict[tuple[str, MemoryLayer], _Bank] = {}
        self._banks_lock = threading.Lock()
        self._check_marker()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.root)!r})"

    def _check_marker(self) -> None:
        marker = self.root / "store.json"
        try:
            data = _json.loads(marker.read_bytes())
        except FileNotFoundError:
            return
        except (OSError, _json.JSONDecodeError) as exc:
            raise MemoryStoreCorruptionError(
                marker, None, f"unreadable store marker ({exc})"
            ) from None
        if data != {"format": _STORE_FORMAT, "version": _VERSION}:
            raise MemoryStoreError(
                f"{self.root} holds a store of format {data!r}; this version of "
                f"autopersona-flows reads {_STORE_FORMAT!r} version {_VERSION}"
            )

    def _bank(self, user_id: str, layer: MemoryLayer) -> _Bank:
        content_type(layer)  # validates the layer
        key = (check_user_id(user_id), layer)
        with self._banks_lock:
            bank = self._banks.get(key)
            if bank is None:
                folder = self.root / "users" / user_key(user_id)
                bank = self._banks[key] = _Bank(folder, user_id, layer)
            return bank

    @contextmanager
    def _read(self, user_id: str, layer: MemoryLayer) -> Iterator[_Bank]:
        bank = self._bank(user_id, layer)
        with bank.hold(exclusive=False):
            bank.sync()
            yield bank

    @contextmanager
    def _write(self, user_id: str, layer: MemoryLayer) -> Iterator[_Bank]:
        bank = self._bank(user_id, layer)
        with bank.hold(exclusive=True):
            bank.sync()
            yield bank
            bank.maybe_compact(self.compact_min_dead, create_store=self.root)

    @contextmanager
    def locked(self, user_id: str, layer: MemoryLayer) -> Iterator[None]:
        """Hold a bank's exclusive lock across several calls (read, decide, write).

        Calls on the same bank from this thread inside the block reuse the lock;
        other threads and processes wait until the block ends.
        """
        with self._write(user_id, layer):
            yield

    # -- MemoryStore -----------------------------------------------------------------------

    def add(self, user_id: str, item: MemoryRecord | LayerContent) -> MemoryRecord:
        """Store one record durably; see `MemoryStore.add`."""
        record = _as_record(item)
        with self._write(user_id, record.layer) as bank:
            if record.id in bank.records:
                raise DuplicateMemoryError(
                    f"user {user_id!r} already has a {record.layer} memory with id {record.id!r}"
                )
            bank.append(_record_line(record), 1, create_store=self.root)
            bank.put(record)
        return record

    def add_many(
        self, user_id: str, layer: MemoryLayer, items: Iterable[MemoryRecord | LayerContent]
    ) -> builtins.list[MemoryRecord]:
        """Store records of one layer atomically; see `MemoryStore.add_many`."""
        content_type(layer)
        records = [_as_record(item, layer=layer, index=i) for i, item in enumerate(items)]
        if not records:
            return []
        with self._write(user_id, layer) as bank:
            seen: set[str] = set()
            for record in records:
                if record.id in bank.records or record.id in seen:
                    raise DuplicateMemoryError(
                        f"{layer} memory id {record.id!r} is already stored for user {user_id!r}"
                        if record.id in bank.records
                        else f"memory id {record.id!r} appears twice in the batch"
                    )
                seen.add(record.id)
            lines = b"".join(_record_line(record) for record in records)
            if len(records) > 1:
                lines = _json.dumps({"op": "batch", "count": len(records)}) + b"\n" + lines
            bank.append(lines, len(records) + (len(records) > 1), create_store=self.root)
            for record in records:
                bank.put(record)
        return records

    def get(self, user_id: str, layer: MemoryLayer, memory_id: str) -> MemoryRecord:
        """Return one record; see `MemoryStore.get`."""
        with self._read(user_id, layer) as bank:
            return bank.require(memory_id)

    def list(self, user_id: str, layer: MemoryLayer) -> builtins.list[MemoryRecord]:
        """Return a layer's records, oldest first; see `MemoryStore.list`."""
        with self._read(user_id, layer) as bank:
            return builtins.list(bank.records.values())

    def update(
        self,
        user_id: str,
        layer: MemoryLayer,
        memory_id: str,
        content: LayerContent,
        *,
        embedding: Embedding | None = None,
    ) -> MemoryRecord:
        """Replace a record's content; see `MemoryStore.update`."""
        content = as_content(content, layer)
        with self._write(user_id, layer) as bank:
            before = bank.require(memory_id)
            now = max(_now(), before.created_at)
            after = MemoryRecord(
                id=before.id,
                layer=layer,
                content=content,
                created_at=before.created_at,
                updated_at=now,
                embedding=embedding,
            )
            # History first: a crash between the two writes may leave a history entry
            # for an update that never landed, but never loses the superseded version.
            bank.append_history(
                MemoryChange(operation="update", at=now, before=before, after=after)
            )
            bank.append(_record_line(after), 1, create_store=self.root)
            bank.put(after)
        return after

    def delete(self, user_id: str, layer: MemoryLayer, memory_id: str) -> MemoryRecord:
        """Remove a record, keeping it in the history; see `MemoryStore.delete`."""
        with self._write(user_id, layer) as bank:
            before = bank.require(memory_id)
            now = _now()
            bank.append_history(MemoryChange(operation="delete", at=now, before=before))
            tombstone = _Delete(op="delete", id=memory_id, at=now)
            bank.append(tombstone.model_dump_json().encode() + b"\n", 1, create_store=self.root)
            bank.remove(memory_id)
        return before

    def changes(self, user_id: str, layer: MemoryLayer, since: str | None = None) -> ChangeSet:
        """Return what changed in a bank since ``since``; see `MemoryStore.changes`."""
        with self._read(user_id, layer) as bank:
            return bank.changes_since(since)

    def history(
        self, user_id: str, layer: MemoryLayer, memory_id: str
    ) -> builtins.list[MemoryChange]:
        """Return a record's superseded and deleted versions; see `MemoryStore.history`."""
        with self._read(user_id, layer) as bank:
            return [change for change in bank.read_history() if change.before.id == memory_id]

    def users(self) -> builtins.list[str]:
        """Return every user with a bank here, sorted; see `MemoryStore.users`."""
        found = []
        try:
            folders = builtins.list((self.root / "users").iterdir())
        except FileNotFoundError:
            return []
        for folder in folders:
            for layer in LAYERS:
                path = folder / f"{layer}.jsonl"
                try:
                    with path.open("rb") as file:
                        line = file.readline()
                except FileNotFoundError:
                    continue
                try:
                    user_id = _Header.model_validate_json(line).user_id
                except ValidationError as exc:
                    raise MemoryStoreCorruptionError(path, 1, _diagnose(line, exc)) from None
                if user_key(user_id) != folder.name:
                    raise MemoryStoreCorruptionError(
                        path, 1, f"user {user_id!r} does not belong in folder {folder.name!r}"
                    )
                found.append(user_id)
                break
        return sorted(found)

    @contextmanager
    def _all_layers(
        self, user_id: str, *, exclusive: bool, overwrite: bool = False
    ) -> Iterator[dict[str, _Bank]]:
        # A fixed lock order (LAYERS) keeps two multi-bank callers from deadlocking.
        banks = {layer: self._bank(user_id, layer) for layer in LAYERS}
        with ExitStack() as stack:
            for bank in banks.values():
                stack.enter_context(bank.hold(exclusive=exclusive))
                try:
                    bank.sync()
                except MemoryStoreCorruptionError:
                    if not overwrite:
                        raise
                    # About to be replaced whole: a corrupt bank is what a restore repairs.
                    bank.forget(keep_generation=bank.path.exists())
            yield banks

    def snapshot(self, user_id: str) -> MemorySnapshot:
        """Read all layers under their locks as one view; see `MemoryStore.snapshot`."""
        with self._all_layers(user_id, exclusive=False) as banks:
            memories = {
                layer: builtins.list(bank.records.values()) for layer, bank in banks.items()
            }
        return MemorySnapshot.of(user_id, memories)

    def snapshot_fingerprint(self, user_id: str) -> str:
        """Return the snapshot's fingerprint; see `MemoryStore.snapshot_fingerprint`."""
        return self.snapshot(user_id).fingerprint

    def restore(self, snapshot: MemorySnapshot, *, replace: bool = False) -> None:
        """Load a snapshot into its user's bank; see `MemoryStore.restore`.

        Each layer is replaced atomically; with ``replace``, the records it drops
        are not added to the change history, and a corrupt bank is overwritten
        (restoring an exported snapshot is how a corrupt bank is repaired).
        """
        with self._all_layers(snapshot.user_id, exclusive=True, overwrite=replace) as banks:
            existing = sum(len(bank.records) for bank in banks.values())
            if existing and not replace:
                raise SnapshotError(
                    f"user {snapshot.user_id!r} already has {existing} memories; "
                    "restore with replace=True (CLI: --replace) to overwrite them"
                )
            for layer, bank in banks.items():
                if bank.generation is not None or snapshot.memories[layer]:
                    bank.rewrite(snapshot.memories[layer], create_store=self.root)


def _as_record(
    item: MemoryRecord | LayerContent, *, layer: MemoryLayer | None = None, index: int | None = None
) -> MemoryRecord:
    where = "" if index is None else f"item {index}: "
    if isinstance(item, MemoryRecord):
        record = item
    elif isinstance(item, TrajectoryMemory | WorkspaceMemory | PersonaMemory):
        record = MemoryRecord.of(item)
    else:
        raise TypeError(
            f"{where}expected a MemoryRecord or a layer content model "
            f"(TrajectoryMemory, WorkspaceMemory, PersonaMemory), got {type(item).__name__}"
        )
    if layer is not None and record.layer != layer:
        raise ValueError(f"{where}is a {record.layer} memory, but the batch is for {layer!r}")
    return record
