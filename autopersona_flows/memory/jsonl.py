"""The embedded default store: one append-only JSONL log per (user, layer).

Layout under the root folder::

    store.json                       format marker
    users/<slug>-<digest>/
        persona.jsonl                the bank: a header line, then entries
        persona.history.jsonl        superseded and deleted versions
        persona.lock                 advisory lock guarding both
        persona.<time>.corrupt       a corrupt bank (or history) a restore set aside

A bank's first line is a header naming its user, layer and *generation*. Each
following line is an entry: a record (adds it, or replaces the record with that
id), ``{"op": "delete", ...}``, or ``{"op": "batch", "count": N}`` followed by N
records that count only together. Every write is one append, flushed and fsynced
before the call returns, so an add costs the same at 10 records as at 100,000.
When dead entries outnumber live records the log is compacted: rewritten to a
temporary file, fsynced and renamed over the bank, with a new generation.
`JsonlMemoryStore.compact` does the same on demand (e.g. from a maintenance job).

A crash in the middle of an append leaves an incomplete last entry. Readers
ignore it; the next writer truncates it away. Any other malformed line, in the
bank or its history, raises `MemoryStoreCorruptionError` naming the file and
line, and leaves the bank untouched and unwritable until a person repairs it or
restores a snapshot over it (`JsonlMemoryStore.restore` with ``replace``).

Each process keeps what it parsed of a bank in memory, keyed by the file's
identity and size, and reads only what was appended since; a compaction by any
process changes the generation and the cached view is rebuilt.

Locks are POSIX advisory locks (``flock``), one per bank, shared for reads and
exclusive for writes, plus a thread lock per bank within the process.

The root folder may be a link; every path below it is opened only where it leads
inside the (resolved) root, so a bank, history, lock or folder linked elsewhere
raises `UnsafeLinkError` instead of being read or written.
"""

from __future__ import annotations

import builtins
import os
import threading
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import ClassVar

from pydantic import (
    ValidationError,
)

from autopersona_flows import _json
from autopersona_flows.errors import (
    DuplicateMemoryError,
    MemoriesExistError,
    MemoryStoreCorruptionError,
    MemoryStoreError,
    StoreUnavailableError,
    UnsafeLinkError,
)
from autopersona_flows.memory._banks import (
    FORMAT_VERSION,
    STORE_FORMAT,
    Bank,
    Delete,
    Header,
    now,
    record_line,
)
from autopersona_flows.memory._files import StoreRoot, erase_entry
from autopersona_flows.memory._histories import diagnose
from autopersona_flows.memory.persisted import BankLog
from autopersona_flows.memory.protocol import ChangeSet, Erasure
from autopersona_flows.memory.provenance import Provenance
from autopersona_flows.memory.records import (
    LAYERS,
    Embedding,
    LayerContent,
    MemoryLayer,
    MemoryRecord,
    as_content,
    as_record,
    content_type,
)
from autopersona_flows.memory.snapshots import MemoryChange, MemorySnapshot
from autopersona_flows.memory.users import check_user_id, is_user_key, user_key

__all__ = ["JsonlMemoryStore", "StrayEntry"]


@dataclass(frozen=True)
class StrayEntry:
    """Something in a store's ``users/`` folder that is not a user's folder.

    Attributes:
        path: The entry.
        damage: Whether it looks like damage rather than a file another program left:
            it bears a user folder's name but is not a folder.
        reason: What it is and what to do about it.
    """

    path: Path
    damage: bool
    reason: str


