"""Settling a node before it runs: decide, and while something is missing, ask and learn.

Every node, a graph's or a `persona_task`'s, is settled in the flow body, where a
question can pause or suspend the run, before it is submitted: `Settler.settle` for
one node (each round of deciding a kept step, see `Settler.kept`), `Settler.settle_all`
for many at once (one reading of memory, one kept record: the early check and the
nodes nobody can be asked about). A kept step is written to the result store under
its key, so a resumed or replayed run reads it back instead of deciding again; the
answers are kept per episode (`EpisodeAnswers`) and learned in a Prefect task,
cached like every step. The outcome is a `Settled` node, from which its `NodeCall`
is made.
"""

from __future__ import annotations

import functools
import itertools
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, cast

from prefect.futures import wait
from prefect.logging import get_run_logger
from prefect.results import ResultStore
from prefect.utilities.annotations import quote

from autopersona_flows import _json
from autopersona_flows.agent.agent import PersonaAgent
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
    PolicyError,
    StoreUnavailableError,
)
from autopersona_flows.flows.cache_policies import node_cache_key
from autopersona_flows.flows.calls import _EMBEDDINGS, NodeCall, as_json
from autopersona_flows.flows.clarification import (
    ask_all,
    field_names,
    form_key,
    record_answered,
    record_defaults,
    response_key,
    running_again,
)
from autopersona_flows.flows.context import AnsweredQuestion
from autopersona_flows.flows.episodes import (
    Asking,
    EpisodeAnswers,
    Given,
    read_kept,
    result_store,
)
from autopersona_flows.flows.locks import step_locks
from autopersona_flows.flows.options import PRE_HOOK_OPTIONS, build_task
from autopersona_flows.flows.reports import StepCounter
from autopersona_flows.flows.runtime import PersonaRuntime, current_flow_run_id
from autopersona_flows.flows.sharing import note_asking, share_answers

__all__ = ["NodePlan", "Settled", "Settler", "episode_of"]

Decision = FinalDecision | ClarifyDecision


def episode_of(runtime: PersonaRuntime, episode_id: str | None) -> str:
    """The episode a run's cache keys belong to: given, configured, or the flow run's id."""
    return episode_id or runtime.episode_id or str(current_flow_run_id())


@dataclass(frozen=True)
class NodePlan:
    """What a node needs to be settled: the request it is decided on, and where it runs.

    Attributes:
        node: The node as the agent is told of it.
        requirements: What it must know.
        user_id: Whose memory to consult.
        query: The user's request.
        tools: The graph's node ids (none for a `persona_task`).
        element: A `persona_task` element's index in a ``.map()``.
    """

    node: NodeInfo
    requirements: list[Requirement]
    user_id: str
    query: str
    tools: list[str] = field(default_factory=list)
    element: int | None = None

    @functools.cached_property
    def request(self) -> PersonaRequest:
        """The request the node is decided on."""
        return PersonaRequest(
            user_id=self.user_id,
            query=self.query,
            node=self.node,
            requirements=self.requirements,
            additional_tools=self.tools,
        )

    @functools.cached_property
    def keyed(self) -> dict[str, Any]:
        """The request as JSON (and the element's index): what its decide steps are keyed by."""
        request = as_json(self.request)
        return request if self.element is None else request | {"element": self.element}

    def call(self, settled: Settled, tool: str | None = None) -> NodeCall:
        """The node's `NodeCall` once it is ``settled`` (``tool``: its import path, if needed)."""
        return NodeCall(
            node=self.node,
            user_id=self.user_id,
            query=self.query,
            requirements=self.requirements,
            decision=settled.decision,
            answers=settled.answers,
            tools=self.tools,
            element=self.element,
            tool=tool,
        )


class Settled(NamedTuple):
    """A settled node.

    Attributes:
        decision: The decision it runs with.
        answers: The questions answered for it, in order.
        operations: What learning the answers did to memory (ids, never contents).
    """

    decision: Decision
    answers: list[AnsweredQuestion]
    operations: list[dict[str, str]]


# The learn task's function: the agent and the question are outside its key (see
# `NodeCachePolicy`), quoted so that Prefect passes them untouched.
def _learn(
    episode_id: str,
    node_id: str,
    inputs: dict[str, Any],
    agent: PersonaAgent,
    decision: ClarifyDecision,
) -> Any:
    learned = agent.learn(
        inputs["user_id"],
        decision,
        inputs["answer"],
        flow_run_id=str(current_flow_run_id()),
        node=node_id,
    )
    return {
        "operation": learned.operation,
        "memory_id": learned.record.id if learned.record else None,
        "target_id": learned.target_id,
    }


