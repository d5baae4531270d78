"""The three-layer memory bank: typed records and durable per-user stores.

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
    from autopersona_flows.memory.corrections import (
        bury_memory,
        edit_memory,
        find_memory,
        forget_memory,
        unbury_memory,
    )
    from autopersona_flows.memory.embedders import (
        Embedder,
        FunctionEmbedder,
        HashingEmbedder,
        MiniLMEmbedder,
        get_embedder,
    )
    from autopersona_flows.memory.erasure import ErasureReport, erase_user
    from autopersona_flows.memory.extraction import ExtractedMemory, Extractor, RuleExtractor
    from autopersona_flows.memory.ids import new_memory_id
    from autopersona_flows.memory.index import Scoring
    from autopersona_flows.memory.ingestion import (
        IngestionResult,
        ingest_task_history,
        read_task_records,
        refine_persona,
        refine_trajectory,
        refine_workspace,
    )
    from autopersona_flows.memory.jsonl import JsonlMemoryStore, StrayEntry
    from autopersona_flows.memory.llm_extraction import OpenAICompatibleExtractor
    from autopersona_flows.memory.maintenance import (
        Compactable,
        MaintenanceReport,
        MemoryMerge,
        consolidate_duplicates,
        expire_workspace,
        maintain_user,
        retire_expired,
    )
    from autopersona_flows.memory.persona2web import (
        Persona2WebCase,
        history_to_raw_tasks,
        load_persona2web,
    )
    from autopersona_flows.memory.postgres import PostgresMemoryStore
    from autopersona_flows.memory.protocol import ChangeSet, Erasure, MemoryStore
    from autopersona_flows.memory.provenance import Provenance
    from autopersona_flows.memory.records import (
        LAYERS,
        Embedding,
        JsonValue,
        LayerContent,
        MemoryLayer,
        MemoryRecord,
        PersonaMemory,
        RawTaskRecord,
        TrajectoryMemory,
        WorkspaceMemory,
        as_content,
        content_type,
    )
    from autopersona_flows.memory.reindex import reindex_user
    from autopersona_flows.memory.retrieval import (
        MemoryBundle,
        MemoryRetriever,
        ScoredMemory,
        SearchRequest,
    )
    from autopersona_flows.memory.slots import same_slot
    from autopersona_flows.memory.snapshots import (
        MemoryChange,
        MemorySnapshot,
        read_snapshot,
        write_snapshot,
    )
    from autopersona_flows.memory.stores import open_store
    from autopersona_flows.memory.updates import (
        FunctionResolver,
        HeuristicResolver,
        MemoryUpdater,
        Resolver,
        UpdateDecision,
        embed_records,
    )
    from autopersona_flows.memory.users import check_user_id
    from autopersona_flows.memory.validity import valid_until
else:
    __getattr__, __dir__ = exports(
        __name__,
        {
            "autopersona_flows.memory.bank": ("MemoryBank",),
            "autopersona_flows.memory.chatlog": ("ChatMessage", "chat_sessions"),
            "autopersona_flows.memory.consolidation": ("promote_choices",),
            "autopersona_flows.memory.corrections": (
                "bury_memory",
                "edit_memory",
                "find_memory",
                "forget_memory",
                "unbury_memory",
            ),
            "autopersona_flows.memory.embedders": (
                "Embedder",
                "FunctionEmbedder",
                "HashingEmbedder",
                "MiniLMEmbedder",
                "get_embedder",
            ),
            "autopersona_flows.memory.erasure": ("ErasureReport", "erase_user"),
            "autopersona_flows.memory.extraction": (
                "ExtractedMemory",
                "Extractor",
                "RuleExtractor",
            ),
            "autopersona_flows.memory.ids": ("new_memory_id",),
            "autopersona_flows.memory.index": ("Scoring",),
            "autopersona_flows.memory.ingestion": (
                "IngestionResult",
                "ingest_task_history",
                "read_task_records",
                "refine_persona",
                "refine_trajectory",
                "refine_workspace",
            ),
            "autopersona_flows.memory.jsonl": ("JsonlMemoryStore", "StrayEntry"),
            "autopersona_flows.memory.llm_extraction": ("OpenAICompatibleExtractor",),
            "autopersona_flows.memory.maintenance": (
                "Compactable",
                "MaintenanceReport",
                "MemoryMerge",
                "consolidate_duplicates",
                "expire_workspace",
                "maintain_user",
                "retire_expired",
            ),
            "autopersona_flows.memory.persona2web": (
                "Persona2WebCase",
                "history_to_raw_tasks",
                "load_persona2web",
            ),
            "autopersona_flows.memory.postgres": ("PostgresMemoryStore",),
            "autopersona_flows.memory.protocol": ("ChangeSet", "Erasure", "MemoryStore"),
            "autopersona_flows.memory.provenance": ("Provenance",),
            "autopersona_flows.memory.records": (
                "LAYERS",
                "Embedding",
                "JsonValue",
                "LayerContent",
                "MemoryLayer",
                "MemoryRecord",
                "PersonaMemory",
                "RawTaskRecord",
                "TrajectoryMemory",
                "WorkspaceMemory",
                "as_content",
                "content_type",
            ),
            "autopersona_flows.memory.reindex": ("reindex_user",),
            "autopersona_flows.memory.retrieval": (
                "MemoryBundle",
                "MemoryRetriever",
                "ScoredMemory",
                "SearchRequest",
            ),
            "autopersona_flows.memory.slots": ("same_slot",),
            "autopersona_flows.memory.snapshots": (
                "MemoryChange",
                "MemorySnapshot",
                "read_snapshot",
                "write_snapshot",
            ),
            "autopersona_flows.memory.stores": ("open_store",),
            "autopersona_flows.memory.updates": (
                "FunctionResolver",
                "HeuristicResolver",
                "MemoryUpdater",
                "Resolver",
                "UpdateDecision",
                "embed_records",
            ),
            "autopersona_flows.memory.users": ("check_user_id",),
            "autopersona_flows.memory.validity": ("valid_until",),
        },
    )

__all__ = [
    "LAYERS",
    "ChangeSet",
    "ChatMessage",
    "Compactable",
    "Embedder",
    "Embedding",
    "Erasure",
    "ErasureReport",
    "ExtractedMemory",
    "Extractor",
    "FunctionEmbedder",
    "FunctionResolver",
    "HashingEmbedder",
    "HeuristicResolver",
    "IngestionResult",
    "JsonValue",
    "JsonlMemoryStore",
    "LayerContent",
    "MaintenanceReport",
    "MemoryBank",
    "MemoryBundle",
    "MemoryChange",
    "MemoryLayer",
    "MemoryMerge",
    "MemoryRecord",
    "MemoryRetriever",
    "MemorySnapshot",
    "MemoryStore",
    "MemoryUpdater",
    "MiniLMEmbedder",
    "OpenAICompatibleExtractor",
    "Persona2WebCase",
    "PersonaMemory",
    "PostgresMemoryStore",
    "Provenance",
    "RawTaskRecord",
    "Resolver",
    "RuleExtractor",
    "ScoredMemory",
    "Scoring",
    "SearchRequest",
    "StrayEntry",
    "TrajectoryMemory",
    "UpdateDecision",
    "WorkspaceMemory",
    "as_content",
    "bury_memory",
    "chat_sessions",
    "check_user_id",
    "consolidate_duplicates",
    "content_type",
    "edit_memory",
    "embed_records",
    "erase_user",
    "expire_workspace",
    "find_memory",
    "forget_memory",
    "get_embedder",
    "history_to_raw_tasks",
    "ingest_task_history",
    "load_persona2web",
    "maintain_user",
    "new_memory_id",
    "open_store",
    "promote_choices",
    "read_snapshot",
    "read_task_records",
    "refine_persona",
    "refine_trajectory",
    "refine_workspace",
    "reindex_user",
    "retire_expired",
    "same_slot",
    "unbury_memory",
    "valid_until",
    "write_snapshot",
]
