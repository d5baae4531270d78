"""Evaluating the PersonaAgent and its memory: judgement, clarification, time.

`evaluate_judgement` runs the benchmark of ``tests/data/judgement`` (self-contained
cases, per-category metrics); `evaluate_clarification_policy` the older
clarification set of ``tests/data/clarification`` (one shared bank per user);
`evaluate_timeline` the memory-over-time benchmark of ``tests/data/memory_time``.
"""

from autopersona_flows.agent.evaluation._common import cases_kind
from autopersona_flows.agent.evaluation.clarification import (
    CaseResult,
    ClarificationCase,
    ClarificationReport,
    evaluate_clarification_policy,
    read_clarification_cases,
    seed_memories,
)
from autopersona_flows.agent.evaluation.judgement import (
    CATEGORIES,
    JudgementCase,
    evaluate_judgement,
    read_judgement_cases,
)
from autopersona_flows.agent.evaluation.noise import noise_memories
from autopersona_flows.agent.evaluation.reports import (
    CategoryScores,
    JudgementReport,
    JudgementResult,
)
from autopersona_flows.agent.evaluation.timeline import (
    TIMELINE_CATEGORIES,
    TimelineCase,
    TimelineReport,
    TimelineScores,
    evaluate_timeline,
    read_timeline_cases,
)

__all__ = [
    "CATEGORIES",
    "TIMELINE_CATEGORIES",
    "CaseResult",
    "CategoryScores",
    "ClarificationCase",
    "ClarificationReport",
    "JudgementCase",
    "JudgementReport",
    "JudgementResult",
    "TimelineCase",
    "TimelineReport",
    "TimelineScores",
    "cases_kind",
    "evaluate_clarification_policy",
    "evaluate_judgement",
    "evaluate_timeline",
    "noise_memories",
    "read_clarification_cases",
    "read_judgement_cases",
    "read_timeline_cases",
    "seed_memories",
]
