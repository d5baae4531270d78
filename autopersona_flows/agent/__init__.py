"""The PersonaAgent: final guidance or one targeted question, per task node.

This package never imports Prefect.
"""

from autopersona_flows.agent.agent import PersonaAgent
from autopersona_flows.agent.decisions import (
    ClarifyDecision,
    Constraint,
    FinalDecision,
    NodeInfo,
    PersonaDecision,
    PersonaRequest,
    Requirement,
    parse_decision,
)
from autopersona_flows.agent.evaluation import (
    CaseResult,
    ClarificationCase,
    ClarificationReport,
    evaluate_clarification_policy,
    read_clarification_cases,
    seed_memories,
)
from autopersona_flows.agent.evidence import EvidencePolicy
from autopersona_flows.agent.judges import Judge, LexicalJudge, Verdict
from autopersona_flows.agent.metrics import RuntimeMetrics
from autopersona_flows.agent.openai import OpenAICompatiblePolicy
from autopersona_flows.agent.planners import (
    DefaultPlanner,
    FunctionPlanner,
    SearchPlanner,
    requirement_label,
)
from autopersona_flows.agent.policies import FunctionPolicy, Policy

__all__ = [
    "CaseResult",
    "ClarificationCase",
    "ClarificationReport",
    "ClarifyDecision",
    "Constraint",
    "DefaultPlanner",
    "EvidencePolicy",
    "FinalDecision",
    "FunctionPlanner",
    "FunctionPolicy",
    "Judge",
    "LexicalJudge",
    "NodeInfo",
    "OpenAICompatiblePolicy",
    "PersonaAgent",
    "PersonaDecision",
    "PersonaRequest",
    "Policy",
    "Requirement",
    "RuntimeMetrics",
    "SearchPlanner",
    "Verdict",
    "evaluate_clarification_policy",
    "parse_decision",
    "read_clarification_cases",
    "requirement_label",
    "seed_memories",
]
