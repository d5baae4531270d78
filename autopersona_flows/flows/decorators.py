"""``@persona_task``: a Prefect task with the persona pre-hook, for functions in any ``@flow``."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, Unpack, cast, overload

from prefect.context import FlowRunContext
from prefect.futures import PrefectFuture, PrefectFutureList
from prefect.task_runners import ThreadPoolTaskRunner
from prefect.utilities.annotations import quote

from autopersona_flows.agent.decisions import NodeInfo, Requirement
from autopersona_flows.errors import FlowConfigurationError
from autopersona_flows.flows.arguments import ToolArguments
from autopersona_flows.flows.calls import RunTool, is_async, run_task
from autopersona_flows.flows.context import NodeContext
from autopersona_flows.flows.early import ask_early
from autopersona_flows.flows.graph import TaskGraph, TaskNode
from autopersona_flows.flows.options import (
    DEFAULT_TASK_OPTIONS,
    PersonaTaskOptions,
    RunName,
    check_task_options,
)
from autopersona_flows.flows.runtime import current_flow_run_id, current_runtime
from autopersona_flows.flows.settle import NodePlan, Settler, episode_of

__all__ = ["PersonaTask", "ask_first", "persona_task"]

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


class PersonaTask(Generic[P, R]):
    """A function that consults the PersonaAgent each time a flow runs it, as a Prefect task.

    Called, submitted or mapped inside a ``@flow`` (within `persona_runtime`), it
    first runs the pre-hook in the flow body, where a question may pause or
    suspend the run: the agent decides (in a kept step, see `Settler.kept`), and while
    something required is missing it asks the person and learns the answer. Then
    the function runs as a Prefect task named after it, given a `NodeContext`
    first. Its result is cached by episode, node and arguments, so a resumed or
    replayed run gets it back instead of calling the function again.

    It behaves like a Prefect task: an ``async def`` function gives a coroutine to
    await (an async task); ``.submit()`` returns a `PrefectFuture`, ``.map()`` a
    `PrefectFutureList`; futures and states among the arguments are resolved as
    Prefect resolves a task's parameters, and what they resolve to must be JSON
    like every other argument.
    """

    def __init__(
        self,
        fn: Callable[Concatenate[NodeContext, P], R],
        *,
        requires: Sequence[Requirement] = (),
        name: str | None = None,
        instruction: str | None = None,
        options: PersonaTaskOptions | None = None,
    ) -> None:
        # Validates the name and requirements exactly as a graph node would.
        self.node = TaskNode(
            id=name or fn.__name__,
            instruction=instruction or (fn.__doc__ or "").strip().split("\n")[0],
            tool=fn,
            requires=list(requires),
        )
        self.fn = fn
        self.options: PersonaTaskOptions = DEFAULT_TASK_OPTIONS | check_task_options(
            options or {}, self.node.id
        )
        self.arguments = ToolArguments(fn, self.node.id)
        self.isasync = is_async(fn)
        RunName(self.node.id, self.options.get("task_run_name")).check(
            self.arguments.names, self.node.id
        )
        functools.update_wrapper(self, fn)

    def __repr__(self) -> str:
        return f"PersonaTask({self.node.id!r}, requires={[r.name for r in self.node.requires]})"

    def with_options(
        self,
        *,
        name: str | None = None,
        requires: Sequence[Requirement] | None = None,
        instruction: str | None = None,
        **options: Unpack[PersonaTaskOptions],
    ) -> PersonaTask[P, R]:
        """A copy with other options, merged over this one's (as Prefect's ``with_options``)."""
        return PersonaTask(
            self.fn,
            requires=self.node.requires if requires is None else requires,
            name=name or self.node.id,
            instruction=instruction or self.node.instruction,
            options=self.options | options,
        )

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run the pre-hook, then the function as a Prefect task; return its result.

        For an ``async def`` function, a coroutine that does this when awaited.
        """
        settler = self._settler()
        arguments = self.arguments.bind(args, kwargs)
        self.arguments.check(arguments, resolved=False)
        run = self._run_task(settler)
        if self.isasync:
            return cast(R, self._acall(settler, run, arguments))
        return cast(R, run(**self._prepare(settler, arguments)))

    async def _acall(self, settler: Settler, run: Any, arguments: dict[str, Any]) -> Any:
        # The pre-hook is sync (Prefect tasks and a pause that polls): in a worker
        # thread, so the flow's event loop goes on with other coroutines meanwhile.
        parameters = await asyncio.to_thread(self._prepare, settler, arguments)
        return await run(**parameters)

    @overload
    def submit(
        self: PersonaTask[P, Coroutine[Any, Any, T]], *args: P.args, **kwargs: P.kwargs
    ) -> PrefectFuture[T]: ...

    @overload
    def submit(self: PersonaTask[P, T], *args: P.args, **kwargs: P.kwargs) -> PrefectFuture[T]: ...

    def submit(self, *args: Any, **kwargs: Any) -> PrefectFuture[Any]:
        """Run the pre-hook here, then submit the function to the flow's task runner.

        As Prefect's ``Task.submit``, it is sync for ``async def`` functions too, and
        the future's result is the function's result.
        """
        settler = self._settler(submitted=True)
        arguments = self.arguments.bind(args, kwargs)
        self.arguments.check(arguments, resolved=False)
        run = self._run_task(settler)
        future: PrefectFuture[Any] = run.submit(**self._prepare(settler, arguments))
        settler.runtime.in_flight.add(current_flow_run_id(), [future])
        return future

    @overload
    def map(
        self: PersonaTask[P, Coroutine[Any, Any, T]], *args: Any, **kwargs: Any
    ) -> PrefectFutureList[T]: ...

    @overload
    def map(self: PersonaTask[P, T], *args: Any, **kwargs: Any) -> PrefectFutureList[T]: ...

    def map(self, *args: Any, **kwargs: Any) -> PrefectFutureList[Any]:
        """``submit`` for each element of the iterable arguments, as Prefect's ``Task.map``.

        Iterables are mapped over; other values and those wrapped in
        ``prefect.unmapped`` are the same for every element. Each element runs the
        pre-hook and the function in steps of its own, keyed by its index, so each
        is cached (and replayed) on its own.
        """
        settler = self._settler(submitted=True)
        elements = self.arguments.expand(args, kwargs)
        for arguments in elements:  # all checked before any runs
            self.arguments.check(arguments, resolved=False)
        run = self._run_task(settler)
        futures: list[PrefectFuture[Any]] = []
        run_id = current_flow_run_id()
        for index, arguments in enumerate(elements):
            futures.append(run.submit(**self._prepare(settler, arguments, index, futures)))
        # Registered once: each add sweeps what finished.
        settler.runtime.in_flight.add(run_id, futures)
        # Built as Prefect builds it; its Iterator base declares a __next__ it never has.
        return PrefectFutureList(futures)  # type: ignore[abstract]  # see above

    def _settler(self, *, submitted: bool = False) -> Settler:
        runner = getattr(FlowRunContext.get(), "task_runner", None)
        if submitted and runner is not None and not isinstance(runner, ThreadPoolTaskRunner):
            # Its function and arguments live in this process (a graph's tools do not).
            raise FlowConfigurationError(
                f"{self.node.id!r} was submitted to a {type(runner).__name__}: persona tasks "
                "submit only to a thread-based task runner (the default ThreadPoolTaskRunner); "
                "call it directly, or run a persona graph, whose nodes run on any task runner"
            )
        runtime = current_runtime()
        if runtime.user_id is None:
            raise FlowConfigurationError(
                f"{self.node.id!r} needs a user: use `with persona_runtime(agent, user_id=...)`"
            )
        counter = runtime.in_flight.counter(current_flow_run_id())
        return Settler(runtime, episode_of(runtime, None), counter)

    def _plan(self, settler: Settler, element: int | None = None) -> NodePlan:
        assert settler.runtime.user_id is not None  # _settler checked it
        return NodePlan(
            NodeInfo(id=self.node.id, instruction=self.node.instruction),
            self.node.requires,
            settler.runtime.user_id,
            settler.runtime.query,
            element=element,
        )

    def _run_task(self, settler: Settler) -> Any:
        storage = self.options.get("result_storage", settler.runtime.result_storage)
        return run_task(self.node.id, self.fn, storage, self.options, locked=settler.shared)

    def _prepare(
        self,
        settler: Settler,
        arguments: dict[str, Any],
        element: int | None = None,
        submitted: Sequence[PrefectFuture[Any]] = (),
    ) -> dict[str, Any]:
        """The pre-hook (in the flow body): settle the node; return its run task's parameters.

        A question waits for every persona run submitted before it in this flow run,
        and for ``submitted`` (the elements of a ``.map()`` before this one).
        """
        plan = self._plan(settler, element)
        run_id = current_flow_run_id()
        with settler.runtime.in_flight.settling(run_id):
            in_flight = settler.runtime.in_flight.of(run_id)
            settled = settler.settle(plan, in_flight=[*in_flight, *submitted])
        return {
            "episode_id": settler.episode_id,
            "node_id": self.node.id,
            **plan.call(settled).parameters({}, arguments=arguments),
            "tool": quote(RunTool(self.fn, self.arguments)),
        }


