"""A settled node as its run task receives it, and the run task itself.

Settling a node (see `settle`) ends in one `NodeCall`: the node, the request it was
decided on, the decision and the answers. It is dumped to JSON once, as the run
task's keyed parameter (`NodeCall.parameters`), and read back once, in the run task
(`run_task`), which builds the tool's `NodeContext` from it and calls the tool. The
run task receives the call and the tool, nothing else: it never decides, and it
holds nothing of what submitted it. Its result is the tool's output and which
attempt produced it, ``{"output": ..., "attempt": n}`` (see `_finished`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prefect import Task
from prefect.context import TaskRunContext
from prefect.utilities.annotations import opaque, quote
from pydantic import BaseModel, ConfigDict, Field

from autopersona_flows import _json
from autopersona_flows.agent.decisions import (
    ClarifyDecision,
    FinalDecision,
    NodeInfo,
    PersonaDecision,
    Requirement,
)
from autopersona_flows.errors import NodeOutputError
from autopersona_flows.flows.arguments import ToolArguments
from autopersona_flows.flows.context import AnsweredQuestion, NodeContext
from autopersona_flows.flows.graph import resolve_tool
from autopersona_flows.flows.options import PersonaTaskOptions, RunName, build_task
from autopersona_flows.memory.records import LAYERS, JsonValue, check_json

__all__ = [
    "NodeCall",
    "RunTool",
    "as_json",
    "is_async",
    "json_output",
    "run_task",
    "summarise",
]

_EMBEDDINGS: dict[str, Any] = {
    "memories": {layer: {"__all__": {"record": {"embedding"}}} for layer in LAYERS}
}
"""What a decision's JSON leaves out: embeddings would only weigh down every stored
result and cache key."""


class NodeCall(BaseModel):
    """A settled node: everything its tool's run depends on but its upstream results.

    Attributes:
        node: The node as the agent was told of it.
        user_id: Whose memory was consulted.
        query: The user's request.
        requirements: What the node must know.
        decision: The decision it runs with.
        answers: The questions answered for it, in order.
        tools: The graph's node ids, as the agent was told of them.
        element: A `persona_task` element's index in a ``.map()``.
        tool: The tool's import path, for a runner of other processes.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    node: NodeInfo
    user_id: str
    query: str
    requirements: list[Requirement] = Field(default_factory=list)
    decision: PersonaDecision
    answers: list[AnsweredQuestion] = Field(default_factory=list)
    tools: list[str] = Field(default_factory=list)
    element: int | None = None
    tool: str | None = None

    def parameters(
        self,
        upstream: dict[str, Any],
        *,
        arguments: dict[str, Any] | None = None,
        elsewhere: bool = False,
    ) -> dict[str, Any]:
        """The run task's parameters besides the tool: this call as JSON, and what Prefect resolves.

        ``inputs`` is the call, dumped here once (quoted: Prefect would walk every
        item of it on each submit and run); ``resolved`` holds the upstream results
        (their futures, `opaque` so Prefect does not walk them once resolved) and a
        `persona_task`'s arguments. The key is of the two together (see
        `NodeCachePolicy`). On a runner of other processes everything is plain
        (Dask sends Prefect's annotations, tuples, as lists).
        """
        left_out: dict[str, Any] = {"decision": _EMBEDDINGS}
        left_out |= {name: True for name in ("element", "tool") if getattr(self, name) is None}
        inputs = as_json(self, exclude=left_out)
        if elsewhere:
            return {"inputs": inputs, "resolved": {"inputs": upstream}}
        resolved: dict[str, Any] = {"inputs": {name: opaque(f) for name, f in upstream.items()}}
        if arguments is not None:
            resolved["arguments"] = arguments
        return {"inputs": quote(inputs), "resolved": resolved}

    def context(self, upstream: dict[str, Any]) -> NodeContext:
        """The `NodeContext` the tool receives, given its upstream runs' results."""
        return NodeContext.build(
            node=self.node,
            user_id=self.user_id,
            query=self.query,
            decision=self.decision,
            answers=self.answers,
            inputs={name: run["output"] for name, run in upstream.items()},
            tools=self.tools,
            declared=[requirement.name for requirement in self.requirements],
        )


@dataclass(frozen=True, slots=True)
class RunTool:
    """The run task's parameter outside its key: the function it calls.

    Attributes:
        fn: The function (sync or ``async def``).
        arguments: A `persona_task`'s arguments, whose run returns the output alone;
            None for a graph node's tool, called with its context only.
    """

    fn: Callable[..., Any]
    arguments: ToolArguments | None = None


def as_json(model: BaseModel, *, exclude: dict[str, Any] | None = None) -> Any:
    """``model`` as JSON values: what keys a step (a request, an answer) and a run (a call)."""
    return _json.loads(model.model_dump_json(exclude=exclude))


