"""The three-layer memory bank: typed records and durable per-user stores.

`MemoryBank` is where to start: it builds a store's retriever and updater, wired
together, and offers the everyday operations. This namespace holds what users of
the memory layer call; everything else is imported from the module that defines it
(``autopersona_flows.memory.maintenance``, ``.corrections``, ...).

This package never imports Prefect or the agent, and imports each name's module on
first use (see ``autopersona_flows/_lazy.py``), so ``import autopersona_flows.memory``
stays fast and a JSONL user never loads the PostgreSQL store or the LLM extractor.
"""

from typing import TYPE_CHECKING

from autopersona_flows._lazy import exports

if TYPE_CHECKING:
    from autopersona_flows.memory.bank import MemoryBank
    from autopersona_flows.memory.chatlog import ChatMessage, chat_sessions
    from autopersona_flows.memory.consolidation import promote_choices
    from autopersona_flows.memory.embedders import (
        Embedder,
        FunctionEmbedder,
        HashingEmbedder,
        MiniLMEmbedder,
    )
    from autopersona_flows.memory.erasure import erase_user
    from autopersona_flows.memory.extraction import ExtractedMemory, Extractor, RuleExtractor
    from autopersona_flows.memory.ingestion import ingest_task_history
    from autopersona_flows.memory.jsonl import JsonlMemoryStore
    from autopersona_flows.memory.llm_extraction import OpenAICompatibleExtractor
    from autopersona_flows.memory.maintenance import maintain_user, retire_expired
    from autopersona_flows.memory.postgres import PostgresMemoryStore
    from autopersona_flows.memory.protocol import MemoryStore
    from autopersona_flows.memory.records import (
        MemoryLayer,
        MemoryRecord,
        PersonaMemory,
        RawTaskRecord,
        TrajectoryMemory,
        WorkspaceMemory,
    )
    from autopersona_flows.memory.retrieval import (
        MemoryBundle,
        MemoryRetriever,
        ScoredMemory,
        SearchRequest,
    )
    from autopersona_flows.memory.snapshots import MemoryChange, MemorySnapshot
    from autopersona_flows.memory.stores import open_store
    from autopersona_flows.memory.updates import (
        FunctionResolver,
        HeuristicResolver,
        MemoryUpdater,
        Resolver,
        UpdateDecision,
    )
else:
    __getattr__, __dir__ = exports(
        __name__,
        {
            "autopersona_flows.memory.bank": ("MemoryBank",),
            "autopersona_flows.memory.chatlog": ("ChatMessage", "chat_sessions"),
            "autopersona_flows.memory.consolidation": ("promote_choices",),
            "autopersona_flows.memory.embedders": (
                "Embedder",
                "FunctionEmbedder",
                "HashingEmbedder",
                "MiniLMEmbedder",
            ),
            "autopersona_flows.memory.erasure": ("erase_user",),
            "autopersona_flows.memory.extraction": (
                "ExtractedMemory",
                "Extractor",
                "RuleExtractor",
            ),
            "autopersona_flows.memory.ingestion": ("ingest_task_history",),
            "autopersona_flows.memory.jsonl": ("JsonlMemoryStore",),
            "autopersona_flows.memory.llm_extraction": ("OpenAICompatibleExtractor",),
            "autopersona_flows.memory.maintenance": ("maintain_user", "retire_expired"),
            "autopersona_flows.memory.postgres": ("PostgresMemoryStore",),
            "autopersona_flows.memory.protocol": ("MemoryStore",),
            "autopersona_flows.memory.records": (
                "MemoryLayer",
                "MemoryRecord",
                "PersonaMemory",
                "RawTaskRecord",
                "TrajectoryMemory",
                "WorkspaceMemory",
            ),
            "autopersona_flows.memory.retrieval": (
                "MemoryBundle",
                "MemoryRetriever",
                "ScoredMemory",
                "SearchRequest",
            ),
            "autopersona_flows.memory.snapshots": ("MemoryChange", "MemorySnapshot"),
            "autopersona_flows.memory.stores": ("open_store",),
            "autopersona_flows.memory.updates": (
                "FunctionResolver",
                "HeuristicResolver",
                "MemoryUpdater",
                "Resolver",
                "UpdateDecision",
            ),
        },
        # Re-exported here in 0.1: code written then still runs, with a DeprecationWarning.
        moved={
            "autopersona_flows.memory.corrections": (
                "bury_memory",
                "edit_memory",
                "find_memory",
                "forget_memory",
                "unbury_memory",
            ),
            "autopersona_flows.memory.embedders": ("get_embedder",),
            "autopersona_flows.memory.erasure": ("ErasureReport",),
            "autopersona_flows.memory.ids": ("new_memory_id",),
            "autopersona_flows.memory.index": ("Scoring",),
            "autopersona_flows.memory.ingestion": (
                "IngestionResult",
                "read_task_records",
                "refine_persona",
                "refine_trajectory",
                "refine_workspace",
            ),
            "autopersona_flows.memory.jsonl": ("StrayEntry",),
            "autopersona_flows.memory.maintenance": (
                "Compactable",
                "MaintenanceReport",
                "MemoryMerge",
                "consolidate_duplicates",
                "expire_workspace",
            ),
            "autopersona_flows.memory.persona2web": (
                "Persona2WebCase",
                "history_to_raw_tasks",
                "load_persona2web",
            ),
            "autopersona_flows.memory.protocol": ("ChangeSet", "Erasure"),
            "autopersona_flows.memory.provenance": ("Provenance",),
            "autopersona_flows.memory.records": (
                "LAYERS",
                "Embedding",
                "JsonValue",
                "LayerContent",
                "as_content",
                "content_type",
            ),
            "autopersona_flows.memory.reindex": ("reindex_user",),
            "autopersona_flows.memory.slots": ("same_slot",),
            "autopersona_flows.memory.snapshots": ("read_snapshot", "write_snapshot"),
            "autopersona_flows.memory.updates": ("embed_records",),
            "autopersona_flows.memory.users": ("check_user_id",),
            "autopersona_flows.memory.validity": ("valid_until",),
        },
    )

__all__ = [
    "ChatMessage",
    "Embedder",
    "ExtractedMemory",
    "Extractor",
    "FunctionEmbedder",
    "FunctionResolver",
    "HashingEmbedder",
    "HeuristicResolver",
    "JsonlMemoryStore",
    "MemoryBank",
    "MemoryBundle",
    "MemoryChange",
    "MemoryLayer",
    "MemoryRecord",
    "MemoryRetriever",
    "MemorySnapshot",
    "MemoryStore",
    "MemoryUpdater",
    "MiniLMEmbedder",
    "OpenAICompatibleExtractor",
    "PersonaMemory",
    "PostgresMemoryStore",
    "RawTaskRecord",
    "Resolver",
    "RuleExtractor",
    "ScoredMemory",
    "SearchRequest",
    "TrajectoryMemory",
    "UpdateDecision",
    "WorkspaceMemory",
    "chat_sessions",
    "erase_user",
    "ingest_task_history",
    "maintain_user",
    "open_store",
    "promote_choices",
    "retire_expired",
]
