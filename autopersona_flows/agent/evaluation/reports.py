"""The results and metrics of a judgement benchmark run (see `evaluate_judgement`)."""

from __future__ import annotations

import statistics
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field

from autopersona_flows.agent.decisions import ClarifyDecision, FinalDecision
from autopersona_flows.agent.evaluation._common import f1, ratio

__all__ = ["CategoryScores", "JudgementReport", "JudgementResult"]

Action = Literal["final", "clarify"]


class _Model(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class JudgementResult(_Model):
    """What the agent did on one case, check by check (``None``: not applicable)."""

    name: str
    category: str
    expected_action: Action
    action: Action | None
    action_correct: bool
    requirement_correct: bool | None = None
    options_offered: bool | None = None
    values_carried: bool | None = None
    stale_avoided: bool | None = None
    guidance_surfaced: bool | None = None
    follow_ups: int = 0
    repeated: int = 0
    follow_ups_carried: int = 0
    latency_s: float
    error: str | None = None
    decision: FinalDecision | ClarifyDecision | None = Field(default=None, exclude=True)

    @property
    def correct(self) -> bool:
        """Every applicable check passed."""
        checks = (
            self.requirement_correct,
            self.options_offered,
            self.values_carried,
            self.stale_avoided,
            self.guidance_surfaced,
        )
        return (
            self.action_correct
            and all(check is not False for check in checks)
            and self.repeated == 0
            and self.follow_ups_carried == self.follow_ups
        )


class CategoryScores(_Model):
    """The metrics of a set of results (see `JudgementReport` for their definitions)."""

    cases: int
    accuracy: float
    decision_accuracy: float
    clarification_precision: float
    clarification_recall: float
    clarification_f1: float
    unnecessary_question_rate: float | None
    repeat_question_rate: float | None
    adherence: float | None
    near_miss_acceptance: float | None
    consistency: float | None
    latency_p50_ms: float

    @classmethod
    def of(cls, results: list[JudgementResult], groups: dict[str, bool] | None = None) -> Self:
        """Score ``results``; ``groups`` says which consistency groups agreed."""

        def count(expected: Action, got: Action | None) -> int:
            return sum(r.expected_action == expected and r.action == got for r in results)

        necessary = count("clarify", "clarify")
        unnecessary = count("final", "clarify")
        missed = len([r for r in results if r.expected_action == "clarify"]) - necessary
        finals_expected = len([r for r in results if r.expected_action == "final"])
        precision = ratio(necessary, necessary + unnecessary)
        recall = ratio(necessary, necessary + missed)
        follow_ups = sum(r.follow_ups for r in results)
        carried = [
            r.values_carried and r.stale_avoided is not False
            for r in results
            if r.action == "final" and r.values_carried is not None
        ]
        near = [r for r in results if r.category == "near_miss"]
        return cls(
            cases=len(results),
            accuracy=sum(r.correct for r in results) / len(results),
            decision_accuracy=sum(r.action_correct for r in results) / len(results),
            clarification_precision=precision,
            clarification_recall=recall,
            clarification_f1=f1(precision, recall),
            unnecessary_question_rate=unnecessary / finals_expected if finals_expected else None,
            repeat_question_rate=(
                sum(r.repeated for r in results) / follow_ups if follow_ups else None
            ),
            adherence=sum(carried) / len(carried) if carried else None,
            near_miss_acceptance=(
                sum(r.action == "final" for r in near) / len(near) if near else None
            ),
            consistency=sum(groups.values()) / len(groups) if groups else None,
            latency_p50_ms=1000 * statistics.median(r.latency_s for r in results),
        )


class JudgementReport(_Model):
    """Per-category and overall metrics of one benchmark run, and every case's result.

    - *accuracy*: cases where every check passed (action, requirement asked about,
      options offered, values carried, stale values avoided, guidance surfaced, no
      repeated question, follow-ups carrying the learned value);
    - *decision accuracy*: cases decided with the labelled action;
    - *clarification precision / recall / F1*: of the questions asked, and of those
      due (a vacuous ratio is 1.0);
    - *unnecessary-question rate*: final-labelled cases that asked;
    - *repeat-question rate*: learn-loop follow-ups that asked again;
    - *adherence*: final decisions on cases with expected values whose constraints
      carried every value and no stale one;
    - *near-miss acceptance*: near-miss cases answered from the neighbouring topic;
    - *consistency*: groups whose cases all decided alike;
    - *latency p50*: of ``agent.decide``, in milliseconds, with the person's bank
      already read into the retriever's index (as a running worker has it).
    """

    overall: CategoryScores
    categories: dict[str, CategoryScores]
    results: list[JudgementResult]

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data (decisions left out: they quote memories)."""
        return self.model_dump(mode="json")

    def result(self, name: str) -> JudgementResult:
        """The result of the case called ``name``.

        Raises:
            KeyError: If no case has that name.
        """
        for result in self.results:
            if result.name == name:
                return result
        raise KeyError(name)