_READ_ATTEMPTS = 10
"""How often a read of all of a user's banks is tried while they are being created."""


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
        self._root = StoreRoot(self.root)  # opens files only inside the store
        self._banks: dict[tuple[str, MemoryLayer], Bank] = {}
        self._logs: dict[tuple[str, MemoryLayer], BankLog] = {}
        self._banks_lock = threading.Lock()
        self._check_marker()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.root)!r})"

    def _check_marker(self) -> None:
        marker = self.root / "store.json"
        try:
            with self._root.reader(marker) as file:
                data = _json.loads(file.read())
        except FileNotFoundError:
            return
        except (OSError, _json.JSONDecodeError) as exc:
            raise MemoryStoreCorruptionError(
                marker, None, f"unreadable store marker ({exc})"
            ) from None
        if data != {"format": STORE_FORMAT, "version": FORMAT_VERSION}:
            raise MemoryStoreError(
                f"{self.root} holds a store of format {data!r}; this version of "
                f"autopersona-flows reads {STORE_FORMAT!r} version {FORMAT_VERSION}"
            )

    def _bank(self, user_id: str, layer: MemoryLayer) -> Bank:
        content_type(layer)  # validates the layer
        key = (check_user_id(user_id), layer)
        with self._banks_lock:
            bank = self._banks.get(key)
            if bank is None:
                folder = self.root / "users" / user_key(user_id)
                bank = self._banks[key] = Bank(folder, user_id, layer, root=self._root)
            return bank

    def bank_log(self, user_id: str, layer: MemoryLayer) -> BankLog | None:
        """The bank read by byte offsets, with its saved indexes: what retrieval reads.

        `MemoryRetriever` reads a JSONL bank through it rather than `changes`, so
        that a fresh process loads the bank's saved index and reads only the entries
        the index does not cover (see `autopersona_flows.memory.persisted`).

        Returns:
            ``None`` for a subclass that overrides `changes` (to count, delay or fail
            reads): its retrievers read its change feed, as from any other store.
        """
        if type(self).changes is not JsonlMemoryStore.changes:
            return None
        bank = self._bank(user_id, layer)
        with self._banks_lock:
            log = self._logs.get((bank.user_id, layer))
            if log is None or log.bank is not bank:
                log = self._logs[(bank.user_id, layer)] = BankLog(bank)
            return log

    @contextmanager
    def _read(self, user_id: str, layer: MemoryLayer) -> Iterator[Bank]:
        bank = self._bank(user_id, layer)
        with bank.reading():
            yield bank

    @contextmanager
    def _write(self, user_id: str, layer: MemoryLayer) -> Iterator[Bank]:
        bank = self._bank(user_id, layer)
        with bank.hold(exclusive=True):
            bank.sync()
            bank.history.check()
            bank.settle()
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
        record = as_record(item)
        with self._write(user_id, record.layer) as bank:
            if record.id in bank.records:
                raise DuplicateMemoryError(
                    f"user {user_id!r} already has a {record.layer} memory with id {record.id!r}"
                )
            bank.append(record_line(record), 1, create_store=self.root)
            bank.put(record)
        return record

    def add_many(
        self, user_id: str, layer: MemoryLayer, items: Iterable[MemoryRecord | LayerContent]
    ) -> builtins.list[MemoryRecord]:
        """Store records of one layer atomically; see `MemoryStore.add_many`."""
        content_type(layer)
        records = [as_record(item, layer=layer, index=i) for i, item in enumerate(items)]
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
            lines = b"".join(record_line(record) for record in records)
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
        at: datetime | None = None,
        valid_until: datetime | None = None,
        reason: str = "",
        buried: bool | None = None,
        provenance: Provenance | None = None,
    ) -> MemoryRecord:
        """Replace a record's content; see `MemoryStore.update`."""
        content = as_content(content, layer)
        with self._write(user_id, layer) as bank:
            before = bank.require(memory_id)
            after = before.revised(
                content,
                embedding=embedding,
                at=at,
                valid_until=valid_until,
                buried=buried,
                provenance=provenance,
            )
            # The bank first: the history never holds a change the bank does not have. A
            # crash between the two writes leaves this one out of the history file, not
            # lost: the bank's log keeps the superseded version, and `history` lists it
            # until the next write records it (`Bank.settle`).
            bank.append(record_line(after), 1, create_store=self.root)
            bank.put(after)
            bank.record(
                MemoryChange(
                    operation="update",
                    at=after.updated_at,
                    before=before,
                    after=after,
                    reason=reason,
                    provenance=provenance,
                )
            )
        return after

    def delete(
        self,
        user_id: str,
        layer: MemoryLayer,
        memory_id: str,
        *,
        reason: str = "",
        provenance: Provenance | None = None,
    ) -> MemoryRecord:
        """Remove a record, keeping it in the history; see `MemoryStore.delete`."""
        with self._write(user_id, layer) as bank:
            before = bank.require(memory_id)
            at = now()
            tombstone = Delete(op="delete", id=memory_id, at=at)
            bank.append(tombstone.model_dump_json().encode() + b"\n", 1, create_store=self.root)
            bank.remove(memory_id)
            bank.record(
                MemoryChange(
                    operation="delete", at=at, before=before, reason=reason, provenance=provenance
                )
            )
        return before

    def changes(self, user_id: str, layer: MemoryLayer, since: str | None = None) -> ChangeSet:
        """Return what changed in a bank since ``since``; see `MemoryStore.changes`."""
        with self._read(user_id, layer) as bank:
            return bank.changes_since(since)

    def history(
        self, user_id: str, layer: MemoryLayer, memory_id: str | None = None
    ) -> builtins.list[MemoryChange]:
        """Return a record's superseded and deleted versions; see `MemoryStore.history`."""
        bank = self._bank(user_id, layer)
        # Under the lock, not from a warm view: the bank and its history read as one.
        with bank.hold(exclusive=False):
            bank.sync()
            changes = bank.history_changes()
        return [c for c in changes if memory_id is None or c.before.id == memory_id]

    def users(self) -> builtins.list[str]:
        """Return every user with a bank here, sorted; see `MemoryStore.users`.

        Only folders named as the store names a user's folder count: anything else
        in ``users/`` (a ``.DS_Store``, a note) is ignored, and `strays` lists it.
        """
        found = []
        try:
            folders = builtins.list((self.root / "users").iterdir())
        except FileNotFoundError:
            return []
        for folder in folders:
            if not is_user_key(folder.name) or not folder.is_dir():
                continue
            for layer in LAYERS:
                path = folder / f"{layer}.jsonl"
                try:
                    with self._root.reader(path) as file:
                        line = file.readline()
                except FileNotFoundError:
                    continue
                try:
                    user_id = Header.model_validate_json(line).user_id
                except ValidationError as exc:
                    raise MemoryStoreCorruptionError(path, 1, diagnose(line, exc)) from None
                if user_key(user_id) != folder.name:
                    raise MemoryStoreCorruptionError(
                        path, 1, f"user {user_id!r} does not belong in folder {folder.name!r}"
                    )
                found.append(user_id)
                break
        return sorted(found)

    def strays(self) -> builtins.list[StrayEntry]:
        """Return what lies in ``users/`` besides user folders, by path.

        Hidden entries (``.DS_Store``, ``._*`` and the like, which file managers and
        file systems leave everywhere) are left out. A user folder's name on
        something that is not a folder is `StrayEntry.damage`: that user's banks
        cannot be read or written. Anything else is ignored by every listing.
        """
        try:
            entries = sorted((self.root / "users").iterdir())
        except FileNotFoundError:
            return []
        found = []
        for entry in entries:
            if entry.name.startswith("."):
                continue
            if not is_user_key(entry.name):
                found.append(
                    StrayEntry(
                        entry, False, "not a user folder (not a name the store gives); ignored"
                    )
                )
            elif not entry.is_dir():
                found.append(
                    StrayEntry(
                        entry,
                        True,
                        "a user folder's name on something that is not a folder: that user's "
                        "banks cannot be read or written (move it away, then restore the user "
                        "from a snapshot)",
                    )
                )
        return found

    @contextmanager
    def _all_layers(
        self, user_id: str, *, exclusive: bool, overwrite: bool = False
    ) -> Iterator[dict[MemoryLayer, Bank]]:
        # A fixed lock order (LAYERS) keeps two multi-bank callers from deadlocking.
        banks = {layer: self._bank(user_id, layer) for layer in LAYERS}
        for _ in range(_READ_ATTEMPTS):
            with ExitStack() as stack:
                if self._held(banks, stack, exclusive=exclusive, overwrite=overwrite):
                    yield banks
                    return
        raise StoreUnavailableError(
            f"the banks of user {user_id!r} kept being created while they were read"
        )

    @staticmethod
    def _held(
        banks: dict[MemoryLayer, Bank], stack: ExitStack, *, exclusive: bool, overwrite: bool
    ) -> bool:
        """Hold every bank in ``stack``; whether that is one view of them.

        A shared hold of a bank with no file yet locks nothing: if a writer created
        it while the others were taken, what was read of it may be older than the
        rest (a new user's first layer behind the others), so the caller reads again.
        """
        for bank in banks.values():
            stack.enter_context(bank.hold(exclusive=exclusive))
            try:
                bank.sync()
            except MemoryStoreCorruptionError:
                if not overwrite:
                    raise
                # About to be replaced whole: a corrupt bank is what a restore repairs.
                # Its bytes are kept, as they may hold more than the snapshot.
                bank.set_aside()
                bank.forget(keep_generation=True)
            if not exclusive:
                continue
            try:
                bank.history.check()
            except MemoryStoreCorruptionError:
                if not overwrite:
                    raise
                bank.history.set_aside()  # the restored bank starts a fresh history
                continue
            bank.settle()
        return exclusive or not any(bank.appeared() for bank in banks.values())

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
        are not added to the change history. Restoring with ``replace`` is also how
        a corrupt bank or history is repaired: the corrupt file is kept beside it
        under a timestamped ``.corrupt`` name, a bank is replaced by the snapshot's
        records and a history starts afresh, so the user reads and writes again.

        Raises:
            SnapshotError: If the user has memories and ``replace`` is false.
            MemoryStoreCorruptionError: If a bank or history of the user is
                malformed and ``replace`` is false; nothing is written.
        """
        with self._all_layers(snapshot.user_id, exclusive=True, overwrite=replace) as banks:
            existing = sum(len(bank.records) for bank in banks.values())
            if existing and not replace:
                raise MemoriesExistError(snapshot.user_id, existing)
            for layer, bank in banks.items():
                if bank.generation is not None or snapshot.memories[layer]:
                    bank.rewrite(snapshot.memories[layer], create_store=self.root)

    def erase(self, user_id: str) -> Erasure:
        """Remove the user's folder and all it holds; see `MemoryStore.erase`.

        Banks, histories, lock files, kept ``.corrupt`` files, temporary files: the
        whole ``users/<key>/`` folder goes, and this object's parsed views of it
        with it (other store objects and processes drop theirs on their next call
        for the user). Under the user's three bank locks, the folder is renamed to
        a hidden name and ``users/`` fsynced, so the user is gone at once and for
        good; then the renamed folder is removed and ``users/`` fsynced again. If
        that is cut short (a crash), the next `erase` of the user finishes it.

        Links are removed, never followed: a link in the folder (or the folder
        itself, if it is one) goes, what it points to stays.

        Raises:
            UnsafeLinkError: If ``users/`` itself leads out of the store; nothing
                is removed.
        """
        key = user_key(check_user_id(user_id))
        users = self._root.inside(self.root / "users")
        banks = [self._bank(user_id, layer) for layer in LAYERS]
        if not any(os.path.lexists(users / name) for name in (key, f".{key}.erasing")):
            return Erasure(user_id, found=False)
        memories = changes = 0
        with ExitStack() as stack:
            for bank in banks:  # LAYERS order, as every multi-bank caller takes them
                try:
                    stack.enter_context(bank.hold(exclusive=True))
                except UnsafeLinkError:
                    continue  # a lock leading out of the store: no writer can take it either
                memories += _readable_records(bank)
                changes += _history_lines(bank)
            found = erase_entry(users, key)
            for bank in banks:
                bank.erased()
        return Erasure(user_id, found=found, memories=memories, changes=changes)

    # -- beyond MemoryStore ----------------------------------------------------------------

    def compact(self, user_id: str, layer: MemoryLayer | None = None) -> int:
        """Rewrite a user's banks to their live records now, instead of when they next grow.

        Each bank is compacted under its exclusive lock with the same crash-safe
        rewrite as the automatic compaction: records, ids, timestamps, the change
        history and the snapshot fingerprint stay as they were. A bank with nothing
        dead is left untouched (not rewritten), and a bank that does not exist is
        not created.

        Args:
            user_id: Whose banks to compact.
            layer: Only this layer's bank; every layer by default.

        Returns:
            How many dead log entries (superseded versions, tombstones, batch
            markers) were dropped; 0 if there were none.

        Raises:
            InvalidUserIdError: If ``user_id`` is not a valid user id.
            ValueError: If ``layer`` is not one of `LAYERS`.
            MemoryStoreCorruptionError: If a bank is malformed; it is left as it is.
        """
        banks = [self._bank(user_id, name) for name in (LAYERS if layer is None else (layer,))]
        dropped = 0
        for bank in banks:
            # A missing bank has nothing dead, and an exclusive lock would create its folder.
            if not bank.path.exists():
                continue
            with bank.hold(exclusive=True):
                bank.sync()
                bank.history.check()
                bank.settle()
                dropped += bank.compact(create_store=self.root)
        return dropped


def _readable_records(bank: Bank) -> int:
    """How many live records a bank about to be erased has, if it can be read at all."""
    try:
        bank.sync()
    except (MemoryStoreCorruptionError, UnsafeLinkError):
        return 0  # erased all the same; only what can be read can be counted
    return len(bank.records)


def _history_lines(bank: Bank) -> int:
    """How many complete entries a history about to be erased has (one a line)."""
    try:
        with bank.root.reader(bank.history.path) as file:
            return file.read().count(b"\n")
    except (FileNotFoundError, MemoryStoreCorruptionError, UnsafeLinkError):
        return 0
