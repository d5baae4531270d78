"""`InMemoryMemoryStore`: a `MemoryStore` in this process's memory, for fast unit tests."""

from __future__ import annotations

import builtins
import secrets
import threading
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from typing import Any

from autopersona_flows.errors import DuplicateMemoryError, MemoryNotFoundError, SnapshotError
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
from autopersona_flows.memory.users import check_user_id

__all__ = ["InMemoryMemoryStore"]

_Key = tuple[str, MemoryLayer]
_NO_BANK = "none:0"
"""The cursor of a bank that does not exist (yet, or any more)."""


class _Bank:
    """One user's layer: its records in insertion order, its history and its change feed.

    Only touched with the store's state lock held.
    """

    def __init__(self, records: Iterable[MemoryRecord] = ()) -> None:
        self.records: dict[str, MemoryRecord] = {record.id: record for record in records}
        self.history: list[MemoryChange] = []
        self.epoch = secrets.token_hex(8)  # a new bank, or a replaced one: old cursors read all
        self.seq = 0
        self.changed: dict[str, int] = {}  # memory id -> seq of its last change, in change order

    def touch(self, memory_id: str) -> None:
        self.seq += 1
        self.changed.pop(memory_id, None)  # to the end: the dict stays in change order
        self.changed[memory_id] = self.seq

    def require(self, user_id: str, layer: MemoryLayer, memory_id: str) -> MemoryRecord:
        try:
            return self.records[memory_id]
        except KeyError:
            raise MemoryNotFoundError(user_id, layer, memory_id) from None

    def changes_since(self, cursor: str | None) -> ChangeSet:
        now = f"{self.epoch}:{self.seq}"
        epoch, _, seq_text = (cursor or "").partition(":")
        known = epoch == self.epoch and seq_text.isascii() and seq_text.isdigit()
        since = int(seq_text) if known else -1
        if since < 0 or since > self.seq:
            return ChangeSet(cursor=now, full=True, records=[*self.records.values()])
        ids = [memory_id for memory_id, seq in self.changed.items() if seq > since]
        return ChangeSet(
            cursor=now,
            full=False,
            records=[self.records[i] for i in ids if i in self.records],
            deleted=[i for i in ids if i not in self.records],
        )


