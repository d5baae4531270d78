"""The Prefect flow that runs a task graph for a user, consulting memory before each node."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from collections.abc import Callable
from typing import Any, cast

from prefect import flow
from prefect.artifacts import create_table_artifact
from prefect.context import FlowRunContext
from prefect.futures import PrefectFuture, wait
from prefect.results import ResultRecord
from prefect.task_runners import ThreadPoolTaskRunner

from autopersona_flows.agent.agent import PersonaAgent
from autopersona_flows.agent.decisions import (
    ClarifyDecision,
    FinalDecision,
    NodeInfo,
    PersonaRequest,
)
from autopersona_flows.errors import GraphError, StoreUnavailableError
from autopersona_flows.flows._sync import blocking
from autopersona_flows.flows.context import AnsweredQuestion
from autopersona_flows.flows.early import Early, ask_early
from autopersona_flows.flows.episodes import EpisodeDecisions
from autopersona_flows.flows.graph import GraphSpec, TaskGraph, import_path, resolve_tool
from autopersona_flows.flows.runtime import current_runtime, persona_runtime
from autopersona_flows.flows.settings import load_settings
from autopersona_flows.flows.tasks import (
    NodeSteps,
    StepCounter,
    episode_of,
    node_request,
    summarise,
)
from autopersona_flows.memory.users import check_user_id

__all__ = [
    "apersona_graph",
    "arun_persona_graph",
    "graph_runner",
    "persona_graph",
    "run_persona_graph",
]


@flow(name="persona-graph", validate_parameters=False)
def persona_graph(
    graph: TaskGraph, user_id: str, query: str, episode_id: str | None = None
) -> dict[str, Any]:
    """Run ``graph`` for ``user_id``: before each node the PersonaAgent decides.

    A final decision runs the node's tool with its `NodeContext`; a clarification
    asks the person through the Prefect UI (pause or suspend), learns the answer
    and runs the node with it. Independent nodes run concurrently on the flow's
    task runner. Every step is cached by episode, node and inputs, so a resumed
    run repeats no tool call.

    Args:
        graph: The task graph.
        user_id: Whose memory to consult.
        query: The user's request.
        episode_id: Ties cache keys to an episode; the flow run's id by default. Pass
            a stable one to make a retry as a new run replay completed nodes.

    Returns:
        ``outputs`` per node, the ``decisions`` taken, and run ``metrics``.
    """
    return _run_graph(graph, user_id, query, episode_id)


@flow(name="persona-graph-async", validate_parameters=False)
async def apersona_graph(
    graph: TaskGraph, user_id: str, query: str, episode_id: str | None = None
) -> dict[str, Any]:
    """`persona_graph` as an async flow, for async code (and without a sync flow's ~1 s end).

    The same body, run in a worker thread: it waits for run tasks and may pause for
    an answer, and the event loop stays free meanwhile. Tools may be sync or
    ``async def`` in either flow.

    Args:
        graph: The task graph.
        user_id: Whose memory to consult.
        query: The user's request.
        episode_id: See `persona_graph`.

    Returns:
        As `persona_graph`.
    """
    return await asyncio.to_thread(_run_graph, graph, user_id, query, episode_id)


@flow(name="persona-graph-runner")
def graph_runner(
    graph: GraphSpec, user_id: str, query: str, episode_id: str | None = None
) -> dict[str, Any]:
    """Run a graph given as data: the deployable twin of `persona_graph`.

    Its parameters are a typed form in the Prefect UI, so a person can start a run
    there; its tools are import paths resolved where the run executes. With no
    `persona_runtime` block (a deployment run), the agent and options come from
    `AutopersonaSettings`, whose ``tool_modules`` limits where tools may come from.

    Args:
        graph: The nodes, with tool import paths, dependencies and requirements.
        user_id: Whose memory to consult.
        query: The user's request.
        episode_id: See `persona_graph`.

    Returns:
        As `persona_graph`.

    Raises:
        GraphError: If the graph is malformed or names a tool outside ``tool_modules``
            (no module outside them is imported, no tool run), or one defined outside
            them and imported into one (no tool is run).
    """
    settings = load_settings()
    for node in graph.nodes:
        if not settings.allows_tool(node.tool):
            raise GraphError(
                f"node {node.id!r} names tool {node.tool!r}, outside the allowed modules "
                f"{settings.tool_modules!r} (PREFECT_INTEGRATIONS_AUTOPERSONA_TOOL_MODULES)"
            )
    return _run_graph(graph.to_graph(), user_id, query, episode_id, allowed=settings.allows_module)


def _run_graph(
    graph: TaskGraph,
    user_id: str,
    query: str,
    episode_id: str | None,
    allowed: Callable[[str], bool] | None = None,
) -> dict[str, Any]:
    # The body of both flows; suspending is only allowed in a flow's own body, so
    # neither may call the other as a subflow.
    started = time.perf_counter()
    check_user_id(user_id)
    # On a runner of other processes (Dask, a process pool), the run tasks hold nothing
    # of this one: every node is decided here and its tool imported there by path.
    runner = getattr(FlowRunContext.get(), "task_runner", None)
    elsewhere = runner is not None and not isinstance(runner, ThreadPoolTaskRunner)
    tools_by_node = {
        node_id: resolve_tool(node.tool, allowed=allowed) for node_id, node in graph.nodes.items()
    }
    paths = {
        node_id: import_path(node.tool, node_id)
        for node_id, node in graph.nodes.items()
        if elsewhere
    }
    runtime = current_runtime()
    counter = StepCounter()
    steps = NodeSteps(runtime, episode_of(runtime, episode_id), counter)
    tools = list(graph.order)
    infos = {
        node_id: NodeInfo(id=node_id, instruction=node.instruction)
        for node_id, node in graph.nodes.items()
    }
    futures: dict[str, PrefectFuture[Any]] = {}
    made: dict[str, dict[str, Any] | None] = {}
    early = ask_early(steps, graph, infos, user_id=user_id, query=query, tools=tools)
    quiet = (
        {}
        if elsewhere
        else _quiet(graph, infos, steps, early, user_id=user_id, query=query, tools=tools)
    )
    kept_decisions = EpisodeDecisions(runtime.result_storage, steps.episode_id, quiet)
    kept = kept_decisions.recall()
    # Read back on a replay; decided now (None where it could not be) otherwise.
    decided_here = kept or _decide_here(steps, quiet)
    for node_id in graph.order:
        node, info = graph.nodes[node_id], infos[node_id]
        decision: FinalDecision | ClarifyDecision | None = None
        decided: FinalDecision | None = None
        answers: list[AnsweredQuestion] = []
        if node_id in early.decided:
            decision = early.decided[node_id]
        elif node_id in quiet:
            # Nobody can be asked about it: decided above, and handed to its run
            # task outside the key (as one made there).
            decided = decided_here[node_id]
        else:
            decision, answers = steps.prepare(
                info,
                requirements=node.requires,
                user_id=user_id,
                query=query,
                tools=tools,
                in_flight=list(futures.values()),
                answered=early.answers.get(node_id),
            )
        tool, options = tools_by_node[node_id], node.task_options()
        if elsewhere:
            run, bound = steps.remote_task(node.id, tool, options), {}
        else:
            run, bound = steps.run_task(node.id, tool, options), steps.bound(tool, decided=decided)
        inputs = {dependency: futures[dependency] for dependency in node.depends_on}
        futures[node_id] = run.submit(
            episode_id=steps.episode_id,
            node_id=node.id,
            **steps.run_parameters(
                info,
                user_id=user_id,
                query=query,
                requirements=node.requires,
                decision=decision,
                answers=answers,
                inputs=inputs,
                tools=tools,
                tool_path=paths.get(node_id),
            ),
            **bound,
        )
        ran_with = decided or decision  # None: its run task decides (see `_decide_here`)
        made[node_id] = None if ran_with is None else summarise(ran_with, answers)
    # The tables are known now: written while the tools run, not after them. The
    # decisions are kept whole or not at all: a replay decides anew what was not.
    complete = {node_id: d for node_id, d in decided_here.items() if d is not None}
    keep = not kept and len(complete) == len(quiet)
    with _Background(
        _after_submitting,
        made,
        steps.memory_operations,
        (lambda: kept_decisions.keep(complete)) if keep else None,
    ):
        wait(list(futures.values()))
        results = {node_id: _result(future) for node_id, future in futures.items()}
    outputs = {node_id: result["output"] for node_id, result in results.items()}
    decisions = {node_id: result["decision"] for node_id, result in results.items()}
    cached = sum(future.state.name == "Cached" for future in futures.values())
    if elsewhere:  # counted where they ran, in other processes
        counter.tool_executions = len(futures) - cached
    if decisions != made:
        # A replay's cached nodes ran with the decisions of their first run.
        _decision_table(decisions)
    return {
        "outputs": outputs,
        "decisions": decisions,
        "metrics": {
            "nodes": len(graph),
            "decisions": counter.decisions,
            "clarifications": counter.clarifications,
            "tool_executions": counter.tool_executions,
            "cache_hits": cached,
            "seconds": round(time.perf_counter() - started, 3),
        },
    }


def _quiet(
    graph: TaskGraph,
    infos: dict[str, NodeInfo],
    steps: NodeSteps,
    early: Early,
    *,
    user_id: str,
    query: str,
    tools: list[str],
) -> dict[str, PersonaRequest]:
    """The requests of the nodes nobody can be asked about, by node: decided in the body."""
    return {
        node_id: node_request(
            infos[node_id], node.requires, user_id=user_id, query=query, tools=tools
        )
        for node_id, node in graph.nodes.items()
        if node_id not in early.decided and not steps.may_ask(node.requires)
    }


def _decide_here(
    steps: NodeSteps, requests: dict[str, PersonaRequest]
) -> dict[str, FinalDecision | None]:
    """`NodeSteps.decide_now` for each request, None where the store is unreachable.

    All before the first node is submitted, on one state of memory: while no task
    thread competes for the GIL, each decision takes a fraction of what it takes
    beside running tools. A node decided None is decided again by its run task,
    under the node's retries.
    """
    decided: dict[str, FinalDecision | None] = {}
    with steps.runtime.agent.retriever.reading():
        for node_id, request in requests.items():
            try:
                decided[node_id] = steps.decide_now(node_id, request)
            except StoreUnavailableError:
                decided[node_id] = None
    return decided


def _result(future: PrefectFuture[Any]) -> Any:
    """A finished future's result, read from its final state when that holds it.

    `PrefectFuture.result` runs a coroutine on Prefect's event-loop thread and waits
    for it, ~0.3 ms a node even for a value in memory; a run of many nodes would
    spend more on reading its results than on some of its nodes.
    """
    state = future.state
    if state.is_completed() and isinstance(state.data, ResultRecord):
        return state.data.result
    return future.result()


class _Background:
    """``fn(*args)`` in a thread of its own, in the caller's context (its flow run).

    Used as a context manager: the block runs beside it, and leaving the block waits
    for it, whether the block failed or not, so nothing of the run is still being
    written once the run has ended. What it raised is raised there, unless the block
    raised: a node's failure is the run's.
    """

    def __init__(self, fn: Callable[..., None], *args: Any) -> None:
        self._error: BaseException | None = None
        context = contextvars.copy_context()
        self._thread = threading.Thread(
            target=context.run, args=(self._call, fn, *args), name="persona-tables"
        )

    def _call(self, fn: Callable[..., None], *args: Any) -> None:
        try:
            fn(*args)
        except BaseException as exc:  # raised in the caller on leaving the block
            self._error = exc

    def __enter__(self) -> _Background:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        self._thread.join()
        if self._error is not None and kind is None:
            raise self._error


def _after_submitting(
    decisions: dict[str, dict[str, Any] | None],
    memory_operations: list[dict[str, Any]],
    keep: Callable[[], None] | None,
) -> None:
    # What a run does once every node is submitted, while its tools run.
    if keep is not None:
        keep()
    if all(summary is not None for summary in decisions.values()):
        _decision_table(cast(dict[str, dict[str, Any]], decisions))
    if memory_operations:
        blocking(create_table_artifact)(
            key="persona-memory-ops",
            table=memory_operations,
            description="What this run changed in the person's memory (ids, never contents)",
        )


def _decision_table(decisions: dict[str, dict[str, Any]]) -> None:
    blocking(create_table_artifact)(  # sync in `apersona_graph` too: a worker thread
        key="persona-decisions",
        table=[
            {
                "node": node_id,
                "action": summary["action"],
                # The answer before its (long) question: in view at 1280 px too.
                "answer": " / ".join(
                    a["answer"] + (" (default: nobody answered)" if a.get("default") else "")
                    for a in summary.get("answers", [])
                ),
                "question": " / ".join(a["question"] for a in summary.get("answers", [])),
                "constraints": "; ".join(c["text"] for c in summary["constraints"]),
                "memory ids": ", ".join(c["memory_id"] for c in summary["constraints"]),
                "scores": ", ".join(str(c["score"]) for c in summary["constraints"]),
            }
            for node_id, summary in decisions.items()
        ],
        description="What the PersonaAgent decided before each node",
    )


def run_persona_graph(
    graph: TaskGraph,
    user_id: str,
    query: str,
    *,
    episode_id: str | None = None,
    agent: PersonaAgent | None = None,
    **options: Any,
) -> dict[str, Any]:
    """Run a graph as a Prefect flow (ad hoc, in this process) and return its result.

    Args:
        graph: The task graph.
        user_id: Whose memory to consult.
        query: The user's request.
        episode_id: See `persona_graph`.
        agent: The PersonaAgent; from the enclosing `persona_runtime`, or from the
            settings, if omitted.
        **options: `PersonaRuntime` options (``pause_timeout``, ``poll_interval``,
            ``result_storage``, ``pause_mode``).
    """
    with persona_runtime(agent, **options):
        return persona_graph(graph=graph, user_id=user_id, query=query, episode_id=episode_id)


async def arun_persona_graph(
    graph: TaskGraph,
    user_id: str,
    query: str,
    *,
    episode_id: str | None = None,
    agent: PersonaAgent | None = None,
    **options: Any,
) -> dict[str, Any]:
    """`run_persona_graph` as a coroutine: runs the graph as the async flow `apersona_graph`.

    Args:
        graph: The task graph.
        user_id: Whose memory to consult.
        query: The user's request.
        episode_id: See `persona_graph`.
        agent: See `run_persona_graph`.
        **options: See `run_persona_graph`.
    """
    with persona_runtime(agent, **options):
        return await apersona_graph(
            graph=graph, user_id=user_id, query=query, episode_id=episode_id
        )
