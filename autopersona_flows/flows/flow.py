"""The Prefect flow that runs a task graph for a user, consulting memory before each node."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from prefect import flow
from prefect.context import FlowRunContext
from prefect.futures import PrefectFuture, wait
from prefect.results import ResultRecord
from prefect.task_runners import ThreadPoolTaskRunner
from prefect.utilities.annotations import quote

from autopersona_flows.agent.agent import PersonaAgent
from autopersona_flows.agent.decisions import NodeInfo
from autopersona_flows.errors import GraphError, StoreUnavailableError
from autopersona_flows.flows.calls import NodeCall, RunTool, run_task, summarise
from autopersona_flows.flows.early import Early, ask_early
from autopersona_flows.flows.graph import GraphSpec, TaskGraph, import_path, resolve_tool
from autopersona_flows.flows.reports import (
    Background,
    GraphResult,
    RunMetrics,
    StepCounter,
    write_tables,
)
from autopersona_flows.flows.runtime import PersonaRuntime, current_runtime, persona_runtime
from autopersona_flows.flows.settings import load_settings
from autopersona_flows.flows.settle import NodePlan, Settled, Settler, episode_of
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
    # neither may call the other as a subflow. Every node is settled before it is
    # submitted: those asked early, those nobody can ask about (both all at once),
    # then each other one in order, while the nodes before it run.
    started = time.perf_counter()
    check_user_id(user_id)
    runtime = current_runtime()
    runs = _Runs(graph, runtime, allowed)  # refuses a tool before anything runs
    settler = Settler(runtime, episode_of(runtime, episode_id), StepCounter())
    plans = _plans(graph, user_id, query)
    early = ask_early(settler, graph, plans)
    settled = early.settled | _settle_quiet(settler, graph, plans, early)
    futures: dict[str, PrefectFuture[Any]] = {}
    for node_id in graph.order:
        if node_id not in settled:
            settled[node_id] = settler.settle(
                plans[node_id],
                in_flight=list(futures.values()),
                answered=early.answers.get(node_id, []),
                retries=_retries(settler, graph, node_id),
            )
        call = plans[node_id].call(settled[node_id], runs.paths.get(node_id))
        futures[node_id] = runs.submit(node_id, call, futures, settler)
    decisions = {n: summarise(settled[n].decision, settled[n].answers) for n in graph.order}
    operations = [*early.operations, *(op for n in graph.order for op in settled[n].operations)]
    with Background(write_tables, decisions, operations):  # while the tools run
        wait(list(futures.values()))
        results = {node_id: _result(future) for node_id, future in futures.items()}
    cached = {n for n, future in futures.items() if future.state.name == "Cached"}
    metrics = RunMetrics(
        nodes=len(graph),
        decisions=settler.counter.decisions,
        clarifications=settler.counter.clarifications,
        tool_executions=sum(r["attempt"] for n, r in results.items() if n not in cached),
        cache_hits=len(cached),
        seconds=round(time.perf_counter() - started, 3),
    )
    outputs = {node_id: result["output"] for node_id, result in results.items()}
    return GraphResult(outputs, decisions, metrics).dump()


def _plans(graph: TaskGraph, user_id: str, query: str) -> dict[str, NodePlan]:
    """Each node's plan, by id: the request it is decided on."""
    return {
        node_id: NodePlan(
            NodeInfo(id=node_id, instruction=node.instruction),
            node.requires,
            user_id,
            query,
            list(graph.order),
        )
        for node_id, node in graph.nodes.items()
    }


def _settle_quiet(
    settler: Settler, graph: TaskGraph, plans: dict[str, NodePlan], early: Early
) -> dict[str, Settled]:
    """Settle the nodes nobody can be asked about, all at once, before any is submitted.

    While no task thread competes for the process, each decision takes a fraction of
    what it takes beside running tools. After a store outage none is: each is then
    settled on its own in order, under its node's retries (see `_run_graph`).
    """
    quiet = {
        node_id: plans[node_id]
        for node_id in graph.order
        if node_id not in early.settled and not settler.may_ask(plans[node_id].requirements)
    }
    try:
        made = settler.settle_all(quiet, retries=0)
    except StoreUnavailableError:
        return {}
    return {node_id: Settled(settler.unasked(node_id, d), [], []) for node_id, d in made.items()}


def _retries(settler: Settler, graph: TaskGraph, node_id: str) -> int | None:
    """How often settling a node retries a store outage.

    As the pre-hook's steps do, or, for a node nobody can ask about (left by
    `_settle_quiet` after an outage), as often as the node's run would.
    """
    node = graph.nodes[node_id]
    return None if settler.may_ask(node.requires) else node.retries


class _Runs:
    """The run tasks of a graph's nodes, on the flow's task runner.

    On a runner of other processes (Dask, a process pool), the run tasks hold
    nothing of this one: each tool is imported there, by its path.

    Raises:
        GraphError: If a tool cannot be resolved, or imported by path where it runs.
    """

    def __init__(
        self, graph: TaskGraph, runtime: PersonaRuntime, allowed: Callable[[str], bool] | None
    ) -> None:
        runner = getattr(FlowRunContext.get(), "task_runner", None)
        self.elsewhere = runner is not None and not isinstance(runner, ThreadPoolTaskRunner)
        self.graph = graph
        self.runtime = runtime
        self.tools = {
            node_id: resolve_tool(node.tool, allowed=allowed)
            for node_id, node in graph.nodes.items()
        }
        self.paths = {
            node_id: import_path(node.tool, node_id)
            for node_id, node in graph.nodes.items()
            if self.elsewhere
        }

    def submit(
        self,
        node_id: str,
        call: NodeCall,
        futures: dict[str, PrefectFuture[Any]],
        settler: Settler,
    ) -> PrefectFuture[Any]:
        """Submit the node's run task with its ``call`` and its upstream runs' futures."""
        node, tool = self.graph.nodes[node_id], self.tools[node_id]
        options = node.task_options()
        storage = options.get("result_storage", self.runtime.result_storage)
        task = run_task(
            node_id, tool, storage, options, elsewhere=self.elsewhere, locked=settler.shared
        )
        upstream = {dependency: futures[dependency] for dependency in node.depends_on}
        parameters = call.parameters(upstream, elsewhere=self.elsewhere)
        if not self.elsewhere:
            parameters["tool"] = quote(RunTool(tool))
        return task.submit(episode_id=settler.episode_id, node_id=node_id, **parameters)


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