@overload
def persona_task(fn: Callable[Concatenate[NodeContext, P], R], /) -> PersonaTask[P, R]: ...


@overload
def persona_task(
    *,
    requires: Sequence[Requirement] = (),
    name: str | None = None,
    instruction: str | None = None,
    **options: Unpack[PersonaTaskOptions],
) -> Callable[[Callable[Concatenate[NodeContext, P], R]], PersonaTask[P, R]]: ...


def persona_task(
    fn: Callable[Concatenate[NodeContext, P], R] | None = None,
    /,
    *,
    requires: Sequence[Requirement] = (),
    name: str | None = None,
    instruction: str | None = None,
    **options: Unpack[PersonaTaskOptions],
) -> PersonaTask[P, R] | Callable[[Callable[Concatenate[NodeContext, P], R]], PersonaTask[P, R]]:
    """Turn ``fn(context, *args, **kwargs)`` into a persona-aware Prefect task.

    ::

        @persona_task(
            requires=[Requirement("citation style", options=["APA", "MLA"])],
            retries=2, retry_delay_seconds=5, timeout_seconds=60, tags=["papers"],
        )
        async def format_references(context: NodeContext, references: list[str]) -> str: ...

        @flow
        async def write_paper(user_id: str) -> str:
            with persona_runtime(agent, user_id=user_id, query="Write my paper"):
                return await format_references(["Knuth 1984"])

    Args:
        fn: The function, sync or ``async def``; its first parameter receives the
            `NodeContext`.
        requires: What it must know about the person before it runs.
        name: The task's name (also its node id); the function's name by default.
        instruction: What it does, for the agent; the docstring's first line by default.
        **options: Prefect's task options (`PersonaTaskOptions`): ``retries``,
            ``retry_delay_seconds``, ``timeout_seconds``, ``tags``, ``log_prints``,
            ``task_run_name``, ``cache_expiration``, ``result_storage``, … merged over
            `DEFAULT_TASK_OPTIONS`.

    Raises:
        FlowConfigurationError: For an option persona tasks set themselves (such as
            ``cache_policy``), an unknown one, or a ``task_run_name`` naming no argument.
    """

    def build(function: Callable[Concatenate[NodeContext, P], R]) -> PersonaTask[P, R]:
        return PersonaTask(
            function, requires=requires, name=name, instruction=instruction, options=options
        )

    return build if fn is None else build(fn)


