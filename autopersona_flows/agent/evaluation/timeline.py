"""The memory-over-time benchmark: does the bank keep up with a person?

A `TimelineCase` is one person's history (sessions with the time each happened,
fed in a given order, out of order for a backfill) and checks made at the end: a
search for an attribute must find its current value first, never an old value,
and never a fact whose end has passed. `evaluate_timeline` ingests each case the
way a library user would (`ingest_task_history` with the default extractor, then
`promote_choices`), searches as of the case's ``now``, and reports per category:

- ``new_first``: of the checks with a current value, those whose first persona
  result holds it;
- ``stale``: checks whose first persona result holds an old value (served as
  current); ``stale_live``: checks for which any current persona memory still
  holds an old value;
- ``expired``: checks of a fact that has ended for which a current result still
  holds it;
- ``messages_per_second``: ingestion throughput (a session counts its messages,
  or one for its request). Every case is a new person, so this includes making
  their banks; ``benchmarks/memory_over_time.py`` measures long chat histories.
"""

from __future__ import annotations

import tempfile
import time
from collections import defaultdict
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

from autopersona_flows.agent.evaluation._common import ratio, read_cases
from autopersona_flows.memory.consolidation import promote_choices
from autopersona_flows.memory.embedders import Embedder, default_embedder
from autopersona_flows.memory.ingestion import ingest_task_history
from autopersona_flows.memory.jsonl import JsonlMemoryStore
from autopersona_flows.memory.records import PersonaMemory, RawTaskRecord, UtcDatetime
from autopersona_flows.memory.retrieval import SearchRequest, time_view
from autopersona_flows.memory.text import memory_text
from autopersona_flows.memory.updates import MemoryUpdater

__all__ = [
    "TIMELINE_CATEGORIES",
    "TimelineCase",
    "TimelineReport",
    "TimelineScores",
    "evaluate_timeline",
    "read_timeline_cases",
]

TimelineCategory = Literal["change", "reversal", "conflict", "bounded", "backfill", "distinct"]
TIMELINE_CATEGORIES: tuple[str, ...] = get_args(TimelineCategory)


