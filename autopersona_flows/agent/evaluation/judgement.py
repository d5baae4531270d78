"""The judgement benchmark: apply what memory holds, ask what it cannot answer, never twice.

A `JudgementCase` brings its own memories (and optional generated noise), a request
and what a careful assistant would do: the action, the requirement asked about and
its options, the values constraints must carry and the stale values they must not,
the standing constraints guidance must surface, a learn loop (ask, learn, then the
same need in other words must not be asked again) and a consistency group.
`evaluate_judgement` runs an agent over a fresh store holding every case's
memories, each case's people kept apart from every other case's, and reports per
category (`JudgementReport`). The set committed in ``tests/data/judgement`` is
documented in its README; ``autopersona eval`` runs any such file.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Annotated, Any, Literal, Self, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from autopersona_flows._validation import describe
from autopersona_flows.agent.agent import PersonaAgent
from autopersona_flows.agent.decisions import (
    ClarifyDecision,
    FinalDecision,
    NonBlank,
    PersonaRequest,
)
from autopersona_flows.agent.evaluation._common import read_cases
from autopersona_flows.agent.evaluation.noise import noise_memories
from autopersona_flows.agent.evaluation.reports import (
    CategoryScores,
    JudgementReport,
    JudgementResult,
)
from autopersona_flows.errors import EvaluationError
from autopersona_flows.memory.embedders import Embedder, default_embedder
from autopersona_flows.memory.jsonl import JsonlMemoryStore
from autopersona_flows.memory.protocol import MemoryStore
from autopersona_flows.memory.records import (
    JsonValue,
    MemoryLayer,
    MemoryRecord,
    UtcDatetime,
)
from autopersona_flows.memory.retrieval import MemoryRetriever
from autopersona_flows.memory.updates import embed_records

__all__ = ["CATEGORIES", "JudgementCase", "evaluate_judgement", "read_judgement_cases"]

Category = Literal[
    "paraphrase",
    "stated",
    "noisy",
    "evolving",
    "missing",
    "isolation",
    "adherence",
    "consistency",
    "learn",
    "hidden",
    "near_miss",
    "situation",
]
CATEGORIES: tuple[str, ...] = get_args(Category)
"""The categories of the benchmark, in report order."""

Action = Literal["final", "clarify"]


class _Model(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class CaseMemory(_Model):
    """A memory a case brings: whose, which layer, what, and when it was said."""

    user_id: NonBlank | None = None
    layer: MemoryLayer
    content: dict[str, JsonValue]
    at: UtcDatetime


class Noise(_Model):
    """Generated memories for the request's user; see `noise_memories`."""

    count: Annotated[int, Field(ge=1, le=5000)]
    seed: int
    words: Annotated[list[NonBlank], Field(min_length=1)]


class Expectation(_Model):
    """What a careful assistant does with the case's request."""

    action: Action
    requirement: NonBlank | None = None
    options: list[NonBlank] = Field(default_factory=list)
    values: dict[str, NonBlank] = Field(default_factory=dict)
    stale: dict[str, list[NonBlank]] = Field(default_factory=dict)
    guidance: list[NonBlank] = Field(default_factory=list)


class FollowUp(_Model):
    """A later request for the same need, in other words, and the value it must get."""

    request: PersonaRequest
    value: NonBlank


class LearnLoop(_Model):
    """The person's answer to the case's question, and the requests that must not ask again."""

    answer: NonBlank
    then: Annotated[list[FollowUp], Field(min_length=1)]


class JudgementCase(_Model):
    """One labelled situation of the judgement benchmark (see the module documentation).

    Attributes:
        name: Unique in its set.
        category: What it tests (`CATEGORIES`).
        memories: The memories of its people.
        noise: Generated memories sharing words with the request, if any.
        request: What the agent is asked.
        expect: What it should do.
        learn: The learn loop, for a case that must ask first.
        group: Cases of one group must decide alike.
    """

    name: NonBlank
    category: Category
    memories: list[CaseMemory] = Field(default_factory=list)
    noise: Noise | None = None
    request: PersonaRequest
    expect: Expectation
    learn: LearnLoop | None = None
    group: NonBlank | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        names = {requirement.name for requirement in self.request.requirements}
        required = {r.name for r in self.request.requirements if r.required}
        expect = self.expect
        if expect.action == "clarify" and expect.requirement not in required | {None}:
            raise ValueError(f"expect.requirement {expect.requirement!r} is not required here")
        if expect.action == "clarify" and (expect.values or expect.stale or expect.guidance):
            raise ValueError(
                "a clarification applies nothing: values, stale and guidance are for finals"
            )
        if expect.action == "final" and (expect.requirement or expect.options):
            raise ValueError("requirement and options are what a clarification asks about")
        unknown = (set(expect.values) | set(expect.stale)) - names
        if unknown:
            raise ValueError(
                f"values or stale name requirements the request lacks: {sorted(unknown)}"
            )
        if self.learn is not None and expect.action != "clarify":
            raise ValueError(
                "a learn loop starts with a clarification: expect.action must be clarify"
            )
        return self


