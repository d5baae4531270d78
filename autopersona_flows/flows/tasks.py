"""The steps of a persona node: decide, learn the answer, run the tool.

Every node is decided in the flow body, where a question can suspend the run, with
no Prefect task of its own: a node the agent may ask about in steps kept in the
result store under their decide keys (`NodeSteps.kept`), any other graph node
directly (`NodeSteps.decide_now`, kept for the episode by the graph), a
`persona_task` nobody can ask about inside its run task. Learning an answer and
running the tool are Prefect tasks, visible in the UI and cached under
`NodeCachePolicy`. So a resumed or replayed run gets each completed step back from
the result store instead of running it again. A tool may be ``async def``: its run
task is then a Prefect async task that awaits it.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import itertools
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from prefect import Task
from prefect.futures import wait
from prefect.results import ResultStore
from prefect.utilities.annotations import opaque, quote

from autopersona_flows import _json
from autopersona_flows.agent.decisions import (
    ClarifyDecision,
    FinalDecision,
    NodeInfo,
    PersonaRequest,
    Requirement,
    parse_decision,
)
from autopersona_flows.errors import (
    ClarificationBudgetError,
    ClarificationTimeoutError,
    NodeOutputError,
    PolicyError,
    StoreUnavailableError,
)
from autopersona_flows.flows.arguments import ToolArguments
from autopersona_flows.flows.cache_policies import node_cache_key
from autopersona_flows.flows.clarification import (
    ask_all,
    field_names,
    form_key,
    record_defaults,
    response_key,
)
from autopersona_flows.flows.context import AnsweredQuestion, NodeContext
from autopersona_flows.flows.episodes import (
    Asking,
    EpisodeAnswers,
    Given,
    decision_json,
    result_store,
)
from autopersona_flows.flows.graph import resolve_tool
from autopersona_flows.flows.locks import step_locks
from autopersona_flows.flows.options import (
    DEFAULT_TASK_OPTIONS,
    PRE_HOOK_OPTIONS,
    PersonaTaskOptions,
    RunName,
    build_task,
)
from autopersona_flows.flows.runtime import PersonaRuntime, current_flow_run_id
from autopersona_flows.memory.records import JsonValue, check_json

__all__ = [
    "NodeSteps",
    "StepCounter",
    "episode_of",
    "is_async",
    "json_inputs",
    "node_request",
    "summarise",
]


class StepCounter:
    """Counts, per flow run, what actually executed (cache hits do not count)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.tool_executions = 0
        self.decisions = 0
        self.clarifications = 0

    def add(self, name: str, count: int = 1) -> None:
        """Count ``count`` more ``name``."""
        with self._lock:
            setattr(self, name, getattr(self, name) + count)


def episode_of(runtime: PersonaRuntime, episode_id: str | None) -> str:
    """The episode a run's cache keys belong to: given, configured, or the flow run's id."""
    if episode_id:
        return episode_id
    if runtime.episode_id:
        return runtime.episode_id
    return str(current_flow_run_id())


def json_inputs(value: Any, what: str) -> JsonValue:
    """Return ``value`` if it is a JSON value (it becomes part of a cache key)."""
    try:
        return check_json(value)
    except ValueError as exc:
        raise NodeOutputError(f"{what} must be JSON values: {exc}") from None


# The functions of the persona tasks: the steps they belong to (and the tool, the
# question) are parameters outside the cache key (see `NodeCachePolicy`), quoted so
# that Prefect passes them untouched. Short on purpose: Prefect reads and hashes a
# task function's source whenever a task is built from it.
def _learn(
    episode_id: str,
    node_id: str,
    inputs: dict[str, Any],
    steps: NodeSteps,
    decision: ClarifyDecision,
) -> Any:
    return steps.learn(node_id, decision, inputs)


