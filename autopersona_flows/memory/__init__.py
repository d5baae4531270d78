"""The three-layer memory bank: typed records and durable per-user stores.

This package never imports Prefect, so ``import autopersona_flows.memory`` stays fast.
"""

from autopersona_flows.memory.ids import new_memory_id
from autopersona_flows.memory.jsonl import JsonlMemoryStore
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
    content_type,
)
from autopersona_flows.memory.snapshots import (
    MemoryChange,
    MemorySnapshot,
    read_snapshot,
    write_snapshot,
)
from autopersona_flows.memory.users import check_user_id

__all__ = [
    "LAYERS",
    "ChangeSet",
    "Embedding",
    "JsonValue",
    "JsonlMemoryStore",
    "LayerContent",
    "MemoryChange",
    "MemoryLayer",
    "MemoryRecord",
    "MemorySnapshot",
    "MemoryStore",
    "PersonaMemory",
    "RawTaskRecord",
    "TrajectoryMemory",
    "WorkspaceMemory",
    "check_user_id",
    "content_type",
    "new_memory_id",
    "read_snapshot",
    "write_snapshot",
]
