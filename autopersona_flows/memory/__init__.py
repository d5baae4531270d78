"""The three-layer memory bank: typed records and durable per-user stores.

This package never imports Prefect, so ``import autopersona_flows.memory`` stays fast.
"""

from autopersona_flows.memory.chatlog import ChatMessage, chat_sessions
from autopersona_flows.memory.consolidation import promote_choices
from autopersona_flows.memory.embedders import (
    Embedder,
    FunctionEmbedder,
    HashingEmbedder,
    MiniLMEmbedder,
    get_embedder,
)
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
from autopersona_flows.memory.jsonl import JsonlMemoryStore
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
from autopersona_flows.memory.protocol import ChangeSet, MemoryStore
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

__all__ = [
    "LAYERS",
    "ChangeSet",
    "ChatMessage",
    "Compactable",
    "Embedder",
    "Embedding",
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
    "RawTaskRecord",
    "Resolver",
    "RuleExtractor",
    "ScoredMemory",
    "Scoring",
    "SearchRequest",
    "TrajectoryMemory",
    "UpdateDecision",
    "WorkspaceMemory",
    "as_content",
    "chat_sessions",
    "check_user_id",
    "consolidate_duplicates",
    "content_type",
    "embed_records",
    "expire_workspace",
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
    "valid_until",
    "write_snapshot",
]


def __getattr__(name: str) -> object:
    # Lazily: PostgresMemoryStore needs the postgres extra, the rest of the package does not.
    if name == "PostgresMemoryStore":
        from autopersona_flows.memory.postgres import PostgresMemoryStore  # noqa: PLC0415

        return PostgresMemoryStore
    # Lazily: only the LLM extractor needs an HTTP client (httpx); the rest of the layer does not.
    if name == "OpenAICompatibleExtractor":
        from autopersona_flows.memory.llm_extraction import (  # noqa: PLC0415
            OpenAICompatibleExtractor,
        )

        return OpenAICompatibleExtractor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