def ask_first(*tasks: PersonaTask[..., Any]) -> None:
    """Ask now, in one form, what the persona tasks a flow is about to run lack.

    A graph's nodes are known before it runs, so it asks everything it lacks before
    its first tool (see ``ask="early"``). A flow's persona tasks are known only as it
    calls them, so each asks when it is reached: two that lack an answer pause the run
    twice, minutes apart. Call this at the start of the flow body, inside
    `persona_runtime`, naming the tasks the flow will run::

        with persona_runtime(agent, user_id=user_id, query="Write and share my paper"):
            ask_first(format_references, share)  # one form, if memory lacks either
            references = format_references(["Knuth 1984"])
            share(references)

    The required requirements of the tasks (those with ``ask="early"``) are checked
    against memory as a graph checks them, and those memory cannot answer are asked
    together and learned; each task then finds its answer when it runs. Nothing is
    asked when memory holds them all, and a replay of the episode asks nothing again.
    In an ``async`` flow, call it with ``await asyncio.to_thread(ask_first, ...)``.

    Raises:
        FlowConfigurationError: If a task is not a `PersonaTask`, or there is no
            ``user_id``.
    """
    strays = [task for task in tasks if not isinstance(task, PersonaTask)]
    if strays:
        raise FlowConfigurationError(
            f"ask_first takes persona tasks (made with @persona_task), not {strays[0]!r}"
        )
    if not tasks:
        return
    settler = tasks[0]._settler()
    unique = list({task.node.id: task for task in tasks}.values())
    graph = TaskGraph([task.node for task in unique])
    ask_early(settler, graph, {task.node.id: task._plan(settler) for task in unique})