class InMemoryMemoryStore:
    """A `MemoryStore` kept in this process's memory: fast, and gone with the process.

    It passes the same conformance suite as the durable stores
    (`MemoryStoreConformance`), so a test that runs a flow, an agent or a bank on it
    exercises the store contract exactly as production does, without files or a
    database. "Durable" here means: for as long as the object lives. Share the one
    object wherever the test needs the same memories (a second object is a second,
    empty store); it is never copied into another process, so keep tools that read
    memory themselves on a thread-based task runner.

    Safe to share between threads: every write of a bank holds that bank's write
    lock (the one `locked` holds, re-entrant for its own thread), and every call
    reads or changes the banks under one short state lock, so a reader sees a batch
    whole or not at all and never waits for a `locked` block.

    Example::

        store = InMemoryMemoryStore()
        store.add("ada", PersonaMemory(topic="citation style", preference="APA"))
        agent = PersonaAgent(MemoryBank(store, HashingEmbedder()))
    """

    def __init__(self) -> None:
        self._banks: dict[_Key, _Bank] = {}
        self._state = threading.Lock()
        # Never dropped: a writer may be waiting on a bank's lock while `erase` holds it,
        # and must then write to the fresh bank, under the same lock.
        self._locks: dict[_Key, threading.RLock] = {}

    def __repr__(self) -> str:
        with self._state:
            users = len({user for user, _ in self._banks})
        return f"{type(self).__name__}(users={users})"

    def __reduce__(self) -> tuple[Any, ...]:
        # A copy in another process would be a second store that silently diverges.
        raise TypeError(
            "an InMemoryMemoryStore lives in one process and is not pickled: where memory "
            "must be shared with other processes, use a JsonlMemoryStore on a temporary folder"
        )

    # -- locks ---------------------------------------------------------------------------

    def _key(self, user_id: str, layer: MemoryLayer) -> _Key:
        check_user_id(user_id)
        content_type(layer)  # validates the layer, naming it
        return user_id, layer

    def _lock(self, key: _Key) -> threading.RLock:
        with self._state:
            lock = self._locks.get(key)
            if lock is None:
                lock = self._locks[key] = threading.RLock()
            return lock

    @contextmanager
    def _writing(self, user_id: str, layer: MemoryLayer) -> Iterator[_Bank]:
        """The bank of ``key``, created if missing, with its write lock and the state lock."""
        key = self._key(user_id, layer)
        with self._lock(key), self._state:
            bank = self._banks.get(key)
            if bank is None:
                bank = self._banks[key] = _Bank()
            yield bank

    @contextmanager
    def _all_layers(self, user_id: str) -> Iterator[dict[MemoryLayer, _Bank | None]]:
        """Every layer's bank (None if missing) under its write lock, in `LAYERS` order."""
        keys = [self._key(user_id, layer) for layer in LAYERS]
        with ExitStack() as stack:
            for key in keys:  # a fixed order: two multi-bank callers cannot deadlock
                stack.enter_context(self._lock(key))
            with self._state:
                yield {layer: self._banks.get(key) for key, layer in zip(keys, LAYERS, strict=True)}

    @contextmanager
    def locked(self, user_id: str, layer: MemoryLayer) -> Iterator[None]:
        """Hold a bank's write lock across several calls; see `MemoryStore.locked`."""
        with self._lock(self._key(user_id, layer)):
            yield

    # -- MemoryStore ---------------------------------------------------------------------

    def add(self, user_id: str, item: MemoryRecord | LayerContent) -> MemoryRecord:
        """Store one record; see `MemoryStore.add`."""
        check_user_id(user_id)
        record = as_record(item)
        with self._writing(user_id, record.layer) as bank:
            if record.id in bank.records:
                raise DuplicateMemoryError(
                    f"user {user_id!r} already has a {record.layer} memory with id {record.id!r}"
                )
            bank.records[record.id] = record
            bank.touch(record.id)
        return record

    def add_many(
        self, user_id: str, layer: MemoryLayer, items: Iterable[MemoryRecord | LayerContent]
    ) -> builtins.list[MemoryRecord]:
        """Store records of one layer atomically; see `MemoryStore.add_many`."""
        self._key(user_id, layer)
        records = [as_record(item, layer=layer, index=i) for i, item in enumerate(items)]
        if not records:
            return []
        with self._writing(user_id, layer) as bank:
            seen: set[str] = set()
            for record in records:
                if record.id in bank.records or record.id in seen:
                    raise DuplicateMemoryError(
                        f"{layer} memory id {record.id!r} is already stored for user {user_id!r}"
                        if record.id in bank.records
                        else f"memory id {record.id!r} appears twice in the batch"
                    )
                seen.add(record.id)
            for record in records:
                bank.records[record.id] = record
                bank.touch(record.id)
        return records

    def get(self, user_id: str, layer: MemoryLayer, memory_id: str) -> MemoryRecord:
        """Return one record; see `MemoryStore.get`."""
        key = self._key(user_id, layer)
        with self._state:
            return self._banks.get(key, _Bank()).require(user_id, layer, memory_id)

    def list(self, user_id: str, layer: MemoryLayer) -> builtins.list[MemoryRecord]:
        """Return a layer's records, oldest first; see `MemoryStore.list`."""
        key = self._key(user_id, layer)
        with self._state:
            bank = self._banks.get(key)
            return [*bank.records.values()] if bank is not None else []

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
        self._key(user_id, layer)
        content = as_content(content, layer)
        with self._writing(user_id, layer) as bank:
            before = bank.require(user_id, layer, memory_id)
            after = before.revised(
                content,
                embedding=embedding,
                at=at,
                valid_until=valid_until,
                buried=buried,
                provenance=provenance,
            )
            bank.records[memory_id] = after  # an existing key keeps its place in the order
            bank.touch(memory_id)
            bank.history.append(
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
        with self._writing(user_id, layer) as bank:
            before = bank.require(user_id, layer, memory_id)
            del bank.records[memory_id]
            bank.touch(memory_id)
            bank.history.append(
                MemoryChange(
                    operation="delete",
                    at=datetime.now(UTC),
                    before=before,
                    reason=reason,
                    provenance=provenance,
                )
            )
        return before

    def history(
        self, user_id: str, layer: MemoryLayer, memory_id: str | None = None
    ) -> builtins.list[MemoryChange]:
        """Return a record's superseded and deleted versions; see `MemoryStore.history`."""
        key = self._key(user_id, layer)
        with self._state:
            bank = self._banks.get(key)
            changes = [*bank.history] if bank is not None else []
        return [c for c in changes if memory_id is None or c.before.id == memory_id]

    def changes(self, user_id: str, layer: MemoryLayer, since: str | None = None) -> ChangeSet:
        """Return what changed in a bank since ``since``; see `MemoryStore.changes`."""
        key = self._key(user_id, layer)
        with self._state:
            bank = self._banks.get(key)
            if bank is None:
                return ChangeSet(cursor=_NO_BANK, full=since != _NO_BANK, records=[])
            return bank.changes_since(since)

    def users(self) -> builtins.list[str]:
        """Return every user with a bank here, sorted; see `MemoryStore.users`."""
        with self._state:
            return sorted({user for user, _ in self._banks})

    def snapshot(self, user_id: str) -> MemorySnapshot:
        """Read all layers as one view; see `MemoryStore.snapshot`."""
        keys = {layer: self._key(user_id, layer) for layer in LAYERS}
        with self._state:
            memories = {
                layer: [*bank.records.values()]
                for layer, key in keys.items()
                if (bank := self._banks.get(key)) is not None
            }
        return MemorySnapshot.of(user_id, memories)

    def snapshot_fingerprint(self, user_id: str) -> str:
        """Return the snapshot's fingerprint; see `MemoryStore.snapshot_fingerprint`."""
        return self.snapshot(user_id).fingerprint

    def erase(self, user_id: str) -> Erasure:
        """Remove everything of a user, under the bank locks; see `MemoryStore.erase`."""
        with self._all_layers(user_id) as banks:
            found = [bank for bank in banks.values() if bank is not None]
            for layer in LAYERS:
                self._banks.pop((user_id, layer), None)
        return Erasure(
            user_id,
            found=bool(found),
            memories=sum(len(bank.records) for bank in found),
            changes=sum(len(bank.history) for bank in found),
        )

    def restore(self, snapshot: MemorySnapshot, *, replace: bool = False) -> None:
        """Load a snapshot into its user's banks; see `MemoryStore.restore`.

        Each layer is replaced whole, under a new epoch of its change feed; the
        change history of the records it drops is kept, as `JsonlMemoryStore` does.
        """
        user_id = snapshot.user_id
        with self._all_layers(user_id) as banks:
            existing = sum(len(bank.records) for bank in banks.values() if bank is not None)
            if existing and not replace:
                raise SnapshotError(
                    f"user {user_id!r} already has {existing} memories; "
                    "restore with replace=True to overwrite them"
                )
            for layer, bank in banks.items():
                records = snapshot.memories[layer]
                if bank is None and not records:
                    continue  # an empty layer of a new user creates no bank
                fresh = _Bank(records)
                fresh.history = bank.history if bank is not None else []
                self._banks[user_id, layer] = fresh
