"""Task graphs: nodes with tools, dependencies and requirements, in a checked order."""

from __future__ import annotations

import heapq
import importlib
import re
from collections.abc import Callable, Sequence
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    field_validator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from autopersona_flows.agent.decisions import Requirement
from autopersona_flows.errors import GraphError
from autopersona_flows.flows.options import DEFAULT_TASK_OPTIONS, PersonaTaskOptions
from autopersona_flows.flows.settings import load_settings

__all__ = ["GraphSpec", "NodeSpec", "TaskGraph", "TaskNode", "resolve_tool"]

_CYCLE_SHOWN = 10  # nodes of a cycle an error names; a generated graph's may have thousands
# ASCII classes rather than \w, and no \Z: these patterns also go into the run form's
# JSON schema, which the UI checks in ECMA regex and the server in Python's. Python
# code matches them with fullmatch, as `$` alone would let a trailing newline through.
_NODE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_MODULE = re.compile(rf"{_NAME}(?:\.{_NAME})*")
_IMPORT_PATH = re.compile(rf"^{_NAME}(?:\.{_NAME})*:{_NAME}$")
_ATTRIBUTE_PATH = re.compile(rf"^{_NAME}(?:\.{_NAME})*:{_NAME}(?:\.{_NAME})+$")
_Seconds = Annotated[float, Field(ge=0)]
_TOOL_MODULES = "PREFECT_INTEGRATIONS_AUTOPERSONA_TOOL_MODULES"


def _node_id(value: Any) -> Any:
    if isinstance(value, str) and not _NODE_ID.fullmatch(value):
        raise ValueError(
            f"node id {value!r} must start with a letter or digit and hold only letters, "
            "digits, '_', '.' and '-' (at most 100 characters)"
        )
    return value


# The pattern goes into the run form's schema; the before-validator, which wraps it,
# runs first to say what is wrong in words.
_NodeId = Annotated[str, Field(pattern=_NODE_ID.pattern), BeforeValidator(_node_id)]


def _import_path_problem(path: str) -> str | None:
    """Why ``path`` is not ``"package.module:function"``, or None if it is."""
    if _IMPORT_PATH.fullmatch(path):
        return None
    if _ATTRIBUTE_PATH.fullmatch(path):
        # getattr along a dotted path leaves the module: 'json:codecs.sys.exit' is
        # sys.exit, reached through the modules json imports.
        return (
            f"tool {path!r} must be 'package.module:function': after ':' comes one "
            "function of the module, not a dotted path through what it imports"
        )
    return f"tool {path!r} is not an import path 'package.module:function'"


def _tool_path(value: Any) -> Any:
    if isinstance(value, str) and (problem := _import_path_problem(value)):
        raise ValueError(problem)
    return value


def _tool(value: Any) -> Any:
    if not isinstance(value, str) and not callable(value):
        raise ValueError(f"tool must be a callable or an import path, got {type(value).__name__}")
    return _tool_path(value)


def resolve_tool(
    tool: Callable[..., Any] | str, *, allowed: Callable[[str], bool] | None = None
) -> Callable[..., Any]:
    """Return the callable a node's ``tool`` names.

    Args:
        tool: A callable, returned as it is, or an import path
            ``"package.module:function"`` (one name after the colon, no dots).
        allowed: Whether a module, by its dotted name, may provide tools; any may if
            None. The path's module is checked before it is imported, and the module
            the callable is defined in (its ``__module__``) after: a function merely
            imported into an allowed module (``from os import system``) is refused.

    Raises:
        GraphError: If an import path is malformed, names a module `allowed`
            refuses, does not lead to a callable, or leads to one defined in a
            module `allowed` refuses.
    """
    if not isinstance(tool, str):
        return tool
    if problem := _import_path_problem(tool):
        raise GraphError(problem)
    module_name, _, name = tool.partition(":")
    if allowed is not None and not allowed(module_name):
        raise GraphError(f"tool {tool!r} is outside the allowed tool modules")
    try:
        target: Any = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as exc:
        raise GraphError(f"cannot import tool {tool!r}: {exc}") from exc
    if not callable(target):
        raise GraphError(f"tool {tool!r} is a {type(target).__name__}, not a callable")
    if allowed is not None:
        home = getattr(target, "__module__", None)
        if not isinstance(home, str) or not allowed(home):
            raise GraphError(
                f"tool {tool!r} is defined in {home!r}, outside the allowed tool modules: "
                f"a tool must be defined in an allowed module, not only imported into one "
                f"({module_name!r})"
            )
    return target


def import_path(tool: Callable[..., Any] | str, node_id: str) -> str:
    """The path a process of a task runner imports ``tool`` by (see `resolve_tool`).

    Raises:
        GraphError: If ``tool`` cannot be imported by a path that leads back to it
            (a nested function, a lambda, a method, a callable object).
    """
    if isinstance(tool, str):
        return tool
    path = f"{getattr(tool, '__module__', None)}:{getattr(tool, '__qualname__', None)}"
    try:
        found = resolve_tool(path)
    except GraphError:
        found = None
    if found is not tool:
        raise GraphError(
            f"the tool of {node_id!r} ({tool!r}) cannot be imported by path ({path!r}): a "
            "task runner of other "
            "processes (Dask, a process pool) imports each tool there; define it at the top "
            "level of a module"
        )
    return path