class _Model(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class _Message(_Model):
    role: str
    text: str


class _Session(_Model):
    at: UtcDatetime
    query: Annotated[str, Field(min_length=1)]
    persona: list[PersonaMemory] = Field(default_factory=list)
    insight: str = ""
    messages: list[_Message] = Field(default_factory=list)


class _Check(_Model):
    query: Annotated[str, Field(min_length=1)]
    current: str | None = None
    stale: list[str] = Field(default_factory=list)
    expired: bool = False


class TimelineCase(_Model):
    """One person's history and what must hold at its end.

    Attributes:
        name: Unique in its file.
        category: One of `TIMELINE_CATEGORIES`.
        user_id: The person (cases are kept apart whatever their ids).
        now: When the checks are made.
        sessions: The history, each session with its time.
        ingest_order: The order sessions are fed in (indexes into ``sessions``).
        checks: Searches and what their results must (``current``) and must not
            (``stale``) hold, as lowercase substrings.
    """

    name: Annotated[str, Field(min_length=1)]
    category: TimelineCategory
    user_id: Annotated[str, Field(min_length=1)]
    now: UtcDatetime
    sessions: Annotated[list[_Session], Field(min_length=1)]
    ingest_order: list[int]
    checks: Annotated[list[_Check], Field(min_length=1)]

    @model_validator(mode="after")
    def _order(self) -> TimelineCase:
        if sorted(self.ingest_order) != list(range(len(self.sessions))):
            raise ValueError("ingest_order must list every session index once")
        return self


class TimelineScores(_Model):
    """The benchmark's measures over some checks (see the module docstring)."""

    cases: int
    checks: int
    new_first: float
    stale: float
    stale_live: float
    expired: float | None


class TimelineReport(_Model):
    """Scores per category and overall, the failed checks, and ingestion throughput.

    Attributes:
        categories: Scores per category present.
        overall: Scores over every check.
        failures: ``case name #check`` of each check not right, with what failed.
        messages_per_second: Messages ingested per second (wall clock).
    """

    categories: dict[str, TimelineScores]
    overall: TimelineScores
    failures: list[str]
    messages_per_second: float


def read_timeline_cases(path: str | Path) -> list[TimelineCase]:
    """Read a memory-over-time benchmark file (one `TimelineCase` a line).

    Raises:
        EvaluationError: If a line is not a valid case (naming the line and the
            field) or two cases share a name.
    """
    return read_cases(path, TimelineCase, "memory-over-time benchmark")


def _tasks(user: str, case: TimelineCase) -> list[RawTaskRecord]:
    tasks = []
    for index in case.ingest_order:
        session = case.sessions[index]
        tasks.append(
            RawTaskRecord(
                user_id=user,
                query=session.query,
                trace=[{"role": m.role, "text": m.text} for m in session.messages],
                insight=session.insight,
                persona=session.persona,
                at=session.at,
            )
        )
    return tasks


def _holds(text: str, wanted: str) -> bool:
    return wanted.casefold() in text.casefold()


def evaluate_timeline(
    cases: list[TimelineCase],
    *,
    embedder: Embedder | None = None,
    recency_half_life: timedelta | None = None,
) -> TimelineReport:
    """Ingest each case into a fresh bank and make its checks; see `TimelineReport`.

    Args:
        cases: The cases.
        embedder: The store's embedder; the shipped `SentenceEncoder` by default.
        recency_half_life: Weigh recency in the searches (see
            `MemoryRetriever.retrieve`), or ``None`` not to.

    Raises:
        RetrievalError: If ``recency_half_life`` is not a positive timedelta.
    """
    embedder = embedder or default_embedder()
    half_life = recency_half_life
    time_view(recency_half_life=half_life)  # checked before anything is ingested
    outcomes: dict[str, list[_Outcome]] = defaultdict(list)
    failures: list[str] = []
    messages, seconds = 0, 0.0
    with tempfile.TemporaryDirectory() as folder:
        store = JsonlMemoryStore(Path(folder))
        updater = MemoryUpdater(store, embedder)
        retriever = updater.retriever
        for number, case in enumerate(cases):
            user = f"case-{number}"
            tasks = _tasks(user, case)
            started = time.perf_counter()
            for task in tasks:
                ingest_task_history(store, updater, task)
            promote_choices(updater, user)
            seconds += time.perf_counter() - started
            messages += sum(max(1, len(s.messages)) for s in case.sessions)
            current = [r for r in store.list(user, "persona") if r.holds_at(case.now)]
            for index, check in enumerate(case.checks):
                found = retriever.retrieve(
                    user,
                    [SearchRequest(layer="persona", query=check.query)],
                    top_k=5,
                    as_of=case.now,
                    recency_half_life=half_life,
                ).persona
                first = memory_text(found[0].record.content) if found else ""
                texts = [memory_text(r.content) for r in current]
                new_first = None if check.current is None else _holds(first, check.current)
                stale = any(_holds(first, old) for old in check.stale)
                live = any(_holds(text, old) for text in texts for old in check.stale)
                expired = (
                    any(
                        _holds(memory_text(m.record.content), old)
                        for m in found
                        for old in check.stale
                    )
                    if check.expired
                    else None
                )
                outcomes[case.category].append((new_first, stale, live, expired))
                if new_first is False or stale or expired:
                    what = [
                        *(["current not first"] if new_first is False else []),
                        *(["stale first"] if stale else []),
                        *(["expired returned"] if expired else []),
                    ]
                    failures.append(f"{case.name} #{index}: {', '.join(what)}")
    per_case: defaultdict[str, set[str]] = defaultdict(set)
    for case in cases:
        per_case[case.category].add(case.name)
    categories = {
        name: _scores(outcomes[name], len(per_case[name]))
        for name in TIMELINE_CATEGORIES
        if outcomes[name]
    }
    everything = [outcome for name in categories for outcome in outcomes[name]]
    return TimelineReport(
        categories=categories,
        overall=_scores(everything, len(cases)),
        failures=failures,
        messages_per_second=messages / seconds if seconds else 0.0,
    )


_Outcome = tuple[bool | None, bool, bool, bool | None]  # new first, stale, live, expired


def _scores(outcomes: list[_Outcome], cases: int) -> TimelineScores:
    expired = [outcome[3] for outcome in outcomes if outcome[3] is not None]
    current = [outcome[0] for outcome in outcomes if outcome[0] is not None]
    return TimelineScores(
        cases=cases,
        checks=len(outcomes),
        new_first=ratio(sum(current), len(current)),
        stale=ratio(sum(o[1] for o in outcomes), len(outcomes)) if outcomes else 0.0,
        stale_live=ratio(sum(o[2] for o in outcomes), len(outcomes)) if outcomes else 0.0,
        expired=sum(expired) / len(expired) if expired else None,
    )
