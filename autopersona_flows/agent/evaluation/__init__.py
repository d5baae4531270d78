"""Evaluating the PersonaAgent: the judgement benchmark and the clarification set.

`evaluate_judgement` runs the benchmark of ``tests/data/judgement`` (self-contained
cases, per-category metrics); `evaluate_clarification_policy` the older
clarification set of ``tests/data/clarification`` (one shared bank per user).
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

__all__ = [
    "CATEGORIES",
    "CaseResult",
    "CategoryScores",
    "ClarificationCase",
    "ClarificationReport",
    "JudgementCase",
    "JudgementReport",
    "JudgementResult",
    "cases_kind",
    "evaluate_clarification_policy",
    "evaluate_judgement",
    "noise_memories",
    "read_clarification_cases",
    "read_judgement_cases",
    "seed_memories",
]
