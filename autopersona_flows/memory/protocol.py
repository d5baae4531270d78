"""The contract every memory store fulfils."""

from __future__ import annotations

import builtins
from collections.abc import Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, NamedTuple, Protocol, runtime_checkable

from autopersona_flows.memory.provenance import Provenance
from autopersona_flows.memory.records import Embedding, LayerContent, MemoryLayer, MemoryRecord
from autopersona_flows.memory.snapshots import MemoryChange, MemorySnapshot

if TYPE_CHECKING:
    from collections.abc import Sequence

    import numpy as np

    from autopersona_flows.memory.embedders import Embedder
    from autopersona_flows.memory.index import Scoring, TimeView

__all__ = ["BankSearch", "ChangeSet", "Erasure", "Found", "MemoryStore", "SearchableStore"]


@dataclass(frozen=True)
class ChangeSet:
    """What changed in one bank since a cursor: the feed that keeps indexes current.

    Attributes:
        cursor: Pass it to the next `MemoryStore.changes` call.
        full: The caller must start over: ``records`` is then the whole bank.
        records: Added or updated records, current versions (all records if ``full``).
        deleted: Ids of removed records (empty if ``full``).
    """

    cursor: str
    full: bool
    records: list[MemoryRecord]
    deleted: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Erasure:
    """What `MemoryStore.erase` removed of one user: counts, never contents.

    Attributes:
        user_id: Whose memory was erased.
        found: Whether the store held anything of the user (a bank, even an empty
            one, a history, a kept ``.corrupt`` file). ``False``: nothing was there
            and nothing was changed.
        memories: Live records removed, in all layers.
        changes: Change-history entries removed, in all layers.
    """

    user_id: str
    found: bool
    memories: int = 0
    changes: int = 0


@runtime_checkable
class MemoryStore(Protocol):
    """A durable, per-user, three-layer memory bank.

    Every operation is partitioned by user id: no call returns, changes or counts
    another user's records. Records are identified by their id, never by position.
    Once a call returns, what it wrote is durable. Stores are safe to share
    between threads.

    Raises (for every method):
        InvalidUserIdError: If the user id is not a non-empty string of valid Unicode.
        MemoryStoreCorruptionError: If stored data is malformed; nothing is modified.
    """

    def add(self, user_id: str, item: MemoryRecord | LayerContent) -> MemoryRecord:
        """Store one record, or wrap layer content in a new record and store that.

        Returns:
            The stored record.

        Raises:
            DuplicateMemoryError: If a record with the same id is already stored.
        """
        ...

    def add_many(
        self, user_id: str, layer: MemoryLayer, items: Iterable[MemoryRecord | LayerContent]
    ) -> builtins.list[MemoryRecord]:
        """Store several records of one layer atomically: all of them or none.

        Returns:
            The stored records, in the order given.

        Raises:
            ValueError: If an item belongs to another layer.
            DuplicateMemoryError: If an id repeats or is already stored.
        """
        ...

    def get(self, user_id: str, layer: MemoryLayer, memory_id: str) -> MemoryRecord:
        """Return one record.

        Raises:
            MemoryNotFoundError: If the user has no such record in ``layer``.
        """
        ...

    def list(self, user_id: str, layer: MemoryLayer) -> builtins.list[MemoryRecord]:
        """Return every record of the user's ``layer``, oldest first."""
        ...

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
        """Replace a record's content, keeping its id and creation time.

        The previous version is kept in the change history, with ``reason``. The
        stored embedding described the old content, so it is replaced by
        ``embedding`` (or dropped). ``at`` and ``valid_until`` are the new
        content's `MemoryRecord.stated_at` and ``valid_until``. ``buried`` buries
        (``True``) or unburies (``False``) the record (`MemoryRecord.buried_at`);
        ``None``, the default, keeps it as it was. ``provenance`` is what made the
        change: the history entry records it, and the record takes it as its own
        if the content changed (see `MemoryRecord.revised`).

        Returns:
            The updated record.

        Raises:
            MemoryNotFoundError: If the user has no such record in ``layer``.
        """
        ...

    def delete(
        self,
        user_id: str,
        layer: MemoryLayer,
        memory_id: str,
        *,
        reason: str = "",
        provenance: Provenance | None = None,
    ) -> MemoryRecord:
        """Remove a record; it is kept in the change history, with ``reason`` and ``provenance``.

        Returns:
            The removed record.

        Raises:
            MemoryNotFoundError: If the user has no such record in ``layer``.
        """
        ...

    def history(
        self, user_id: str, layer: MemoryLayer, memory_id: str | None = None
    ) -> builtins.list[MemoryChange]:
        """Return the superseded and deleted versions of a record, oldest first.

        With ``memory_id=None``, those of every record of the layer, oldest first.
        Only changes the bank went through are listed: an update or delete that was
        refused, or cut short before it reached the bank, is not.
        """
        ...

    def changes(self, user_id: str, layer: MemoryLayer, since: str | None = None) -> ChangeSet:
        """Return what changed in a bank since the cursor ``since``.

        With ``since=None``, an unknown or expired cursor, or after the bank was
        replaced wholesale, the result is ``full``. Otherwise it holds only the
        records added, updated or deleted since, so an index stays current at the
        cost of the changes, not of the bank.
        """
        ...

    def locked(self, user_id: str, layer: MemoryLayer) -> AbstractContextManager[None]:
        """Hold a bank's write lock across several calls (read, decide, write).

        Calls on the same bank from this thread inside the block reuse the lock;
        other threads and processes wait until the block ends. Inside the block,
        touch only this bank (or banks of later layers in `LAYERS` order): taking
        an earlier layer of the same user can deadlock against `snapshot`.
        """
        ...

    def users(self) -> builtins.list[str]:
        """Return the ids of all users with a bank in this store, sorted."""
        ...

    def snapshot(self, user_id: str) -> MemorySnapshot:
        """Read all three layers of a user as one consistent view."""
        ...

    def snapshot_fingerprint(self, user_id: str) -> str:
        """Return the fingerprint of `snapshot`: equal data gives equal fingerprints."""
        ...

    def erase(self, user_id: str) -> Erasure:
        """Remove everything the store holds of a user: every layer, its history, its indexes.

        Unlike `delete`, nothing is kept: afterwards the store holds no byte of the
        user's memories, and the user is not in `users`. The user's bank locks are
        held while it happens, in `LAYERS` order, so a writer waiting on one of them
        writes afterwards, to an empty bank, and cannot bring back part of the old
        one. Other users are untouched. A bank that is corrupt is erased too.

        A user the store holds nothing of is not an error (an erase cut short, or
        asked twice, is simply finished): the result's ``found`` is then ``False``.

        Returns:
            What was removed.
        """
        ...

    def restore(self, snapshot: MemorySnapshot, *, replace: bool = False) -> None:
        """Load a snapshot into its user's bank; afterwards `snapshot` gives it back.

        Raises:
            SnapshotError: If the user already has memories and ``replace`` is false.
        """
        ...