def read_judgement_cases(path: str | Path) -> list[JudgementCase]:
    """Read a benchmark file: one `JudgementCase` as JSON a line.

    Raises:
        EvaluationError: If the file cannot be read, a line is not a valid case
            (the message names the line and the field), names repeat, or it is empty.
    """
    return read_cases(path, JudgementCase, "the benchmark")


AgentFactory = Callable[[MemoryStore], PersonaAgent]


def evaluate_judgement(
    cases: Iterable[JudgementCase],
    agent: AgentFactory | None = None,
    *,
    embedder: Embedder | None = None,
    store: MemoryStore | None = None,
) -> JudgementReport:
    """Seed every case's memories into one store and run an agent on each case.

    Args:
        cases: The labelled cases.
        agent: Builds the agent to evaluate over the seeded store; the default
            agent (`PersonaAgent` over a `MemoryRetriever` with ``embedder``) if
            not given.
        embedder: Embeds the seeded memories; the shipped `SentenceEncoder` by default. It must
            be the embedder the agent's retriever uses.
        store: An empty store to seed; a temporary JSONL store by default.

    Raises:
        EvaluationError: If there are no cases, or two share a name.
    """
    cases = list(cases)
    if not cases:
        raise EvaluationError("the benchmark is empty: give at least one JudgementCase")
    if len({case.name for case in cases}) != len(cases):
        raise EvaluationError("two cases share a name; case names must be unique")
    embedder = embedder if embedder is not None else default_embedder()
    build = agent or (lambda store: PersonaAgent(MemoryRetriever(store, embedder)))
    with tempfile.TemporaryDirectory(prefix="autopersona-judgement-") as folder:
        bank = store if store is not None else JsonlMemoryStore(folder)
        for case in cases:
            _seed(bank, case, embedder)
        runner = build(bank)
        results = [_run(runner, case) for case in cases]
    groups: dict[str, list[JudgementResult]] = {}
    for case, result in zip(cases, results, strict=True):
        if case.group:
            groups.setdefault(case.group, []).append(result)
    agreed = {name: _agree(members) for name, members in groups.items()}
    by_category = {
        category: CategoryScores.of(
            [r for r in results if r.category == category],
            {n: a for n, a in agreed.items() if any(r.category == category for r in groups[n])},
        )
        for category in CATEGORIES
        if any(r.category == category for r in results)
    }
    return JudgementReport(
        overall=CategoryScores.of(results, agreed), categories=by_category, results=results
    )


def _scoped(case: JudgementCase, user_id: str) -> str:
    """The case's own copy of a user: cases never see each other's people."""
    return f"{case.name}/{user_id}"


def _seed(store: MemoryStore, case: JudgementCase, embedder: Embedder) -> None:
    records: dict[tuple[str, MemoryLayer], list[MemoryRecord]] = {}
    owner = case.request.user_id
    for i, memory in enumerate(case.memories):
        try:
            record = MemoryRecord.model_validate(
                {"layer": memory.layer, "content": memory.content, "created_at": memory.at}
            )
        except ValidationError as exc:
            raise EvaluationError(f"case {case.name!r}: memories[{i}]: {describe(exc)}") from None
        records.setdefault((memory.user_id or owner, memory.layer), []).append(record)
    if case.noise is not None:
        avoid = [
            text for r in case.request.requirements for text in (r.name, r.description, *r.options)
        ]
        for record in noise_memories(
            case.noise.words, case.noise.count, case.noise.seed, avoid=avoid
        ):
            records.setdefault((owner, record.layer), []).append(record)
    for (user_id, layer), batch in records.items():
        embedded = embed_records(embedder, [record.content for record in batch])
        store.add_many(
            _scoped(case, user_id),
            layer,
            [
                record.model_copy(update={"embedding": vector.embedding})
                for record, vector in zip(batch, embedded, strict=True)
            ],
        )


