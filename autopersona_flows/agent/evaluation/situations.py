"""Preferences that depend on the situation: learn by asking and by correction, then act.

A `SituationEpisode` is one person whose value for one requirement depends on the
situation ("on work trips, the aisle; with the kids, the window"), and a series of
requests, each in a situation that its words make evident without naming it. The
agent decides each request; a simulated person answers its question with what
holds in that situation, and corrects a wrong value the same way. Rounds come in
three phases: ``learn`` (the first requests), ``act`` (after learning) and
``after`` (from the round the person's preferences change on, unannounced).
`evaluate_situations` reports, per phase, how often the agent acted on the right
value, how many questions it asked a task, and how often it asked what it had been
told for that situation already.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Annotated, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from autopersona_flows.agent.agent import PersonaAgent
from autopersona_flows.agent.decisions import (
    ClarifyDecision,
    FinalDecision,
    NodeInfo,
    NonBlank,
    PersonaDecision,
    PersonaRequest,
    Requirement,
)
from autopersona_flows.agent.evaluation._common import ratio, read_cases
from autopersona_flows.errors import EvaluationError
from autopersona_flows.memory.bank import MemoryBank
from autopersona_flows.memory.jsonl import JsonlMemoryStore
from autopersona_flows.memory.protocol import MemoryStore

__all__ = [
    "PHASES",
    "SituationEpisode",
    "SituationReport",
    "evaluate_situations",
    "read_situation_episodes",
]

Phase = Literal["learn", "act", "after"]
PHASES: tuple[Phase, ...] = ("learn", "act", "after")


class _Model(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class Preference(_Model):
    """What the person wants in one situation (``None``: in general), and how they say it."""

    situation: str | None
    value: NonBlank
    says: Annotated[list[NonBlank], Field(min_length=1)]


class Change(_Model):
    """Preferences that change, unannounced, from round ``at_round`` on."""

    at_round: Annotated[int, Field(ge=0)]
    preferences: Annotated[list[Preference], Field(min_length=1)]


class Round(_Model):
    """One request, in one of the person's situations (``None``: the general one)."""

    phase: Phase
    query: NonBlank
    situation: str | None


class SituationEpisode(_Model):
    """One person, one requirement whose value depends on the situation, many requests."""

    name: NonBlank
    user_id: NonBlank
    node: NodeInfo
    requirement: Requirement
    preferences: Annotated[list[Preference], Field(min_length=1)]
    change: Change | None = None
    rounds: Annotated[list[Round], Field(min_length=1)]

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        known = {p.situation for p in self.preferences}
        if self.change is not None:
            known |= {p.situation for p in self.change.preferences}
            if self.change.at_round >= len(self.rounds):
                raise ValueError(f"change.at_round {self.change.at_round} is past the rounds")
        unknown = {r.situation for r in self.rounds if r.situation} - {s for s in known if s}
        if unknown:
            raise ValueError(f"rounds name situations no preference has: {sorted(unknown)}")
        return self


class PhaseScores(_Model):
    """How the agent did in one phase."""

    rounds: int
    right: float
    right_unasked: float
    questions_per_task: float
    repeat_question_rate: float | None


class SituationReport(_Model):
    """Per phase, and overall (see `evaluate_situations`)."""

    phases: dict[str, PhaseScores]
    overall: PhaseScores
    episodes: int


def read_situation_episodes(path: str | Path) -> list[SituationEpisode]:
    """Read one `SituationEpisode` as JSON a line.

    Raises:
        EvaluationError: If the file cannot be read or a line is invalid (named).
    """
    return read_cases(path, SituationEpisode, "the episodes file")


class _Outcome(_Model):
    phase: Phase
    right: bool
    asked: bool
    repeated: bool


AgentFactory = Callable[[MemoryStore], PersonaAgent]


def evaluate_situations(
    episodes: Iterable[SituationEpisode], agent: AgentFactory | None = None
) -> SituationReport:
    """Run every episode with a simulated person; score per phase.

    In each round the agent decides the request. A question is answered with what
    holds in the round's situation (the person's words, in turn), then the agent
    decides again. A value that is not what the person wants is corrected
    (`PersonaAgent.correct`) with what holds. A round is *right* when the agent
    acted on the right value, after at most its one question; a *repeat* is a
    question about a situation whose value the person had already said.

    Args:
        episodes: The episodes; each gets a person of its own.
        agent: Builds the agent over an empty store; the default agent by default.

    Raises:
        EvaluationError: If there are no episodes.
    """
    episodes = list(episodes)
    if not episodes:
        raise EvaluationError("no episodes to run")
    build = agent or (lambda store: PersonaAgent(MemoryBank(store)))
    outcomes: list[_Outcome] = []
    with tempfile.TemporaryDirectory(prefix="autopersona-situations-") as folder:
        runner = build(JsonlMemoryStore(folder))
        for episode in episodes:
            outcomes += _run(runner, episode)
    return SituationReport(
        phases={
            phase: _scores([o for o in outcomes if o.phase == phase])
            for phase in PHASES
            if any(o.phase == phase for o in outcomes)
        },
        overall=_scores(outcomes),
        episodes=len(episodes),
    )


def _run(agent: PersonaAgent, episode: SituationEpisode) -> list[_Outcome]:
    wants = {p.situation: p for p in episode.preferences}
    told: set[str | None] = set()
    said = 0
    outcomes = []
    user = f"{episode.name}/{episode.user_id}"
    for i, round_ in enumerate(episode.rounds):
        if episode.change is not None and i == episode.change.at_round:
            for preference in episode.change.preferences:
                wants[preference.situation] = preference
                told.discard(preference.situation)
        wanted = wants.get(round_.situation) or wants[None]
        request = PersonaRequest(
            user_id=user,
            query=round_.query,
            node=episode.node,
            requirements=[episode.requirement],
        )
        decision = agent.decide(request)
        asked = repeated = False
        if isinstance(decision, ClarifyDecision):
            asked, repeated = True, wanted.situation in told
            agent.learn(user, decision, wanted.says[said % len(wanted.says)])
            said += 1
            told.add(wanted.situation)
            decision = agent.decide(request)
        right = _acts_on(decision, episode.requirement, wanted.value)
        if not right:
            agent.correct(request, episode.requirement.name, wanted.says[said % len(wanted.says)])
            said += 1
            told.add(wanted.situation)
        outcomes.append(_Outcome(phase=round_.phase, right=right, asked=asked, repeated=repeated))
    return outcomes


def _acts_on(decision: PersonaDecision, requirement: Requirement, value: str) -> bool:
    if not isinstance(decision, FinalDecision):
        return False
    wanted = value.casefold()
    for constraint in decision.constraints:
        if constraint.requirement != requirement.name:
            continue
        got = (constraint.value or constraint.text).casefold()
        if requirement.options:
            return got == wanted
        return wanted in got or wanted in constraint.text.casefold()
    return False


def _scores(outcomes: list[_Outcome]) -> PhaseScores:
    asked = [o for o in outcomes if o.asked]
    return PhaseScores(
        rounds=len(outcomes),
        right=ratio(sum(o.right for o in outcomes), len(outcomes)),
        right_unasked=ratio(sum(o.right and not o.asked for o in outcomes), len(outcomes)),
        questions_per_task=ratio(len(asked), len(outcomes)),
        repeat_question_rate=ratio(sum(o.repeated for o in asked), len(asked)) if asked else None,
    )
