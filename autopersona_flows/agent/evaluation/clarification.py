"""Evaluating the clarification policy: does the agent ask exactly when it must?

An evaluation set is a list of `ClarificationCase` objects: a request, the action
a careful assistant would take (``"final"`` or ``"clarify"``) and, optionally, the
requirement a clarification should ask about and the memory layers a final
decision should draw on. `evaluate_clarification_policy` runs an agent on every
case and returns a `ClarificationReport`. On disk a set is JSONL, one case a line
(`read_clarification_cases`), and the memories it runs against another JSONL file
(`seed_memories`); ``autopersona eval`` runs both.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Literal, Self

import numpy as np
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from autopersona_flows._validation import describe
from autopersona_flows.agent.agent import PersonaAgent
from autopersona_flows.agent.decisions import (
    ClarifyDecision,
    FinalDecision,
    NonBlank,
    PersonaRequest,
)
from autopersona_flows.agent.evaluation._common import (
    f1,
    lines,
    ratio,
    read_cases,
)
from autopersona_flows.errors import EvaluationError
from autopersona_flows.memory.embedders import Embedder, check_vectors, default_embedder
from autopersona_flows.memory.protocol import MemoryStore
from autopersona_flows.memory.records import (
    LAYERS,
    Embedding,
    JsonValue,
    MemoryLayer,
    MemoryRecord,
    UtcDatetime,
)
from autopersona_flows.memory.text import memory_text

__all__ = [
    "CaseResult",
    "ClarificationCase",
    "ClarificationReport",
    "evaluate_clarification_policy",
    "read_clarification_cases",
    "seed_memories",
]

Action = Literal["final", "clarify"]


class ClarificationCase(BaseModel):
    """One labelled request: what the agent is asked, and what it should do.

    Attributes:
        name: Unique within its set; names the case in the report.
        request: The request to decide.
        expected_action: ``"clarify"`` if a careful assistant must ask first,
            ``"final"`` if what memory holds is enough.
        expected_layers: For a final case, the layers the constraints of a good
            decision come from; for a clarify case only ``()`` (a clarification
            applies no constraints). ``None`` leaves the case out of the layer metrics.
        expected_requirement: For a clarify case, the requirement the question
            must be about; it must name one of the request's requirements.
    """

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    name: NonBlank
    request: PersonaRequest
    expected_action: Action
    # Not strict, so a JSON array or a Python list of layers is accepted too.
    expected_layers: Annotated[tuple[MemoryLayer, ...], Field(strict=False)] | None = None
    expected_requirement: NonBlank | None = None

    @field_validator("expected_layers")
    @classmethod
    def _distinct(cls, layers: tuple[MemoryLayer, ...] | None) -> tuple[MemoryLayer, ...] | None:
        if layers is not None and len(set(layers)) != len(layers):
            raise ValueError(f"layers repeat: {list(layers)}")
        return layers

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.expected_action == "clarify" and self.expected_layers:
            raise ValueError(
                "a clarify case expects no layers (a clarification applies no constraints); "
                "set expected_layers to [] or leave it out"
            )
        if self.expected_requirement is not None:
            if self.expected_action != "clarify":
                raise ValueError("expected_requirement is only meaningful for a clarify case")
            names = [requirement.name for requirement in self.request.requirements]
            if self.expected_requirement not in names:
                raise ValueError(
                    f"expected_requirement {self.expected_requirement!r} is not a requirement "
                    f"of the request; it has {names}"
                )
        return self


class CaseResult(BaseModel):
    """What the agent did on one case.

    The decision itself is kept for inspection in Python but left out of
    `ClarificationReport.to_dict`: it quotes memory contents.

    Attributes:
        name: The case's name.
        expected_action: The labelled action.
        action: The action taken; ``None`` if deciding raised.
        correct: Whether ``action`` is the labelled one.
        expected_requirement: The labelled requirement, if any.
        requirement: The requirement the clarification asked about, if any.
        expected_layers: The labelled layers, if any.
        layers: The predicted layers (see `evaluate_clarification_policy`).
        latency_s: Wall time of ``agent.decide``, in seconds.
        error: ``"ExceptionType: message"`` if deciding raised.
        decision: The decision, if there was one.
    """

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    name: str
    expected_action: Action
    action: Action | None
    correct: bool
    expected_requirement: str | None = None
    requirement: str | None = None
    expected_layers: list[MemoryLayer] | None = None
    layers: list[MemoryLayer] = Field(default_factory=list)
    latency_s: float
    error: str | None = None
    decision: FinalDecision | ClarifyDecision | None = Field(default=None, exclude=True)


class ClarificationReport(BaseModel):
    """The metrics of one evaluation run, and every case's result.

    Ratios whose denominator is zero follow one rule: a vacuous ratio is perfect.
    Precision is 1.0 when no clarification was asked (none was unnecessary),
    recall 1.0 when none was needed (none was missed), so a policy that never asks
    on a set that never needs it scores F1 1.0, and one that asks or misses
    anything there scores F1 0.0. F1 is 0.0 when precision and recall both are.
    Metrics over an empty subset (no requirement or layer labels) are ``None``.

    Attributes:
        cases: How many cases ran.
        errors: Cases whose decision raised (each also counts as wrong).
        decision_accuracy: Share of cases decided as labelled.
        necessary_clarifications: Expected clarify, got clarify.
        unnecessary_clarifications: Expected final, got clarify.
        missed_clarifications: Expected clarify, got final, or raised.
        correct_finals: Expected final, got final.
        clarification_precision: necessary / (necessary + unnecessary).
        clarification_recall: necessary / (necessary + missed).
        clarification_f1: Harmonic mean of the two.
        requirement_cases: Cases labelled with an expected requirement.
        requirement_accuracy: Share of those where a clarification asked about it.
        layer_cases: Cases labelled with expected layers.
        layer_coverage: Mean of |predicted ∩ expected| / |expected| (1.0 if none expected).
        layer_precision: Mean of |predicted ∩ expected| / |predicted| (1.0 if none predicted).
        layer_f1: Mean of the per-case harmonic means of the two.
        layer_exact_match: Share of those cases predicting exactly the expected set.
        latency_mean_s: Mean decision latency.
        latency_p50_s: Median decision latency.
        latency_max_s: Slowest decision.
        results: One result per case, in the order given.
    """

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    cases: int
    errors: int
    decision_accuracy: float
    necessary_clarifications: int
    unnecessary_clarifications: int
    missed_clarifications: int
    correct_finals: int
    clarification_precision: float
    clarification_recall: float
    clarification_f1: float
    requirement_cases: int
    requirement_accuracy: float | None
    layer_cases: int
    layer_coverage: float | None
    layer_precision: float | None
    layer_f1: float | None
    layer_exact_match: float | None
    latency_mean_s: float
    latency_p50_s: float
    latency_max_s: float
    results: list[CaseResult]

    def to_dict(self) -> dict[str, Any]:
        """Return the report as JSON-ready data, per-case results included (no decisions)."""
        return self.model_dump(mode="json")

    def result(self, name: str) -> CaseResult:
        """Return the result of the case called ``name``.

        Raises:
            KeyError: If no case has that name.
        """
        for result in self.results:
            if result.name == name:
                return result
        raise KeyError(name)


def _layers_of(decision: FinalDecision | ClarifyDecision | None) -> list[MemoryLayer]:
    if not isinstance(decision, FinalDecision):
        return []
    used = {constraint.layer for constraint in decision.constraints}
    return [layer for layer in LAYERS if layer in used]


def _run(agent: PersonaAgent, case: ClarificationCase) -> CaseResult:
    decision: FinalDecision | ClarifyDecision | None = None
    error = None
    started = time.perf_counter()
    try:
        decision = agent.decide(case.request)
    # One failing case must not hide the others' results; BaseException (Prefect's
    # pause and abort signals, KeyboardInterrupt) still passes through.
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    latency = time.perf_counter() - started
    action = decision.action if decision is not None else None
    return CaseResult(
        name=case.name,
        expected_action=case.expected_action,
        action=action,
        correct=action == case.expected_action,
        expected_requirement=case.expected_requirement,
        requirement=decision.requirement if isinstance(decision, ClarifyDecision) else None,
        expected_layers=None if case.expected_layers is None else list(case.expected_layers),
        layers=_layers_of(decision),
        latency_s=latency,
        error=error,
        decision=decision,
    )


def _layer_scores(result: CaseResult) -> tuple[float, float, float, bool]:
    assert result.expected_layers is not None  # only labelled cases are scored
    expected, predicted = set(result.expected_layers), set(result.layers)
    hits = len(expected & predicted)
    coverage = ratio(hits, len(expected))
    precision = ratio(hits, len(predicted))
    return coverage, precision, f1(precision, coverage), expected == predicted


def evaluate_clarification_policy(
    agent: PersonaAgent, cases: Iterable[ClarificationCase]
) -> ClarificationReport:
    """Run ``agent`` on every case and measure when it asks, about what, and from where.

    The *predicted layers* of a decision are the layers of its constraints for a
    final decision (requirement evidence and guidance alike), and the empty set
    for a clarification, which applies nothing. A case whose decision raises is
    recorded with its ``error`` and counts as wrong (and as a missed
    clarification if it expected one); the run goes on. See `ClarificationReport`
    for every metric and for the treatment of zero denominators.

    Args:
        agent: The agent to evaluate; its store must hold the memories the cases
            were written against (see `seed_memories`).
        cases: The labelled cases.

    Raises:
        EvaluationError: If there are no cases, one is not a `ClarificationCase`,
            or two share a name.
    """
    cases = list(cases)
    if not cases:
        raise EvaluationError("the evaluation set is empty: give at least one ClarificationCase")
    seen: set[str] = set()
    for i, case in enumerate(cases):
        if not isinstance(case, ClarificationCase):
            raise EvaluationError(
                f"cases[{i}] is a {type(case).__name__}, not a ClarificationCase; "
                "build ClarificationCase objects or read a file with read_clarification_cases"
            )
        if case.name in seen:
            raise EvaluationError(f"two cases are called {case.name!r}; case names must be unique")
        seen.add(case.name)

    results = [_run(agent, case) for case in cases]

    def count(expected: Action, got: Action | None) -> int:
        return sum(r.expected_action == expected and r.action == got for r in results)

    necessary = count("clarify", "clarify")
    unnecessary = count("final", "clarify")
    missed = count("clarify", "final") + count("clarify", None)
    precision = ratio(necessary, necessary + unnecessary)
    recall = ratio(necessary, necessary + missed)

    with_requirement = [r for r in results if r.expected_requirement is not None]
    asked_right = sum(
        r.action == "clarify" and r.requirement == r.expected_requirement for r in with_requirement
    )
    labelled = [_layer_scores(r) for r in results if r.expected_layers is not None]

    def mean(values: Iterable[float]) -> float | None:
        values = list(values)
        return statistics.fmean(values) if values else None

    latencies = [r.latency_s for r in results]
    return ClarificationReport(
        cases=len(results),
        errors=sum(r.error is not None for r in results),
        decision_accuracy=sum(r.correct for r in results) / len(results),
        necessary_clarifications=necessary,
        unnecessary_clarifications=unnecessary,
        missed_clarifications=missed,
        correct_finals=count("final", "final"),
        clarification_precision=precision,
        clarification_recall=recall,
        clarification_f1=f1(precision, recall),
        requirement_cases=len(with_requirement),
        requirement_accuracy=(asked_right / len(with_requirement) if with_requirement else None),
        layer_cases=len(labelled),
        layer_coverage=mean(s[0] for s in labelled),
        layer_precision=mean(s[1] for s in labelled),
        layer_f1=mean(s[2] for s in labelled),
        layer_exact_match=mean(float(s[3]) for s in labelled),
        latency_mean_s=statistics.fmean(latencies),
        latency_p50_s=statistics.median(latencies),
        latency_max_s=max(latencies),
        results=results,
    )


def read_clarification_cases(path: str | Path) -> list[ClarificationCase]:
    """Read an evaluation set: one `ClarificationCase` as JSON a line (blank lines skipped).

    Raises:
        EvaluationError: If the file cannot be read, a line is not a valid case
            (the message names the line and the field), two cases share a name,
            or the file holds no case.
    """
    return read_cases(path, ClarificationCase, "the evaluation set")


class _SeedMemory(BaseModel):
    """One line of a memories file: a memory of one user, with its timestamps if given."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    user_id: NonBlank
    layer: MemoryLayer
    content: dict[str, JsonValue]
    created_at: UtcDatetime | None = None
    updated_at: UtcDatetime | None = None