def is_async(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` is an ``async def`` function (or a callable whose ``__call__`` is)."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - the method, not whether it is callable
    )


# The run tasks' functions: short on purpose, as Prefect reads and hashes a task
# function's source whenever a task is built from it. ``episode_id`` and ``node_id``
# only key the task (see `NodeCachePolicy`); ``tool`` is outside the key, quoted.
def _run(
    episode_id: str, node_id: str, inputs: dict[str, Any], resolved: dict[str, Any], tool: RunTool
) -> Any:
    call, context, (args, kwargs) = _started(inputs, resolved, tool)
    return _finished(call, tool, _sync_output(node_id, tool.fn(context, *args, **kwargs)))


async def _arun(
    episode_id: str, node_id: str, inputs: dict[str, Any], resolved: dict[str, Any], tool: RunTool
) -> Any:
    call, context, (args, kwargs) = _started(inputs, resolved, tool)
    return _finished(call, tool, await tool.fn(context, *args, **kwargs))


# On a runner of other processes the tool is imported there, by the path in the call.
def _run_elsewhere(
    episode_id: str, node_id: str, inputs: dict[str, Any], resolved: dict[str, Any]
) -> Any:
    tool = RunTool(resolve_tool(inputs["tool"]))
    return _run(episode_id, node_id, inputs, resolved, tool)


async def _arun_elsewhere(
    episode_id: str, node_id: str, inputs: dict[str, Any], resolved: dict[str, Any]
) -> Any:
    tool = RunTool(resolve_tool(inputs["tool"]))
    return await _arun(episode_id, node_id, inputs, resolved, tool)


def run_task(
    node_id: str,
    fn: Callable[..., Any],
    storage: Any,
    options: PersonaTaskOptions,
    *,
    elsewhere: bool = False,
    locked: bool = True,
) -> Task:
    """The Prefect task that runs a node's tool from its `NodeCall`.

    Args:
        node_id: The node.
        fn: Its tool; an ``async def`` one gets an async task, which awaits it.
        storage: Where its result is persisted (see `PersonaRuntime.result_storage`).
        options: The task's Prefect options.
        elsewhere: For a runner of other processes: the tool is imported there.
        locked: Whether two runs of its episode may run it at once (see `build_task`).
    """
    run_name = RunName(node_id, options.get("task_run_name"))
    body: Callable[..., Any]
    if elsewhere:
        body = _arun_elsewhere if is_async(fn) else _run_elsewhere
    else:
        body = _arun if is_async(fn) else _run
    return build_task(body, "run", node_id, storage, options, run_name=run_name, locked=locked)


def _started(
    inputs: dict[str, Any], resolved: dict[str, Any], tool: RunTool
) -> tuple[NodeCall, NodeContext, tuple[tuple[Any, ...], dict[str, Any]]]:
    """The call read back, the tool's context, and the function's arguments."""
    call = NodeCall.model_validate(inputs)
    arguments: tuple[tuple[Any, ...], dict[str, Any]] = ((), {})
    if tool.arguments is not None:
        # Resolved by Prefect by now, futures and all; checked before the tool runs.
        tool.arguments.check(resolved["arguments"], resolved=True)
        arguments = tool.arguments.call(resolved["arguments"])
    return call, call.context(resolved["inputs"]), arguments


def _finished(call: NodeCall, tool: RunTool, output: Any) -> Any:
    """What the run task returns: a `persona_task`'s output alone, or a graph node's run.

    A graph node's run is ``{"output": ..., "attempt": n}``: the tool's output (a JSON
    value) and the attempt that produced it, 1 for the first run, 2 for its first
    retry, and so on: a run's tools executed as many times as the attempts of its
    runs not cached.
    """
    output = json_output(output, f"the output of {call.node.id!r}")
    if tool.arguments is not None:
        return output
    task_run = TaskRunContext.get()
    attempt = task_run.task_run.run_count if task_run is not None else 1
    return {"output": output, "attempt": max(attempt, 1)}


def json_output(value: Any, what: str) -> JsonValue:
    """Return ``value`` if it is a JSON value (it may become part of a cache key).

    Raises:
        NodeOutputError: If it is not.
    """
    try:
        return check_json(value)
    except ValueError as exc:
        raise NodeOutputError(f"{what} must be JSON values: {exc}") from None


def _sync_output(node_id: str, output: Any) -> Any:
    """A sync tool's ``output``, refused if it is an awaitable (the tool is not ``async def``)."""
    if inspect.isawaitable(output):
        if inspect.iscoroutine(output):
            output.close()  # never awaited, on purpose
        raise NodeOutputError(
            f"the tool of {node_id!r} returned an awaitable: declare it `async def` so its "
            "run task awaits it"
        )
    return output


def summarise(
    decision: FinalDecision | ClarifyDecision, answers: list[AnsweredQuestion]
) -> dict[str, Any]:
    """What a run reports of a decision: the action, the constraints, the questions answered."""
    summary: dict[str, Any] = {
        "action": decision.action,
        "constraints": [
            {"text": c.text, "memory_id": c.memory_id, "score": round(c.score, 3)}
            for c in getattr(decision, "constraints", [])
        ],
    }
    if isinstance(decision, ClarifyDecision):
        summary["question"] = decision.question
    if answers:
        summary["answers"] = [
            {"question": a.question, "requirement": a.requirement, "answer": a.answer}
            | ({"default": True} if a.source == "default" else {})
            for a in answers
        ]
    return summary