def _run(
    episode_id: str, node_id: str, inputs: dict[str, Any], resolved: dict[str, Any], call: _Call
) -> Any:
    return call.steps.run(node_id, inputs | resolved, call.tool, call.decided)


async def _arun(
    episode_id: str, node_id: str, inputs: dict[str, Any], resolved: dict[str, Any], call: _Call
) -> Any:
    return await call.steps.arun(node_id, inputs | resolved, call.tool, call.decided)


# A graph node's run task on a runner of other processes (Dask, a process pool): it
# holds nothing of the flow's process, the tool by import path and the decision made
# in the flow body are in its inputs.
def _run_elsewhere(episode_id: str, node_id: str, inputs: dict[str, Any]) -> Any:
    return _elsewhere(node_id, inputs, resolve_tool(inputs["tool"]))


async def _arun_elsewhere(episode_id: str, node_id: str, inputs: dict[str, Any]) -> Any:
    decision, context = _node_context(inputs)
    output = await resolve_tool(inputs["tool"])(context)
    return _graph_result(node_id, decision, context, output)


def _elsewhere(node_id: str, inputs: dict[str, Any], tool: Callable[..., Any]) -> Any:
    decision, context = _node_context(inputs)
    output = _sync_output(node_id, tool(context))
    return _graph_result(node_id, decision, context, output)


@dataclass(frozen=True, slots=True)
class _Tool:
    """A node's function, as its run task calls it.

    Attributes:
        fn: The function (sync or ``async def``).
        arguments: A `persona_task`'s arguments, whose run returns the output alone;
            None for a graph node's tool, called with its context only, whose run
            also returns a summary of its decision.
    """

    fn: Callable[..., Any]
    arguments: ToolArguments | None = None


@dataclass(frozen=True, slots=True)
class _Call:
    """A run task's parameter outside its key: whose steps, which tool, what was decided.

    One parameter, quoted, so that Prefect passes it untouched (it walks every
    parameter it is given, each on every submit and run).
    """

    steps: NodeSteps
    tool: _Tool
    decided: FinalDecision | None = None