def seed_memories(
    store: MemoryStore, path: str | Path, embedder: Embedder | None = None
) -> dict[str, int]:
    """Write the memories of a JSONL file into ``store``, embedded, timestamps kept.

    Each line is ``{"user_id", "layer", "content", "created_at"?, "updated_at"?}``
    (timestamps in ISO 8601 with a zone; ``updated_at`` defaults to
    ``created_at``, both to now). Memories are added as they are, not resolved
    against each other, so two preferences of one topic both stay and the newer
    ``updated_at`` decides which one wins. The whole file is validated first, and
    users who already have memories are refused, so a seeded store always holds
    exactly the file and a run on it is reproducible.

    Args:
        store: Where to write.
        path: The memories file.
        embedder: The embedder the store's retriever uses; the shipped `SentenceEncoder` by default.

    Returns:
        How many memories were stored, per user.

    Raises:
        EvaluationError: If the file cannot be read, a line is invalid (the message
            names it), or a user in it already has memories in ``store``.
    """
    embedder = embedder if embedder is not None else default_embedder()
    seeds: list[tuple[str, MemoryRecord]] = []
    for number, line in lines(path):
        try:
            seed = _SeedMemory.model_validate_json(line)
            timestamps = {
                name: value
                for name in ("created_at", "updated_at")
                if (value := getattr(seed, name)) is not None
            }
            record = MemoryRecord.model_validate(
                {"layer": seed.layer, "content": seed.content, **timestamps}
            )
        except ValidationError as exc:
            raise EvaluationError(f"{path}:{number}: invalid memory: {describe(exc)}") from None
        seeds.append((seed.user_id, record))
    users = list(dict.fromkeys(user_id for user_id, _ in seeds))
    taken = [user_id for user_id in users if not store.snapshot(user_id).is_empty]
    if taken:
        raise EvaluationError(
            f"refusing to seed users who already have memories in {store!r}: {taken}; "
            "seed into an empty store so the evaluation is reproducible"
        )
    texts = [memory_text(record.content) for _, record in seeds]
    vectors = check_vectors(embedder, texts, embedder.embed(texts)) if texts else np.empty((0, 0))
    banks: dict[tuple[str, MemoryLayer], list[MemoryRecord]] = {}
    for (user_id, record), vector in zip(seeds, vectors, strict=True):
        embedding = Embedding.of(embedder.name, vector)
        banks.setdefault((user_id, record.layer), []).append(
            record.model_copy(update={"embedding": embedding})
        )
    for (user_id, layer), records in banks.items():
        store.add_many(user_id, layer, records)  # one atomic write per bank, file order kept
    return dict(Counter(user_id for user_id, _ in seeds))
