"""Memory-aware task graphs on Prefect: the only layer of autopersona-flows that imports Prefect.

So far this holds the task graph model; the Prefect flow, its persona pre-hook and
clarification pause come next.
"""

from autopersona_flows.flows.graph import TaskGraph, TaskNode, resolve_tool

__all__ = ["TaskGraph", "TaskNode", "resolve_tool"]
