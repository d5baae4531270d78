"""autopersona-flows: personalized memory for Prefect 3 workflows.

What a user types is here: a `MemoryBank` and a `PersonaAgent` over it, a
`TaskGraph` of `TaskNode` objects run by `run_persona_graph` (or a `persona_task`
inside a `persona_runtime`), the answers to its questions, and the errors worth
catching. Each name lives in the subpackage that defines it, with the less common
ones: ``autopersona_flows.memory`` and ``autopersona_flows.agent`` (no Prefect),
``autopersona_flows.flows`` (the Prefect integration), ``autopersona_flows.errors``
(the whole error tree), ``autopersona_flows.testing`` (fakes for your tests).

Every name is imported on first use (see ``autopersona_flows/_lazy.py``):
``import autopersona_flows`` loads none of them, a user of the memory layer never
loads the agent, and Prefect loads with the first name of the flows.
"""

from typing import TYPE_CHECKING

from autopersona_flows._lazy import exports

if TYPE_CHECKING:
    from autopersona_flows.agent import (
        ClarifyDecision,
        EvidencePolicy,
        FinalDecision,
        NodeInfo,
        PersonaAgent,
        PersonaDecision,
        PersonaRequest,
        Policy,
        Requirement,
    )
    from autopersona_flows.errors import (
        AnswerRejectedError,
        AutopersonaError,
        ClarificationBudgetError,
        ClarificationTimeoutError,
        ConfigurationError,
        GraphError,
        InvalidUserIdError,
        MemoryNotFoundError,
        MemoryStoreCorruptionError,
        MemoryStoreError,
        PolicyError,
        StoreUnavailableError,
    )
    from autopersona_flows.flows import (
        NodeContext,
        PersonaRuntime,
        RequirementValue,
        TaskGraph,
        TaskNode,
        answer,
        answer_clarification,
        apersona_graph,
        arun_persona_graph,
        ask_first,
        pending_clarifications,
        persona_graph,
        persona_runtime,
        persona_task,
        run_persona_graph,
    )
    from autopersona_flows.memory import (
        Embedder,
        HashingEmbedder,
        JsonlMemoryStore,
        MemoryBank,
        MemoryRecord,
        MemoryStore,
        PersonaMemory,
        PostgresMemoryStore,
        RawTaskRecord,
        SearchRequest,
        TrajectoryMemory,
        WorkspaceMemory,
    )
else:
    __getattr__, __dir__ = exports(
        __name__,
        {
            "autopersona_flows.agent": (
                "ClarifyDecision",
                "EvidencePolicy",
                "FinalDecision",
                "NodeInfo",
                "PersonaAgent",
                "PersonaDecision",
                "PersonaRequest",
                "Policy",
                "Requirement",
            ),
            "autopersona_flows.errors": (
                "AnswerRejectedError",
                "AutopersonaError",
                "ClarificationBudgetError",
                "ClarificationTimeoutError",
                "ConfigurationError",
                "GraphError",
                "InvalidUserIdError",
                "MemoryNotFoundError",
                "MemoryStoreCorruptionError",
                "MemoryStoreError",
                "PolicyError",
                "StoreUnavailableError",
            ),
            "autopersona_flows.flows": (
                "NodeContext",
                "PersonaRuntime",
                "RequirementValue",
                "TaskGraph",
                "TaskNode",
                "answer",
                "answer_clarification",
                "apersona_graph",
                "arun_persona_graph",
                "ask_first",
                "pending_clarifications",
                "persona_graph",
                "persona_runtime",
                "persona_task",
                "run_persona_graph",
            ),
            "autopersona_flows.memory": (
                "Embedder",
                "HashingEmbedder",
                "JsonlMemoryStore",
                "MemoryBank",
                "MemoryRecord",
                "MemoryStore",
                "PersonaMemory",
                "PostgresMemoryStore",
                "RawTaskRecord",
                "SearchRequest",
                "TrajectoryMemory",
                "WorkspaceMemory",
            ),
        },
        # Re-exported here in 0.1: code written then still runs, with a DeprecationWarning.
        moved={
            "autopersona_flows.agent": ("Constraint", "RuntimeMetrics"),
            "autopersona_flows.errors": (
                "DuplicateMemoryError",
                "EmbedderError",
                "EmbeddingMismatchError",
                "EvaluationError",
                "ExtractionError",
                "IngestionError",
                "ResolverError",
                "RetrievalError",
                "SnapshotError",
                "UnsafeLinkError",
            ),
            "autopersona_flows.memory": (
                "MemoryBundle",
                "MemoryChange",
                "MemoryLayer",
                "MemoryRetriever",
                "MemorySnapshot",
                "MemoryUpdater",
                "Resolver",
                "ScoredMemory",
                "UpdateDecision",
                "ingest_task_history",
            ),
            "autopersona_flows.memory.records": ("LAYERS", "Embedding"),
        },
    )

__version__ = "0.1.0"

__all__ = [
    "AnswerRejectedError",
    "AutopersonaError",
    "ClarificationBudgetError",
    "ClarificationTimeoutError",
    "ClarifyDecision",
    "ConfigurationError",
    "Embedder",
    "EvidencePolicy",
    "FinalDecision",
    "GraphError",
    "HashingEmbedder",
    "InvalidUserIdError",
    "JsonlMemoryStore",
    "MemoryBank",
    "MemoryNotFoundError",
    "MemoryRecord",
    "MemoryStore",
    "MemoryStoreCorruptionError",
    "MemoryStoreError",
    "NodeContext",
    "NodeInfo",
    "PersonaAgent",
    "PersonaDecision",
    "PersonaMemory",
    "PersonaRequest",
    "PersonaRuntime",
    "Policy",
    "PolicyError",
    "PostgresMemoryStore",
    "RawTaskRecord",
    "Requirement",
    "RequirementValue",
    "SearchRequest",
    "StoreUnavailableError",
    "TaskGraph",
    "TaskNode",
    "TrajectoryMemory",
    "WorkspaceMemory",
    "__version__",
    "answer",
    "answer_clarification",
    "apersona_graph",
    "arun_persona_graph",
    "ask_first",
    "pending_clarifications",
    "persona_graph",
    "persona_runtime",
    "persona_task",
    "run_persona_graph",
]