def _request(case: JudgementCase, request: PersonaRequest) -> PersonaRequest:
    return request.model_copy(update={"user_id": _scoped(case, request.user_id)})


def _run(agent: PersonaAgent, case: JudgementCase) -> JudgementResult:
    expect = case.expect
    request = _request(case, case.request)
    # Latency is the decision's: the bank is read into the index first, as a worker
    # would once per person (`MemoryRetriever.load`), not once per decision.
    agent.retriever.load(request.user_id)
    started = time.perf_counter()
    try:
        decision = agent.decide(request)
    # One failing case must not hide the others; Prefect's signals and
    # KeyboardInterrupt (BaseException) still pass through.
    except Exception as exc:
        return JudgementResult(
            name=case.name,
            category=case.category,
            expected_action=expect.action,
            action=None,
            action_correct=False,
            latency_s=time.perf_counter() - started,
            error=f"{type(exc).__name__}: {exc}",
        )
    latency = time.perf_counter() - started
    checks: dict[str, Any] = {}
    if isinstance(decision, ClarifyDecision):
        if expect.requirement is not None:
            checks["requirement_correct"] = decision.requirement == expect.requirement
        if expect.options:
            offered = {option.casefold() for option in decision.options}
            checks["options_offered"] = all(o.casefold() in offered for o in expect.options)
        if case.learn is not None:
            try:
                checks |= _learn_loop(agent, case, decision)
            except Exception as exc:  # see above
                checks |= {"follow_ups": len(case.learn.then), "repeated": 0}
                checks["error"] = f"learn loop: {type(exc).__name__}: {exc}"
    else:
        if expect.values:
            checks["values_carried"] = all(
                _carries(decision, name, value) for name, value in expect.values.items()
            )
        if expect.stale:
            checks["stale_avoided"] = not any(
                _carries(decision, name, old) for name, olds in expect.stale.items() for old in olds
            )
        if expect.guidance:
            shown = " ".join(
                [decision.guidance, *(c.text for c in decision.constraints)]
            ).casefold()
            checks["guidance_surfaced"] = all(text.casefold() in shown for text in expect.guidance)
        if case.learn is not None:
            checks |= {"follow_ups": len(case.learn.then)}  # never got to ask: none carried
    return JudgementResult(
        name=case.name,
        category=case.category,
        expected_action=expect.action,
        action=decision.action,
        action_correct=decision.action == expect.action,
        latency_s=latency,
        decision=decision,
        **checks,
    )


def _carries(decision: FinalDecision, requirement: str, text: str) -> bool:
    wanted = text.casefold()
    return any(
        wanted in constraint.text.casefold() or wanted in (constraint.value or "").casefold()
        for constraint in decision.constraints
        if constraint.requirement == requirement
    )


def _learn_loop(
    agent: PersonaAgent, case: JudgementCase, question: ClarifyDecision
) -> dict[str, int]:
    assert case.learn is not None
    agent.learn(_request(case, case.request).user_id, question, case.learn.answer)
    repeated = carried = 0
    for follow_up in case.learn.then:
        decision = agent.decide(_request(case, follow_up.request))
        if isinstance(decision, ClarifyDecision):
            repeated += 1
            continue
        required = [r.name for r in follow_up.request.requirements if r.required]
        carried += all(_carries(decision, name, follow_up.value) for name in required)
    return {"follow_ups": len(case.learn.then), "repeated": repeated, "follow_ups_carried": carried}


def _agree(members: list[JudgementResult]) -> bool:
    def signature(result: JudgementResult) -> tuple[Any, ...]:
        decision = result.decision
        if not isinstance(decision, FinalDecision):
            return (result.action,)
        # Paraphrased requirement names differ across a group; the values must not.
        return (
            result.action,
            tuple(
                sorted(
                    (c.value or c.text).casefold() for c in decision.constraints if c.requirement
                )
            ),
        )

    return len({signature(member) for member in members}) == 1