class TaskNode(BaseModel):
    """One step of a task graph.

    Attributes:
        id: Unique within the graph; names the step's Prefect task.
        instruction: What the step does, in words (the PersonaAgent reads it).
        tool: The function that does it, or its import path ``"package.module:function"``
            (an import path keeps the graph serialisable, e.g. for deployments).
        depends_on: Ids of the nodes whose outputs this one needs.
        requires: What the step must know about the person before it runs.
        retries: How often Prefect retries the tool when it raises.
        retry_delay_seconds: Seconds to wait before each retry (one number, or one per
            retry); Prefect's default if None.
        timeout_seconds: Fails the step after this long. Reliable for an ``async def``
            tool; a sync one (in a worker thread) is stopped only after a blocking call
            returns.
        tags: Prefect tags of the step's run task (tag concurrency limits apply).
    """

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    id: _NodeId
    instruction: str = ""
    tool: Annotated[Any, AfterValidator(_tool)]
    depends_on: list[_NodeId] = Field(default_factory=list, json_schema_extra={"uniqueItems": True})
    requires: list[Requirement] = Field(default_factory=list)
    retries: Annotated[int, Field(ge=0)] = 0
    retry_delay_seconds: _Seconds | Annotated[list[_Seconds], Field(max_length=50)] | None = None
    timeout_seconds: Annotated[float, Field(gt=0)] | None = None
    tags: list[str] = Field(default_factory=list)

    @field_validator("depends_on")
    @classmethod
    def _no_repeats(cls, depends_on: list[str]) -> list[str]:
        if len(set(depends_on)) != len(depends_on):
            raise ValueError(f"depends_on repeats a node: {depends_on}")
        return depends_on

    def task_options(self) -> PersonaTaskOptions:
        """The Prefect options of the node's run task."""
        options: PersonaTaskOptions = {"retries": self.retries}
        if self.retry_delay_seconds is not None:
            options["retry_delay_seconds"] = self.retry_delay_seconds
        if self.timeout_seconds is not None:
            options["timeout_seconds"] = self.timeout_seconds
        if self.tags:
            options["tags"] = self.tags
        return DEFAULT_TASK_OPTIONS | options


def _allowed_modules() -> list[str] | None:
    """The modules the settings allow tools from (see `AutopersonaSettings`); None: any."""
    modules = load_settings().tool_modules
    if modules is None:
        return None
    return [name.strip() for name in modules.split(",") if name.strip()]


