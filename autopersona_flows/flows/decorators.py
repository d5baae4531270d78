"""``@persona_task``: the persona pre-hook for functions in any ``@flow``."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Generic, ParamSpec, TypeVar, overload

from autopersona_flows.agent.decisions import NodeInfo, Requirement
from autopersona_flows.errors import FlowConfigurationError
from autopersona_flows.flows.context import current_runtime
from autopersona_flows.flows.graph import TaskNode
from autopersona_flows.flows.tasks import NodeSteps, StepCounter, episode_of, json_inputs

__all__ = ["PersonaTask", "persona_task"]

P = ParamSpec("P")
R = TypeVar("R")


class PersonaTask(Generic[P, R]):
    """A function that consults the PersonaAgent each time a flow calls it.

    Calling it inside a ``@flow`` (within `persona_runtime`) decides first, as its
    own cached task; asks the person and learns the answer when something required
    is missing; then runs the function as a Prefect task named after it, passing a
    `NodeContext` as the first argument. Arguments must be JSON values: they are
    part of the cache key, so a resumed run gets the result back instead of
    calling the function again.
    """

    def __init__(
        self,
        fn: Callable[..., R],
        *,
        requires: Sequence[Requirement] = (),
        name: str | None = None,
        instruction: str | None = None,
        retries: int = 0,
    ) -> None:
        # Validates the name and requirements exactly as a graph node would.
        self.node = TaskNode(
            id=name or fn.__name__,
            instruction=instruction or (fn.__doc__ or "").strip().split("\n")[0],
            tool=fn,
            requires=list(requires),
            retries=retries,
        )
        self.fn = fn
        functools.update_wrapper(self, fn)

    def __repr__(self) -> str:
        return f"PersonaTask({self.node.id!r}, requires={[r.name for r in self.node.requires]})"

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Consult the agent, ask if needed, then run the function as a Prefect task."""
        runtime = current_runtime()
        if runtime.user_id is None:
            raise FlowConfigurationError(
                f"{self.node.id!r} needs a user: use `with persona_runtime(agent, user_id=...)`"
            )
        arguments = json_inputs(
            {"args": list(args), "kwargs": kwargs}, f"the arguments of {self.node.id!r}"
        )
        steps = NodeSteps(runtime, episode_of(runtime, None), StepCounter())
        info = NodeInfo(id=self.node.id, instruction=self.node.instruction)
        with steps.active():
            decision, answers = None, []
            if steps.may_ask(self.node.requires):
                decision, answers = steps.prepare(
                    info,
                    requirements=self.node.requires,
                    user_id=runtime.user_id,
                    query=runtime.query,
                    tools=[],
                    in_flight=[],
                )
            run = steps.run_task(self.node.id, self.fn, retries=self.node.retries)
            result = run(
                episode_id=steps.episode_id,
                node_id=self.node.id,
                inputs=steps.run_inputs(
                    info,
                    user_id=runtime.user_id,
                    query=runtime.query,
                    requirements=self.node.requires,
                    decision=decision,
                    answers=answers,
                    inputs={},
                    tools=[],
                    **arguments,
                ),
            )
        return result["output"]


@overload
def persona_task(fn: Callable[..., R], /) -> PersonaTask[..., R]: ...


@overload
def persona_task(
    *,
    requires: Sequence[Requirement] = (),
    name: str | None = None,
    instruction: str | None = None,
    retries: int = 0,
) -> Callable[[Callable[..., R]], PersonaTask[..., R]]: ...


def persona_task(
    fn: Callable[..., R] | None = None,
    /,
    *,
    requires: Sequence[Requirement] = (),
    name: str | None = None,
    instruction: str | None = None,
    retries: int = 0,
) -> PersonaTask[..., R] | Callable[[Callable[..., R]], PersonaTask[..., R]]:
    """Turn ``fn(context, *args, **kwargs)`` into a persona-aware Prefect task.

    ::

        @persona_task(requires=[Requirement("citation style", options=["APA", "MLA"])])
        def format_references(context: NodeContext, references: list[str]) -> str: ...

        @flow
        def write_paper(user_id: str) -> str:
            with persona_runtime(agent, user_id=user_id, query="Write my paper"):
                return format_references(["Knuth 1984"])

    Args:
        fn: The function; its first parameter receives the `NodeContext`.
        requires: What it must know about the person before it runs.
        name: The task's name (also its node id); the function's name by default.
        instruction: What it does, for the agent; the docstring's first line by default.
        retries: How often Prefect retries it when it raises.
    """
    options = {"requires": requires, "name": name, "instruction": instruction, "retries": retries}
    if fn is None:
        return lambda function: PersonaTask(function, **options)
    return PersonaTask(fn, **options)