@dataclass(frozen=True)
class BankSearch:
    """What `SearchableStore.search_bank` is asked: queries against one bank.

    Attributes:
        queries: The query texts.
        vectors: Their embeddings by ``embedder``, one row per query.
        embedder: The retriever's embedder: stored vectors of another are refused
            (`EmbeddingMismatchError`) unless it is ``local``.
        scoring: How a record's score is made, as `BankIndex` makes it.
        time: Which records are current and how recency weighs.
        wanted: At most this many records per query, each scoring above 0.
    """

    queries: Sequence[str]
    vectors: np.ndarray
    embedder: Embedder
    scoring: Scoring
    time: TimeView
    wanted: int


class Found(NamedTuple):
    """A record a store's own search found, and its score (see `Scoring`)."""

    score: float
    record: MemoryRecord


@runtime_checkable
class SearchableStore(Protocol):
    """A store that can search its banks itself, so that a worker holds no index of them.

    `MemoryRetriever` asks it first, for searches and lookups of the bank as it is
    now (an ``as_of`` look back is answered by an index built for the call); ``None``
    sends it to its own in-memory index. Buried records (`MemoryRecord.buried_at`)
    are never returned, as the index leaves them out.
    """

    def search_bank(
        self, user_id: str, layer: MemoryLayer, search: BankSearch
    ) -> builtins.list[builtins.list[Found]] | None:
        """Return each query's best current records in a bank, best first.

        Args:
            user_id: Whose bank.
            layer: Which bank.
            search: The queries, and how their results are scored.

        Returns:
            One list per query, of at most ``search.wanted`` records, best first; or
            ``None`` if this store leaves searching to the retriever's index.
        """
        ...

    def prepare_bank(self, user_id: str, layer: MemoryLayer) -> bool:
        """Index now what the store has not indexed of a bank, so no search pays for it.

        Returns:
            ``False`` if this store leaves searching to the retriever's index.
        """
        ...

    def find_in_bank(
        self, user_id: str, layer: MemoryLayer, content: LayerContent
    ) -> builtins.list[MemoryRecord] | None:
        """Return the records whose content equals ``content``, expired ones too, oldest first.

        ``None`` if this store leaves lookups to the retriever's index (as for each
        method below).
        """
        ...

    def learned_in_bank(
        self, user_id: str, contexts: Sequence[str]
    ) -> builtins.list[MemoryRecord] | None:
        """Return the persona records learned at any of ``contexts`` (compared normalised).

        In the order of ``contexts``, then oldest first; expired ones too.
        """
        ...

    def holding_in_bank(
        self, user_id: str, layer: MemoryLayer, words: Sequence[str]
    ) -> builtins.list[MemoryRecord] | None:
        """Return the records holding every term (`terms`) of any of ``words``.

        Latest said first (`MemoryRecord.at`, then id); expired ones too.
        """
        ...
