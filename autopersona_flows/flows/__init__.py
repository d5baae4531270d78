"""Memory-aware task graphs on Prefect: the only layer of autopersona-flows that imports Prefect.

Before each node a PersonaAgent decides; a clarification pauses (or suspends) the
run with a typed form answered in the Prefect UI; every step is cached so a
resumed run repeats no tool call. What running a graph or a persona task takes
(`TaskGraph`, `run_persona_graph`, `persona_task`, ...) is also at the top level,
``autopersona_flows``; this namespace adds deployments, settings and upkeep flows.
Names other than `OrjsonSerializer` are imported on first use (see
``autopersona_flows/_lazy.py``).
"""

from typing import TYPE_CHECKING

from autopersona_flows._lazy import exports

# Not lazy: Prefect imports this package as a collection (the entry point in
# pyproject.toml) so that a process reading our results knows their serializer, and
# defining OrjsonSerializer is what registers it with Prefect.
from autopersona_flows.flows.serializers import OrjsonSerializer

if TYPE_CHECKING:
    from autopersona_flows.flows.answers import (
        PendingClarification,
        PendingQuestion,
        answer,
        answer_clarification,
        cancel_clarification,
        pending_clarifications,
    )
    from autopersona_flows.flows.cache_policies import NodeCachePolicy, node_cache_key
    from autopersona_flows.flows.context import AnsweredQuestion, NodeContext, RequirementValue
    from autopersona_flows.flows.decorators import PersonaTask, ask_first, persona_task
    from autopersona_flows.flows.flow import (
        apersona_graph,
        arun_persona_graph,
        graph_runner,
        persona_graph,
        run_persona_graph,
    )
    from autopersona_flows.flows.graph import GraphSpec, NodeSpec, TaskGraph, TaskNode, resolve_tool
    from autopersona_flows.flows.ingestion import ingest_history
    from autopersona_flows.flows.maintenance import memory_maintenance
    from autopersona_flows.flows.notifications import (
        ClarificationAutomation,
        create_clarification_automation,
        delete_clarification_automation,
        list_clarification_automations,
    )
    from autopersona_flows.flows.options import DEFAULT_TASK_OPTIONS, PersonaTaskOptions
    from autopersona_flows.flows.review import memory_review
    from autopersona_flows.flows.runtime import (
        PersonaRuntime,
        persona_runtime,
        runtime_from_settings,
    )
    from autopersona_flows.flows.settings import AutopersonaSettings, store_from_settings
else:
    __getattr__, __dir__ = exports(
        __name__,
        {
            "autopersona_flows.flows.answers": (
                "PendingClarification",
                "PendingQuestion",
                "answer",
                "answer_clarification",
                "cancel_clarification",
                "pending_clarifications",
            ),
            "autopersona_flows.flows.cache_policies": ("NodeCachePolicy", "node_cache_key"),
            "autopersona_flows.flows.context": (
                "AnsweredQuestion",
                "NodeContext",
                "RequirementValue",
            ),
            "autopersona_flows.flows.decorators": ("PersonaTask", "ask_first", "persona_task"),
            "autopersona_flows.flows.flow": (
                "apersona_graph",
                "arun_persona_graph",
                "graph_runner",
                "persona_graph",
                "run_persona_graph",
            ),
            "autopersona_flows.flows.graph": (
                "GraphSpec",
                "NodeSpec",
                "TaskGraph",
                "TaskNode",
                "resolve_tool",
            ),
            "autopersona_flows.flows.ingestion": ("ingest_history",),
            "autopersona_flows.flows.maintenance": ("memory_maintenance",),
            "autopersona_flows.flows.notifications": (
                "ClarificationAutomation",
                "create_clarification_automation",
                "delete_clarification_automation",
                "list_clarification_automations",
            ),
            "autopersona_flows.flows.options": ("DEFAULT_TASK_OPTIONS", "PersonaTaskOptions"),
            "autopersona_flows.flows.review": ("memory_review",),
            "autopersona_flows.flows.runtime": (
                "PersonaRuntime",
                "persona_runtime",
                "runtime_from_settings",
            ),
            "autopersona_flows.flows.settings": ("AutopersonaSettings", "store_from_settings"),
        },
    )

__all__ = [
    "DEFAULT_TASK_OPTIONS",
    "AnsweredQuestion",
    "AutopersonaSettings",
    "ClarificationAutomation",
    "GraphSpec",
    "NodeCachePolicy",
    "NodeContext",
    "NodeSpec",
    "OrjsonSerializer",
    "PendingClarification",
    "PendingQuestion",
    "PersonaRuntime",
    "PersonaTask",
    "PersonaTaskOptions",
    "RequirementValue",
    "TaskGraph",
    "TaskNode",
    "answer",
    "answer_clarification",
    "apersona_graph",
    "arun_persona_graph",
    "ask_first",
    "cancel_clarification",
    "create_clarification_automation",
    "delete_clarification_automation",
    "graph_runner",
    "ingest_history",
    "list_clarification_automations",
    "memory_maintenance",
    "memory_review",
    "node_cache_key",
    "pending_clarifications",
    "persona_graph",
    "persona_runtime",
    "persona_task",
    "resolve_tool",
    "run_persona_graph",
    "runtime_from_settings",
    "store_from_settings",
]