class Settler:
    """Settles the nodes of one flow run (one episode): decides, asks, learns.

    Args:
        runtime: The agent and the options of asking.
        episode_id: The episode its steps are keyed by.
        counter: Counts the decisions made and questions asked.
    """

    def __init__(self, runtime: PersonaRuntime, episode_id: str, counter: StepCounter) -> None:
        self.runtime = runtime
        self.episode_id = episode_id
        self.counter = counter
        # Only runs sharing an episode id can run its steps at once: an episode of
        # the run's own id has no other run, and its steps need no locks.
        self.shared = episode_id != str(current_flow_run_id())

    @functools.cached_property
    def _results(self) -> ResultStore:
        return result_store(self.runtime.result_storage)

    def may_ask(self, requirements: Sequence[Requirement]) -> bool:
        """Whether the agent may ask before a node with these requirements.

        A policy declares ``asks_without_requirements = False`` to promise it never
        asks for a node without required requirements (`EvidencePolicy` does); such
        nodes can be settled all at once (`settle_all`). A policy that does not say
        is assumed to ask anywhere.
        """
        policy = self.runtime.agent.policy
        return any(r.required for r in requirements) or bool(
            getattr(policy, "asks_without_requirements", True)
        )

    def settle(
        self,
        plan: NodePlan,
        *,
        in_flight: Sequence[Any] = (),
        answered: Sequence[AnsweredQuestion] = (),
        retries: int | None = None,
    ) -> Settled:
        """Decide, and while the decision is a question, ask, learn and decide again.

        Each round is a kept step keyed by the answers given before it, so a replay
        rebuilds every round from the result store and the kept answers and asks
        nothing again. A question already answered at this node is not asked twice:
        the node then runs with the answers it has. ``answered`` are the questions of
        its requirements answered before (see `ask_early`); a question waits for
        ``in_flight`` (futures) before it pauses, so a suspended run loses no work.

        Args:
            plan: The node.
            in_flight: What runs meanwhile.
            answered: Answers given before, at the early check.
            retries: How often a store outage is retried (the pre-hook's by default).

        Raises:
            PolicyError: If the policy asks more questions than the node has
                requirements (plus one), each a new one; or asks for a node it
                declared it never asks for.
        """
        answers = list(answered)
        operations: list[dict[str, str]] = []
        asks = self.may_ask(plan.requirements)
        for round_ in itertools.count(1):
            given = [as_json(answer) for answer in answers]
            inputs = plan.keyed | {"answered": given} if answers else plan.keyed
            decision = self.kept(
                "decide", plan.node.id, inputs, lambda: self._decide(plan.request), retries
            )
            if isinstance(decision, FinalDecision) or _answered(decision, answers):
                return Settled(decision, answers, operations)
            if not asks:
                self.unasked(plan.node.id, decision)
            if len(answers) > len(plan.requirements):
                raise PolicyError(
                    f"{self.runtime.agent.policy!r} asked {len(answers) + 1} questions for "
                    f"{plan.node.id!r}, which has {len(plan.requirements)} requirements: last "
                    f"{decision.question!r}"
                )
            [reply] = self.ask([(plan.node.id, decision)], plan.user_id, in_flight)
            suffix = f"-{round_}" if round_ > 1 else ""
            answer, operation = self.remember(plan.node.id, suffix, plan.user_id, decision, reply)
            answers.append(answer)
            operations += operation
        raise AssertionError("unreachable: the rounds never end")

    def unasked(self, node_id: str, decision: Decision) -> FinalDecision:
        """``decision`` for a node the policy declared it never asks for (see `may_ask`).

        Raises:
            PolicyError: If it asks.
        """
        if isinstance(decision, ClarifyDecision):
            raise PolicyError(
                f"{self.runtime.agent.policy!r} declares it never asks for a node without "
                f"required requirements, but asked {decision.question!r} for {node_id!r}"
            )
        return decision

    def settle_all(
        self, plans: Mapping[str, NodePlan], *, kind: str = "decide", retries: int | None = None
    ) -> dict[str, Decision]:
        """Decide each of ``plans`` (by id) at once, each in a kept step of its own.

        Each is kept under ``kind``, its node and its request: by default the step
        the first round of `settle` keeps, so a node decided here and one decided on
        its own (after an outage, or by a replay) meet the same step. Those kept
        already are read back; the others are decided on one state of memory, each
        bank read once for them all, then each is kept, unless another run kept it
        meanwhile (its decision wins).

        Raises:
            StoreUnavailableError: If the store stays unreachable past ``retries``;
                nothing is kept then.
        """
        keys = {id_: self._key(kind, plan.node.id, plan.keyed) for id_, plan in plans.items()}
        made = {plan_id: self._read(key) for plan_id, key in keys.items()}
        missing = [plan_id for plan_id, decision in made.items() if decision is None]
        if missing:

            def decide_all() -> dict[str, Decision]:
                with self.runtime.agent.retriever.reading():
                    return {plan_id: self._decide(plans[plan_id].request) for plan_id in missing}

            decided: dict[str, Decision] = _retrying_outages(decide_all, retries)
            for plan_id in missing:
                made[plan_id] = self._once(keys[plan_id], functools.partial(decided.get, plan_id))
        return cast(dict[str, Decision], made)

    def _decide(self, request: PersonaRequest) -> Decision:
        self.counter.decided()
        return self.runtime.agent.decide(request)

    def kept(
        self,
        kind: str,
        node_id: str,
        inputs: dict[str, Any],
        work: Callable[[], Decision],
        retries: int | None = None,
    ) -> Decision:
        """``work()`` (a decision), kept in the result store.

        Kept under the key of ``kind``, the node and ``inputs``: what the decision
        depends on. A resumed or replayed run reads it back instead of deciding again.
        A store outage is retried ``retries`` times (the pre-hook's tasks' by default,
        `PRE_HOOK_OPTIONS`).
        """
        key = self._key(kind, node_id, inputs)
        return self._once(key, lambda: _retrying_outages(work, retries))

    def _key(self, kind: str, node_id: str, inputs: dict[str, Any]) -> str:
        return node_cache_key(kind, self.episode_id, node_id, inputs)

    def _read(self, key: str) -> Decision | None:
        kept = read_kept(self._results, key)
        return None if kept is None else parse_decision(kept)

    def _once(self, key: str, work: Callable[[], Decision | None]) -> Decision:
        """The decision kept under ``key``, or ``work()``'s, kept there.

        A step of a shared episode holds its step lock, so of two runs at once one
        decides and the other reads.
        """
        holder = uuid.uuid4().hex
        locks = step_locks(self.runtime.result_storage) if self.shared else None
        if locks is not None:
            locks.acquire_lock(key, holder)
        try:
            kept = self._read(key)
            if kept is not None:
                return kept
            made = cast(Decision, work())
            # JSON as it is dumped, never a tree of dicts for the garbage collector.
            self._results.write(_json.Fragment(made.model_dump_json(exclude=_EMBEDDINGS)), key=key)
            return made
        finally:
            if locks is not None:
                locks.release_lock(key, holder)

    def remember(
        self, node_id: str, suffix: str, user_id: str, decision: ClarifyDecision, given: Given
    ) -> tuple[AnsweredQuestion, list[dict[str, str]]]:
        """Learn the answer to the question of ``decision`` in a learn step of the node.

        A default nobody answered is not the person's preference: it is not learned.

        Returns:
            The answered question, and what learning it did to memory (if it did).
        """
        answered = AnsweredQuestion(
            question=decision.question,
            requirement=decision.requirement,
            answer=given.answer,
            source="default" if given.default else "answered",
        )
        if given.default:
            return answered, []
        storage, agent = self.runtime.result_storage, self.runtime.agent
        task = build_task(
            _learn,
            "learn",
            f"learn-{node_id}{suffix}",
            storage,
            PRE_HOOK_OPTIONS,
            run_name=None,
            locked=self.shared,
        )
        learned: dict[str, Any] = cast(  # a sync task's result, not a coroutine
            dict[str, Any],
            task(
                episode_id=self.episode_id,
                node_id=node_id,
                inputs={"question": decision.question, "answer": given.answer, "user_id": user_id},
                agent=quote(agent),
                decision=quote(decision),
            ),
        )
        replaced = learned["operation"] in ("update", "delete")
        operation = {
            "node": node_id,
            "requirement": decision.requirement or "",
            "operation": learned["operation"],
            "memory id": learned["memory_id"] or "",
            "replaced": (learned.get("target_id") or "") if replaced else "",
        }
        return answered.model_copy(update={"memory_id": learned["memory_id"]}), [operation]

    def ask(
        self,
        questions: list[tuple[str, ClarifyDecision]],
        user_id: str,
        in_flight: Sequence[Any],
    ) -> list[Given]:
        """The answers to ``questions`` (each of a node): those kept, the others asked at once.

        The questions no earlier run of the episode got an answer to are asked in one
        form (see `ask_all`), as many as the run's question
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
        heard = [n for n, answer in enumerate(given) if answer is not None and answer.heard]
        if heard:  # answered while this run (or one before it) was suspended
            record_answered(
                [questions[n] for n in heard], [cast(Given, given[n]).answer for n in heard]
            )
            _share(user_id, [questions[n][1] for n in heard], [given[n] for n in heard])
        missing = [n for n, answer in enumerate(given) if answer is None]
        budget = self.runtime.question_budget
        room = len(missing) if budget is None else max(0, budget - self.counter.clarifications)
        for n in missing[room:]:
            given[n] = Given(_default(questions[n][1], "the run's question budget is spent"), True)
        asking = [questions[n] for n in missing[:room]]
        if asking:
            asked = self._asked(asking, answers, user_id, in_flight)
            for n, answer in zip(missing[:room], asked, strict=True):
                given[n] = answer
        for n in missing:
            node_id, decision = questions[n]
            answers.keep(node_id, user_id, decision, cast(Given, given[n]))
        if asking:  # once kept: sharing is a courtesy that must not cost this run its answers
            shared = missing[:room]
            _share(user_id, [questions[n][1] for n in shared], [given[n] for n in shared])
        return [answer for answer in given if answer is not None]

    def _asked(
        self,
        asking: list[tuple[str, ClarifyDecision]],
        answers: EpisodeAnswers,
        user_id: str,
        in_flight: Sequence[Any],
    ) -> list[Given]:
        """Ask ``asking`` in one form, noting first who asks (see `EpisodeAnswers`)."""
        self.counter.asked(len(asking))
        wait(list(in_flight))  # nothing runs while we wait, so a suspend loses no work
        for future in in_flight:
            if future.state.is_failed():  # the run fails anyway: ask nobody for it
                future.result()
        pause_key = form_key(asking)
        key = response_key(pause_key, self.runtime)
        run_id = current_flow_run_id()
        fields = field_names([decision for _, decision in asking])
        for (node_id, decision), name in zip(asking, fields, strict=True):
            note = Asking(flow_run_id=run_id, response_key=key, field=name)
            answers.asking(node_id, user_id, decision, note)
        requirements = {f: d.requirement for f, (_, d) in zip(fields, asking, strict=True)}
        if all(requirements.values()):  # what another run's answers may answer (see sharing)
            try:
                note_asking(run_id, pause_key, user_id, cast(dict[str, str], requirements))
            except Exception as exc:  # sharing is a courtesy: the question is asked anyway
                get_run_logger().warning("Could not note the question for other runs: %s", exc)
        try:
            return [Given(answer) for answer in ask_all(asking, self.runtime)]
        except ClarificationTimeoutError:
            if self.runtime.on_timeout != "default":
                raise
            # The server still has the run waiting on this form: it would refuse the
            # next pause and list the question as pending while the tools run.
            running_again(run_id)
            defaults = [Given(_default(d, "nobody answered in time"), True) for _, d in asking]
            record_defaults(asking, [g.answer for g in defaults])
            return defaults


def _answered(decision: ClarifyDecision, answers: Sequence[AnsweredQuestion]) -> bool:
    """Whether ``decision`` asks what ``answers`` answer: the same question or requirement.

    A question is worded for its node, so the same requirement asked at another
    node reads differently; a default (never learned) would otherwise be asked again.
    """
    wanted = (decision.requirement or "").casefold()
    return any(
        a.question == decision.question or (wanted and (a.requirement or "").casefold() == wanted)
        for a in answers
    )


def _share(user_id: str, decisions: Sequence[ClarifyDecision], given: Sequence[Any]) -> None:
    """Answer the other runs waiting on the same questions for the person (see sharing)."""
    answers = {
        str(decision.requirement): answer.answer
        for decision, answer in zip(decisions, given, strict=True)
        if decision.requirement and answer is not None and not answer.default
    }
    if not answers:
        return
    try:
        resumed = share_answers(user_id, answers, current_flow_run_id())
    except Exception as exc:  # a courtesy to other runs: this run has its answers already
        get_run_logger().warning("Could not share the answers with other runs: %s", exc)
        return
    for run_id in resumed:
        get_run_logger().info("Answered flow run %s too: it asked the same", run_id)


def _retrying_outages(work: Callable[[], Any], retries: int | None) -> Any:
    """``work()``, tried again after a store outage, ``retries`` times."""
    if retries is None:
        retries = int(PRE_HOOK_OPTIONS.get("retries") or 0)
    delay = float(cast(float, PRE_HOOK_OPTIONS.get("retry_delay_seconds") or 0))
    for _ in range(retries):
        try:
            return work()
        except StoreUnavailableError:
            time.sleep(delay)
    return work()  # the last attempt: its outage is the caller's


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