def is_async(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` is an ``async def`` function (or a callable whose ``__call__`` is)."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - the method, not whether it is callable
    )


class NodeSteps:
    """The steps of a flow run's nodes: decide, learn the answer, run the tool.

    The tasks call back into the `NodeSteps` active in their context (see `active`).
    """

    def __init__(self, runtime: PersonaRuntime, episode_id: str, counter: StepCounter) -> None:
        self.runtime = runtime
        self.episode_id = episode_id
        self.counter = counter
        # Only runs sharing an episode id can run its steps at once: an episode of
        # the run's own id has no other run, and its steps need no locks.
        self.shared = episode_id != str(current_flow_run_id())
        # What the learn steps did to memory, for the run's artifact (ids, never contents).
        self.memory_operations: list[dict[str, Any]] = []

    def _task(
        self,
        fn: Callable[..., Any],
        kind: str,
        name: str,
        options: PersonaTaskOptions = DEFAULT_TASK_OPTIONS,
        run_name: RunName | None = None,
    ) -> Task:
        storage = options.get("result_storage", self.runtime.result_storage)
        return build_task(fn, kind, name, storage, options, run_name=run_name, locked=self.shared)

    def decide(self, inputs: dict[str, Any]) -> Any:
        """The decide step's work: the agent's decision for the request in ``inputs``.

        ``inputs`` may carry the ``answered`` questions of earlier rounds (in memory
        by now) and the ``element`` of a ``.map()``: they only key the step.
        """
        self.counter.add("decisions")
        request = PersonaRequest.model_validate_json(
            _json.dumps({k: v for k, v in inputs.items() if k not in ("answered", "element")})
        )
        return decision_json(self.runtime.agent.decide(request))

    def check(self, inputs: dict[str, Any]) -> Any:
        """The check step's work: decide each request in ``inputs`` (see `early`).

        All on one state of memory, each bank read once for them all.
        """
        decisions = []
        with self.runtime.agent.retriever.reading():
            for request in inputs["requests"]:
                self.counter.add("decisions")
                decision = self.runtime.agent.decide(PersonaRequest.model_validate(request))
                decisions.append(decision_json(decision))
        return decisions

    def check_requirements(self, requests: list[PersonaRequest]) -> list[Any]:
        """Decide each of ``requests`` in one kept step (see `early`); return the decisions."""
        inputs = {"requests": [_json.loads(r.model_dump_json()) for r in requests]}
        return cast(list[Any], self.kept("check-requirements", inputs, self.check))

    def kept(self, node_id: str, inputs: dict[str, Any], work: Callable[[Any], Any]) -> Any:
        """A decide step in the flow body, with no Prefect task: ``work(inputs)``, kept.

        Its result is kept in the result store under the node's ``decide`` key
        (`node_cache_key`), so a resumed or replayed run reads it back instead of
        deciding again. A step of a shared episode holds its step lock, so of two
        runs at once one decides and the other reads. A store outage is retried as
        the pre-hook's tasks retry it (`PRE_HOOK_OPTIONS`).
        """
        key = node_cache_key("decide", self.episode_id, node_id, inputs)
        store = self._results
        holder = uuid.uuid4().hex
        locks = step_locks(self.runtime.result_storage) if self.shared else None
        if locks is not None:
            locks.acquire_lock(key, holder)
        try:
            if store.exists(key):
                return store.read(key).result
            result = _retrying_outages(work, inputs)
            store.write(result, key=key)
            return result
        finally:
            if locks is not None:
                locks.release_lock(key, holder)

    @functools.cached_property
    def _results(self) -> ResultStore:
        return result_store(self.runtime.result_storage)

    def learn(self, node_id: str, decision: ClarifyDecision, inputs: dict[str, Any]) -> Any:
        """The learn task's work: remember the answer to the question of ``decision``."""
        result = self.runtime.agent.learn(
            inputs["user_id"],
            decision,
            inputs["answer"],
            flow_run_id=str(current_flow_run_id()),
            node=node_id,
        )
        return {
            "operation": result.operation,
            "memory_id": result.record.id if result.record else None,
            "target_id": result.target_id,
        }

    def prepare(
        self,
        node: NodeInfo,
        *,
        requirements: list[Requirement],
        user_id: str,
        query: str,
        tools: list[str],
        in_flight: list[Any],
        element: int | None = None,
        answered: list[AnsweredQuestion] | None = None,
    ) -> tuple[FinalDecision | ClarifyDecision, list[AnsweredQuestion]]:
        """The pre-hook: decide, and while the decision is a question, ask, learn, decide again.

        Each round is its own cached step, keyed by the answers given before it, so
        a replay rebuilds every round from the cache and the kept answers and asks
        nothing again. A question already answered at this node is not asked
        twice: the node then runs with the answers it has. Each ``element`` of a
        ``.map()`` decides in steps of its own (the index is in their keys); an
        answer one element got is in memory when the next decides. ``answered``
        are the questions of the node's requirements answered before (see `early`).

        Returns:
            The decision the node runs with, and the questions answered before it.

        Raises:
            PolicyError: If the policy asks more questions than the node has
                requirements (plus one), each a new one.
        """
        request = _json.loads(
            node_request(
                node, requirements, user_id=user_id, query=query, tools=tools
            ).model_dump_json()
        )
        if element is not None:
            request["element"] = element
        answered = list(answered or [])
        for round_ in itertools.count(1):
            suffix = f"-{round_}" if round_ > 1 else ""
            given = [a.model_dump(mode="json") for a in answered]
            inputs = {**request, "answered": given} if answered else request
            decision = parse_decision(_json.dumps(self.kept(node.id, inputs, self.decide)))
            if isinstance(decision, FinalDecision) or any(
                a.question == decision.question for a in answered
            ):
                return decision, answered
            if len(answered) > len(requirements):
                raise PolicyError(
                    f"{self.runtime.agent.policy!r} asked {len(answered) + 1} questions for "
                    f"{node.id!r}, which has {len(requirements)} requirements: last "
                    f"{decision.question!r}"
                )
            answer = self.answer(node.id, user_id, decision, in_flight)
            answered.append(self.remember(node.id, suffix, user_id, decision, answer))
        raise AssertionError("unreachable: the rounds never end")

    def remember(
        self, node_id: str, suffix: str, user_id: str, decision: ClarifyDecision, given: Given
    ) -> AnsweredQuestion:
        """Learn the answer to the question of ``decision`` in a learn step of the node.

        A default nobody answered is not the person's preference: it is not learned.
        """
        answered = AnsweredQuestion(
            question=decision.question,
            requirement=decision.requirement,
            answer=given.answer,
            source="default" if given.default else "answered",
        )
        if given.default:
            return answered
        learned: dict[str, Any] = cast(  # a sync task's result, not a coroutine
            dict[str, Any],
            self._task(_learn, "learn", f"learn-{node_id}{suffix}", PRE_HOOK_OPTIONS)(
                episode_id=self.episode_id,
                node_id=node_id,
                inputs={"question": decision.question, "answer": given.answer, "user_id": user_id},
                steps=quote(self),
                decision=quote(decision),
            ),
        )
        self.memory_operations.append(
            {
                "node": node_id,
                "requirement": decision.requirement or "",
                "operation": learned["operation"],
                "memory id": learned["memory_id"] or "",
                "replaced": (
                    learned.get("target_id") or ""
                    if learned["operation"] in ("update", "delete")
                    else ""
                ),
            }
        )
        return answered.model_copy(update={"memory_id": learned["memory_id"]})

    def answer(
        self, node_id: str, user_id: str, decision: ClarifyDecision, in_flight: list[Any]
    ) -> Given:
        """The answer to ``decision``: kept from an earlier run of the episode, or asked."""
        return self.answers([(node_id, decision)], user_id, in_flight)[0]

    def answers(
        self,
        questions: list[tuple[str, ClarifyDecision]],
        user_id: str,
        in_flight: list[Any],
        *,
        where: str = "start",
    ) -> list[Given]:
        """The answers to ``questions`` (each of a node): those kept, the others asked at once.

        The questions no earlier run of the episode got an answer to are asked in one
        form (see `ask_all`; ``where`` names it), as many as the run's question
        budget leaves; past it, and when nobody answers in time under ``on_timeout=
        "default"``, a requirement's declared default is used (and kept, so a replay
        runs with it again).

        Raises:
            ClarificationBudgetError: If a question past the budget has no default.
            ClarificationTimeoutError: If nobody answered in time, unless every
                unanswered requirement has a default and ``on_timeout`` is ``"default"``.
        """
        # Kept per episode, node and question: a replay of the episode (a new run, a
        # retry) then rebuilds exactly the inputs the node ran with.
        answers = EpisodeAnswers(self.runtime.result_storage, self.episode_id)
        given = [answers.recall(node_id, user_id, decision) for node_id, decision in questions]
        missing = [n for n, answer in enumerate(given) if answer is None]
        budget = self.runtime.question_budget
        room = len(missing) if budget is None else max(0, budget - self.counter.clarifications)
        for n in missing[room:]:
            given[n] = Given(_default(questions[n][1], "the run's question budget is spent"), True)
        asking = [questions[n] for n in missing[:room]]
        if asking:
            self.counter.add("clarifications", len(asking))
            wait(in_flight)  # nothing runs while we wait, so a suspend loses no work
            key = response_key(form_key(asking, where), self.runtime)
            run_id = current_flow_run_id()
            fields = field_names([decision for _, decision in asking])
            for (node_id, decision), field in zip(asking, fields, strict=True):
                note = Asking(flow_run_id=run_id, response_key=key, field=field)
                answers.asking(node_id, user_id, decision, note)
            try:
                asked = [Given(answer) for answer in ask_all(asking, self.runtime, where=where)]
            except ClarificationTimeoutError:
                if self.runtime.on_timeout != "default":
                    raise
                asked = [Given(_default(d, "nobody answered in time"), True) for _, d in asking]
                record_defaults(asking, [g.answer for g in asked], where)
            for n, answer in zip(missing[:room], asked, strict=True):
                given[n] = answer
        for n in missing:
            node_id, decision = questions[n]
            answers.keep(node_id, user_id, decision, cast(Given, given[n]))
        return [answer for answer in given if answer is not None]

    def may_ask(self, requirements: list[Requirement]) -> bool:
        """Whether the agent may ask before a node with these requirements.

        Only such a node needs its decision in the flow body, where a question can
        suspend the run. Any other node needs no decide step: one Prefect task per
        node instead of two, its decision made with no task of its own (`decide_now`)
        and replayed with the run task's cached result. A policy declares
        ``asks_without_requirements = False`` to promise it never asks for a node
        without required requirements (`EvidencePolicy` does); a policy that does
        not say is assumed to ask anywhere.
        """
        policy = self.runtime.agent.policy
        return any(r.required for r in requirements) or bool(
            getattr(policy, "asks_without_requirements", True)
        )

    def run_task(
        self,
        node_id: str,
        tool: Callable[..., Any],
        options: PersonaTaskOptions = DEFAULT_TASK_OPTIONS,
    ) -> Task:
        """The task that runs the node's tool with its `NodeContext` (see `run`).

        Call it with `bound` among its parameters.

        Args:
            node_id: The node.
            tool: Its tool; an ``async def`` one gets an async task, which awaits it.
            options: The task's Prefect options.
        """
        run_name = RunName(node_id, options.get("task_run_name"))
        return self._task(_arun if is_async(tool) else _run, "run", node_id, options, run_name)

    def bound(
        self,
        tool: Callable[..., Any],
        arguments: ToolArguments | None = None,
        decided: FinalDecision | None = None,
    ) -> dict[str, Any]:
        """The parameter of a `run_task` besides its key: these steps, the tool, a decision.

        Args:
            tool: The node's tool.
            arguments: A `persona_task`'s arguments (see `_Tool`); None for a graph node.
            decided: The decision of a node nobody can ask about, made in the flow
                body (see `decide_now`): outside the key, as a decision made in the
                run task would be.
        """
        return {"call": quote(_Call(self, _Tool(tool, arguments), decided))}

    def remote_task(
        self, node_id: str, tool: Callable[..., Any], options: PersonaTaskOptions
    ) -> Task:
        """`run_task` for a runner of other processes (Dask, a process pool).

        Its task holds nothing of this process: its inputs must carry the decision
        made in the flow body and the ``tool``'s import path (see `import_path`).
        """
        run_name = RunName(node_id, options.get("task_run_name"))
        fn = _arun_elsewhere if is_async(tool) else _run_elsewhere
        return self._task(fn, "run", node_id, options, run_name)

    def run(
        self,
        node_id: str,
        inputs: dict[str, Any],
        tool: _Tool,
        decided: FinalDecision | None = None,
    ) -> Any:
        """The run task's work: decide if nobody did, then call the tool.

        The decision is ``decided`` (made in the flow body for a node that cannot
        be asked about, outside the key), the one in the inputs (made in a decide
        step), or else made here (a `persona_task` nobody can ask about).

        Returns a graph node's ``{"decision": ..., "output": ...}``: a summary of the
        decision the tool ran with and the tool's output, both small on purpose
        (Prefect walks every result a dependent receives); a `persona_task`'s output
        alone.
        """
        (decision, context), (args, kwargs) = self._start(node_id, inputs, tool, decided)
        output = _sync_output(node_id, tool.fn(context, *args, **kwargs))
        return self._finish(node_id, tool, decision, context, output)

    async def arun(
        self,
        node_id: str,
        inputs: dict[str, Any],
        tool: _Tool,
        decided: FinalDecision | None = None,
    ) -> Any:
        """`run` for an ``async def`` tool: the same, awaiting it.

        A decision made here is made in a worker thread: the agent is sync.
        """
        if inputs["decision"] is None and decided is None:
            started = await asyncio.to_thread(self._start, node_id, inputs, tool)
        else:
            started = self._start(node_id, inputs, tool, decided)
        (decision, context), (args, kwargs) = started
        output = await tool.fn(context, *args, **kwargs)
        return self._finish(node_id, tool, decision, context, output)

    def _start(
        self,
        node_id: str,
        inputs: dict[str, Any],
        tool: _Tool,
        decided: FinalDecision | None = None,
    ) -> tuple[
        tuple[FinalDecision | ClarifyDecision, NodeContext],
        tuple[tuple[Any, ...], dict[str, Any]],
    ]:
        """The tool's decision (made now if nobody did) and context, its arguments."""
        call: tuple[tuple[Any, ...], dict[str, Any]] = ((), {})
        if tool.arguments is not None:
            # Resolved by Prefect by now, futures and all; checked before the tool runs.
            tool.arguments.check(inputs["arguments"], resolved=True)
            call = tool.arguments.call(inputs["arguments"])
        made: FinalDecision | ClarifyDecision | None = decided
        if inputs["decision"] is None and made is None:
            made = self.decide_now(node_id, run_request(inputs))
        self.counter.add("tool_executions")
        return _node_context(inputs, made), call

    def decide_now(self, node_id: str, request: PersonaRequest) -> FinalDecision:
        """Decide for a node nobody can ask about, here and now (no step of its own).

        Raises:
            PolicyError: If the policy, having declared it never asks for such a
                node, asks.
        """
        self.counter.add("decisions")
        made = self.runtime.agent.decide(request)
        if isinstance(made, ClarifyDecision):
            raise PolicyError(
                f"{self.runtime.agent.policy!r} declares it never asks for a node without "
                f"required requirements, but asked {made.question!r} for {node_id!r}"
            )
        return made

    @staticmethod
    def _finish(
        node_id: str,
        tool: _Tool,
        decision: FinalDecision | ClarifyDecision,
        context: NodeContext,
        output: Any,
    ) -> Any:
        if tool.arguments is not None:
            return json_inputs(output, f"the output of {node_id!r}")
        return _graph_result(node_id, decision, context, output)

    @staticmethod
    def run_parameters(
        node: NodeInfo,
        *,
        user_id: str,
        query: str,
        requirements: list[Requirement],
        decision: FinalDecision | ClarifyDecision | None,
        answers: list[AnsweredQuestion],
        inputs: dict[str, Any],
        tools: list[str],
        tool_path: str | None = None,
        arguments: dict[str, Any] | None = None,
        element: int | None = None,
    ) -> dict[str, Any]:
        """The run task's keyed parameters: everything its result depends on, as JSON.

        ``decision`` is ``None`` for a node decided without a step (see `bound`);
        ``inputs`` are the run results (or their futures) of the nodes it depends on,
        ``arguments`` a `persona_task`'s, ``element`` its index in a ``.map()``.

        Returns:
            ``inputs``, what is known now (quoted: Prefect would walk every item of it
            on each submit and run), and ``resolved``, what Prefect resolves: the
            upstream results (by `opaque`, unwalked) and the arguments. The key is
            of the two together (`NodeCachePolicy`), as the run task sees them. With
            a ``tool_path``, the parameter of a `remote_task`: one ``inputs``, which
            carries the path, all plain (Dask sends Prefect's annotations, tuples,
            as lists).
        """
        known: dict[str, Any] = {
            "node": _json.loads(node.model_dump_json()),
            "user_id": user_id,
            "query": query,
            "requirements": [_json.loads(r.model_dump_json()) for r in requirements],
            "decision": None if decision is None else _json.loads(decision.model_dump_json()),
            "answers": [a.model_dump(mode="json") for a in answers],
            "tools": tools,
        }
        if element is not None:
            known["element"] = element
        if tool_path is not None:
            return {"inputs": known | {"inputs": inputs, "tool": tool_path}}
        resolved: dict[str, Any] = {"inputs": {name: opaque(v) for name, v in inputs.items()}}
        if arguments is not None:
            resolved["arguments"] = arguments
        return {"inputs": quote(known), "resolved": resolved}


def _retrying_outages(work: Callable[[Any], Any], inputs: Any) -> Any:
    """``work(inputs)``, tried again after a store outage as the pre-hook's tasks retry it."""
    delay = float(cast(float, PRE_HOOK_OPTIONS.get("retry_delay_seconds") or 0))
    for _ in range(int(PRE_HOOK_OPTIONS.get("retries") or 0)):
        try:
            return work(inputs)
        except StoreUnavailableError:
            time.sleep(delay)
    return work(inputs)  # the last attempt: its outage is the caller's


def _default(decision: ClarifyDecision, why: str) -> str:
    """The declared default of the requirement ``decision`` asks about.

    Raises:
        ClarificationBudgetError: If it has none (``why`` says why it was needed).
    """
    request = decision.request
    wanted = (decision.requirement or "").casefold()
    for requirement in request.requirements if request is not None else []:
        if requirement.name.casefold() == wanted and requirement.default is not None:
            return requirement.default
    error = ClarificationBudgetError if "budget" in why else ClarificationTimeoutError
    raise error(
        f"{why} and {decision.question!r} has no default to run with: declare "
        f"Requirement({decision.requirement or '...'!r}, default=...) or answer it"
    )


def node_request(
    node: NodeInfo, requirements: list[Requirement], *, user_id: str, query: str, tools: list[str]
) -> PersonaRequest:
    """The request a graph node is decided on: the user's, at ``node``, with ``requirements``."""
    return PersonaRequest(
        user_id=user_id,
        query=query,
        node=node,
        requirements=requirements,
        additional_tools=tools,
    )


def run_request(inputs: dict[str, Any]) -> PersonaRequest:
    """The request a node is decided on, from its run task's ``inputs``."""
    return PersonaRequest(
        user_id=inputs["user_id"],
        query=inputs["query"],
        node=NodeInfo.model_validate(inputs["node"]),
        requirements=inputs["requirements"],
        additional_tools=inputs["tools"],
    )


def _node_context(
    inputs: dict[str, Any], made: FinalDecision | ClarifyDecision | None = None
) -> tuple[FinalDecision | ClarifyDecision, NodeContext]:
    """The decision of a run task and the `NodeContext` of its ``inputs``.

    The decision is the one ``made`` in the task, as it is (never through JSON), or
    else the one the flow body made, from the inputs.
    """
    decision = made if made is not None else parse_decision(_json.dumps(inputs["decision"]))
    return decision, NodeContext.build(
        node=NodeInfo.model_validate(inputs["node"]),
        user_id=inputs["user_id"],
        query=inputs["query"],
        decision=decision,
        answers=[AnsweredQuestion.model_validate(a) for a in inputs["answers"]],
        inputs={name: result["output"] for name, result in inputs["inputs"].items()},
        tools=inputs["tools"],
    )


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


def _graph_result(
    node_id: str, decision: FinalDecision | ClarifyDecision, context: NodeContext, output: Any
) -> dict[str, Any]:
    """A graph node's run result: a summary of its decision, and its output."""
    output = json_inputs(output, f"the output of {node_id!r}")
    return {"decision": summarise(decision, context.answers), "output": output}


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