class _AllowedToolsPattern:
    """Narrows a tool's pattern in the run form's schema to the allowed tool modules.

    Read when the schema is written, which for a deployment is ``prefect deploy``:
    its environment decides; without ``TOOL_MODULES`` there, any module's path passes
    the form and the worker's own setting refuses it when the run starts.
    """

    def __get_pydantic_json_schema__(
        self, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        schema = handler(core_schema)
        modules = _allowed_modules()
        if modules is not None:
            # A name that is no module cannot match a path; (?!) matches nothing.
            names = [name.replace(".", r"\.") for name in modules if _MODULE.fullmatch(name)]
            schema["pattern"] = rf"^(?:{'|'.join(names) or '(?!)'})(?:\.{_NAME})*:{_NAME}$"
            schema["description"] = (
                f"'package.module:function', from {', '.join(modules) or 'no module'} "
                "or a submodule (the tool modules of this deployment)"
            )
        return schema


class NodeSpec(TaskNode):
    """A `TaskNode` whose tool is an import path, so the node is plain data.

    Attributes:
        tool: ``"package.module:function"``, importable where the run executes.
    """

    tool: Annotated[
        str,
        Field(pattern=_IMPORT_PATH.pattern, examples=["examples.paper_tools:draft"]),
        BeforeValidator(_tool_path),  # says what is wrong in words, before the pattern does
        _AllowedToolsPattern(),
    ]


class GraphSpec(BaseModel):
    """A task graph as data: the typed form a deployment's run takes.

    Built, it is a well-formed graph whose tools come from the allowed modules
    (``PREFECT_INTEGRATIONS_AUTOPERSONA_TOOL_MODULES`` where it is built, i.e. the
    worker for a deployment's run), so a malformed graph fails Prefect's parameter
    check when a run starts, before any code of the run. The run form's JSON schema
    says what a schema can (node id and tool patterns, tools from the allowed modules
    where ``prefect deploy`` runs, no repeated dependency); a cycle, an unknown
    dependency or a repeated node id it cannot.

    Attributes:
        nodes: The nodes, in declaration order.

    Raises:
        pydantic.ValidationError: On a malformed node, a tool outside the allowed
            modules (named without importing it), a duplicate id, a dependency on an
            unknown node or on itself, or a cycle; the message names the nodes.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    nodes: list[NodeSpec] = Field(min_length=1)

    @field_validator("nodes")
    @classmethod
    def _well_formed(cls, nodes: list[NodeSpec]) -> list[NodeSpec]:
        settings = load_settings()
        for node in nodes:
            if not settings.allows_tool(node.tool):  # by name: nothing is imported
                raise ValueError(
                    f"node {node.id!r} names tool {node.tool!r}, outside the allowed modules "
                    f"{settings.tool_modules!r} ({_TOOL_MODULES})"
                )
        TaskGraph(nodes)  # its GraphError is a ValueError, reported as pydantic's
        return nodes

    def to_graph(self) -> TaskGraph:
        """The checked graph."""
        return TaskGraph(self.nodes)


class TaskGraph:
    """A validated graph of task nodes and the order to run them in.

    The order is topological and deterministic: among nodes that are ready at the
    same time, the one declared first comes first. Nodes that do not depend on
    each other (directly or not) may run concurrently.

    Args:
        nodes: The nodes, in declaration order.

    Raises:
        GraphError: On an empty graph, a duplicate id, a dependency on an unknown
            node or on itself, or a cycle; the message names the nodes (for a cycle:
            one cycle, its first ten nodes if longer, and how many nodes it holds up).
    """

    def __init__(self, nodes: Sequence[TaskNode]) -> None:
        nodes = list(nodes)
        if not nodes:
            raise GraphError("a task graph needs at least one node")
        self.nodes: dict[str, TaskNode] = {}
        for node in nodes:
            if not isinstance(node, TaskNode):
                raise GraphError(f"graph nodes must be TaskNode, got {type(node).__name__}")
            if node.id in self.nodes:
                raise GraphError(f"node id {node.id!r} is used twice")
            self.nodes[node.id] = node
        for node in nodes:
            for dependency in node.depends_on:
                if dependency == node.id:
                    raise GraphError(f"node {node.id!r} depends on itself")
                if dependency not in self.nodes:
                    raise GraphError(f"node {node.id!r} depends on unknown node {dependency!r}")
        self.order: list[str] = self._topological()

    def __repr__(self) -> str:
        return f"TaskGraph({self.order})"

    def __len__(self) -> int:
        return len(self.nodes)

    def _topological(self) -> list[str]:
        position = {node_id: i for i, node_id in enumerate(self.nodes)}
        waiting = {node_id: len(node.depends_on) for node_id, node in self.nodes.items()}
        dependants: dict[str, list[str]] = {node_id: [] for node_id in self.nodes}
        for node in self.nodes.values():
            for dependency in node.depends_on:
                dependants[dependency].append(node.id)
        ready = [(position[n], n) for n, count in waiting.items() if count == 0]
        heapq.heapify(ready)
        order = []
        while ready:
            _, node_id = heapq.heappop(ready)
            order.append(node_id)
            for dependant in dependants[node_id]:
                waiting[dependant] -= 1
                if not waiting[dependant]:
                    heapq.heappush(ready, (position[dependant], dependant))
        if len(order) < len(self.nodes):
            done = set(order)
            stuck = [node_id for node_id in self.nodes if node_id not in done]
            raise GraphError(
                f"the graph has a cycle through {self._cycle(stuck)}; "
                f"{len(stuck)} nodes in all are on a cycle or depend on one"
            )
        return order

    def _cycle(self, stuck: list[str]) -> str:
        """One cycle among the ``stuck`` nodes, e.g. ``'a' -> 'b' -> 'a'``, capped in length.

        Every stuck node depends on another stuck node, so following dependencies
        from any of them must come back to a node already seen.
        """
        remaining = set(stuck)
        seen: dict[str, int] = {}
        path: list[str] = []
        node_id = stuck[0]
        while node_id not in seen:
            seen[node_id] = len(path)
            path.append(node_id)
            node_id = next(d for d in self.nodes[node_id].depends_on if d in remaining)
        cycle = path[seen[node_id] :][::-1]  # dependencies first: the order things would run
        # Start at the node declared first, so the same graph always names the same cycle.
        position = {n: i for i, n in enumerate(stuck)}
        first = min(range(len(cycle)), key=lambda i: position[cycle[i]])
        cycle = cycle[first:] + cycle[:first]
        shown = [repr(n) for n in cycle[:_CYCLE_SHOWN]]
        if len(cycle) > _CYCLE_SHOWN:
            shown.append(f"… ({len(cycle) - _CYCLE_SHOWN} more)")
        return " -> ".join([*shown, repr(cycle[0])])

    def ancestors(self, node_id: str) -> set[str]:
        """Every node ``node_id`` depends on, directly or not."""
        seen: set[str] = set()
        stack = list(self.nodes[node_id].depends_on)
        while stack:
            current = stack.pop()
            if current not in seen:
                seen.add(current)
                stack.extend(self.nodes[current].depends_on)
        return seen
