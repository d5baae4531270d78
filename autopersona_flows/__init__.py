"""autopersona-flows: personalized memory for Prefect 3 workflows.

The memory layer is importable without Prefect; the Prefect integration lives in
``autopersona_flows.flows``.
"""

from autopersona_flows.errors import (
    AutopersonaError,
    DuplicateMemoryError,
    InvalidUserIdError,
    MemoryNotFoundError,
    MemoryStoreCorruptionError,
    MemoryStoreError,
    SnapshotError,
)
from autopersona_flows.memory import (
    LAYERS,
    Embedding,
    JsonlMemoryStore,
    MemoryChange,
    MemoryLayer,
    MemoryRecord,
    MemorySnapshot,
    MemoryStore,
    PersonaMemory,
    RawTaskRecord,
    TrajectoryMemory,
    WorkspaceMemory,
)

__version__ = "0.1.0"

__all__ = [
    "LAYERS",
    "AutopersonaError",
    "DuplicateMemoryError",
    "Embedding",
    "InvalidUserIdError",
    "JsonlMemoryStore",
    "MemoryChange",
    "MemoryLayer",
    "MemoryNotFoundError",
    "MemoryRecord",
    "MemorySnapshot",
    "MemoryStore",
    "MemoryStoreCorruptionError",
    "MemoryStoreError",
    "PersonaMemory",
    "RawTaskRecord",
    "SnapshotError",
    "TrajectoryMemory",
    "WorkspaceMemory",
    "__version__",
]
