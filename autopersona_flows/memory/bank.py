"""`MemoryBank`: a user's whole memory behind one object.

Reading and writing a bank takes four parts that must agree: the store, the
embedder it was written with, a retriever over both and an updater sharing that
retriever (two store objects on one folder hold separate locks; two retrievers
keep two indexes). A `MemoryBank` builds them once, wired together, and offers
the everyday operations; the parts stay reachable for anything else.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, overload

from autopersona_flows.errors import MemoryBankError
from autopersona_flows.memory.corrections import (
    bury_memory,
    edit_memory,
    find_memory,
    forget_memory,
    unbury_memory,
)
from autopersona_flows.memory.embedders import Embedder, default_embedder
from autopersona_flows.memory.extraction import Extractor
from autopersona_flows.memory.ingestion import IngestionResult, ingest_task_history
from autopersona_flows.memory.protocol import MemoryStore
from autopersona_flows.memory.provenance import Provenance
from autopersona_flows.memory.records import (
    LayerContent,
    MemoryLayer,
    MemoryRecord,
    RawTaskRecord,
)
from autopersona_flows.memory.retrieval import MemoryBundle, MemoryRetriever, SearchRequest
from autopersona_flows.memory.snapshots import MemoryChange
from autopersona_flows.memory.stores import open_store
from autopersona_flows.memory.updates import MemoryUpdater, Resolver, UpdateDecision

__all__ = ["MemoryBank"]


class MemoryBank:
    """The store, embedder, retriever and updater of users' memories, built once.

    The retriever and the updater share the store object, the embedder and one
    index per (user, layer): what the updater writes is seen by the next retrieval
    without reading the bank again or embedding anything twice.

    Example::

        bank = MemoryBank("memory")  # a folder, made on the first write
        bank.update("ada", "persona", PersonaMemory(topic="tone", preference="formal"))
        agent = PersonaAgent(bank)

    Args:
        store: A `MemoryStore`, or its address as `open_store` takes it (a folder,
            ``jsonl:FOLDER`` or ``postgresql://...``). The command line and
            deployments use the store the settings name (``store_from_settings()``
            in ``autopersona_flows.flows``; ``$PREFECT_HOME/autopersona/memory`` by
            default): pass it to share theirs.
        embedder: Embeds memories and queries; must be what the store was written
            with. the shipped `SentenceEncoder` by default.
        resolver: Decides add / update / delete / noop for `update` (and `ingest`);
            `HeuristicResolver` by default. A plain callable is adapted.
        extractor: Reads persona memories out of the tasks given to `ingest`;
            `RuleExtractor` by default.

    Raises:
        MemoryBankError: If ``store`` is neither a `MemoryStore` nor an address, or
            ``embedder`` or ``extractor`` does not follow its protocol.
        MemoryStoreError: If ``store`` is an address of an unsupported kind.
    """

    def __init__(
        self,
        store: MemoryStore | str | os.PathLike[str],
        embedder: Embedder | None = None,
        *,
        resolver: Resolver | Callable[..., Any] | None = None,
        extractor: Extractor | None = None,
    ) -> None:
        embedder = embedder if embedder is not None else default_embedder()
        if not isinstance(embedder, Embedder):
            raise MemoryBankError(
                f"embedder must be an Embedder (name, dim, embed), got {type(embedder).__name__}; "
                "wrap a function in FunctionEmbedder"
            )
        retriever = MemoryRetriever(_opened(store), embedder)
        updater = MemoryUpdater(retriever.store, embedder, resolver, retriever=retriever)
        self._init(retriever, updater, extractor)

    @classmethod
    def from_retriever(
        cls,
        retriever: MemoryRetriever,
        updater: MemoryUpdater | None = None,
        *,
        extractor: Extractor | None = None,
    ) -> MemoryBank:
        """A bank over parts already built (the wiring before `MemoryBank` existed).

        Args:
            retriever: Reads the bank.
            updater: Writes it; one sharing ``retriever`` is made if not given.
            extractor: As for the constructor.

        Raises:
            MemoryBankError: If ``retriever`` is not a `MemoryRetriever`, ``updater``
                not a `MemoryUpdater` or ``extractor`` not an `Extractor`.
            ValueError: If ``updater`` writes to another store object than the one
                ``retriever`` reads.
        """
        if not isinstance(retriever, MemoryRetriever):
            raise MemoryBankError(
                f"retriever must be a MemoryRetriever, got {type(retriever).__name__}"
            )
        if updater is None:
            updater = MemoryUpdater(retriever.store, retriever=retriever)
        elif not isinstance(updater, MemoryUpdater):
            raise MemoryBankError(f"updater must be a MemoryUpdater, got {type(updater).__name__}")
        if updater.store is not retriever.store:
            raise ValueError("the updater must write to the store object the retriever reads")
        bank = cls.__new__(cls)
        bank._init(retriever, updater, extractor)
        return bank

    def _init(
        self, retriever: MemoryRetriever, updater: MemoryUpdater, extractor: Extractor | None
    ) -> None:
        if extractor is not None and not isinstance(extractor, Extractor):
            raise MemoryBankError(
                f"extractor must be an Extractor (an extract method), "
                f"got {type(extractor).__name__}"
            )
        self.store: MemoryStore = retriever.store
        self.embedder: Embedder = retriever.embedder
        self.retriever = retriever
        self.updater = updater
        self.extractor = extractor

    def __repr__(self) -> str:
        return f"MemoryBank({self.store!r}, {self.embedder!r})"

    def retrieve(
        self,
        user_id: str,
        searches: Sequence[SearchRequest],
        top_k: int = 3,
        min_similarity: float = 0.0,
        *,
        distinct_per_label: bool = False,
        as_of: datetime | None = None,
        include_past: bool = False,
        recency_half_life: timedelta | None = None,
    ) -> MemoryBundle:
        """The memories ``searches`` find in the user's bank; see `MemoryRetriever.retrieve`."""
        return self.retriever.retrieve(
            user_id,
            searches,
            top_k,
            min_similarity,
            distinct_per_label=distinct_per_label,
            as_of=as_of,
            include_past=include_past,
            recency_half_life=recency_half_life,
        )

    def add(
        self,
        user_id: str,
        content: LayerContent,
        *,
        at: datetime | None = None,
        valid_until: datetime | None = None,
        provenance: Provenance | None = None,
    ) -> MemoryRecord:
        """Store ``content`` as a new memory, unresolved; see `MemoryUpdater.add`."""
        return self.updater.add(
            user_id, content, at=at, valid_until=valid_until, provenance=provenance
        )

    def update(
        self,
        user_id: str,
        layer: MemoryLayer,
        content: LayerContent | dict[str, Any],
        *,
        at: datetime | None = None,
        valid_until: datetime | None = None,
        provenance: Provenance | None = None,
    ) -> UpdateDecision:
        """Resolve ``content`` against what is stored and apply it; see `MemoryUpdater.update`."""
        return self.updater.update(
            user_id, layer, content, at=at, valid_until=valid_until, provenance=provenance
        )

    @overload
    def ingest(self, records: RawTaskRecord) -> IngestionResult: ...
    @overload
    def ingest(self, records: Iterable[RawTaskRecord]) -> list[IngestionResult]: ...
    def ingest(
        self, records: RawTaskRecord | Iterable[RawTaskRecord]
    ) -> IngestionResult | list[IngestionResult]:
        """Store completed tasks with the bank's extractor; see `ingest_task_history`.

        Args:
            records: One task, or several (ingested in order).

        Returns:
            The task's `IngestionResult`, or one per task, in order.

        Raises:
            MemoryBankError: If an item is not a `RawTaskRecord` (validate dicts with
                ``RawTaskRecord.model_validate`` first).
        """
        # A record is itself iterable (pydantic yields its fields): test it first.
        if isinstance(records, RawTaskRecord):
            return self._ingest(records)
        if isinstance(records, str | bytes | dict):
            raise MemoryBankError(
                f"ingest takes a RawTaskRecord or an iterable of them, got {type(records).__name__}"
            )
        return [self._ingest(record) for record in records]

    def _ingest(self, record: object) -> IngestionResult:
        if not isinstance(record, RawTaskRecord):
            raise MemoryBankError(f"ingest takes RawTaskRecords, got {type(record).__name__}")
        return ingest_task_history(self.store, self.updater, record, extractor=self.extractor)

    def history(
        self, user_id: str, layer: MemoryLayer, memory_id: str | None = None
    ) -> list[MemoryChange]:
        """The superseded and deleted versions, oldest first; see `MemoryStore.history`."""
        return self.store.history(user_id, layer, memory_id)

    # -- a person's corrections, by id (see autopersona_flows/memory/corrections.py) ----------

    def find(self, user_id: str, memory_id: str, layer: MemoryLayer | None = None) -> MemoryRecord:
        """The user's memory with this id, in any layer unless given; see `find_memory`."""
        return find_memory(self.store, user_id, memory_id, layer)

    def edit(
        self,
        user_id: str,
        memory_id: str,
        changes: Mapping[str, Any],
        *,
        layer: MemoryLayer | None = None,
        reason: str = "",
        command: str | None = None,
    ) -> MemoryRecord:
        """Revise fields of a memory's content, the old version to history; see `edit_memory`.

        The next retrieval (and so the next decision) sees the new content.
        """
        return edit_memory(
            self.store,
            self.embedder,
            user_id,
            memory_id,
            changes,
            layer=layer,
            reason=reason,
            command=command,
        )

    def forget(
        self,
        user_id: str,
        memory_id: str,
        *,
        layer: MemoryLayer | None = None,
        reason: str = "",
        command: str | None = None,
    ) -> MemoryRecord:
        """Delete a memory, kept in the history only; see `forget_memory`."""
        return forget_memory(
            self.store, user_id, memory_id, layer=layer, reason=reason, command=command
        )

    def bury(
        self,
        user_id: str,
        memory_id: str,
        *,
        layer: MemoryLayer | None = None,
        reason: str = "",
        command: str | None = None,
    ) -> MemoryRecord:
        """Keep a memory but never retrieve it until unburied; see `bury_memory`."""
        return bury_memory(
            self.store, user_id, memory_id, layer=layer, reason=reason, command=command
        )

    def unbury(
        self,
        user_id: str,
        memory_id: str,
        *,
        layer: MemoryLayer | None = None,
        reason: str = "",
        command: str | None = None,
    ) -> MemoryRecord:
        """Let a buried memory be retrieved again; see `unbury_memory`."""
        return unbury_memory(
            self.store, user_id, memory_id, layer=layer, reason=reason, command=command
        )


def _opened(store: object) -> MemoryStore:
    if isinstance(store, str | os.PathLike):
        return open_store(store)
    if not isinstance(store, MemoryStore):
        raise MemoryBankError(
            f"store must be a MemoryStore or its address (a folder, jsonl:FOLDER or "
            f"postgresql://...), got {type(store).__name__}"
        )
    return store
