"""The PersonaAgent: final guidance or one targeted question, per task node.

Recall, then judge: a `SearchPlanner` recalls candidates from every layer, a
`Judge` decides which answer each requirement, and a `Policy` turns the verdicts
into a decision. This package never imports Prefect, and imports each name's module
on first use (see ``autopersona_flows/_lazy.py``): the LLM tier's HTTP client loads
only for those who use it. The evaluation harness is a package of its own,
``autopersona_flows.agent.evaluation``.
"""

from typing import TYPE_CHECKING

from autopersona_flows._lazy import exports

if TYPE_CHECKING:
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
    from autopersona_flows.agent.evidence import EvidencePolicy
    from autopersona_flows.agent.judges import Judge, LexicalJudge, Verdict
    from autopersona_flows.agent.matchers import DenseWordMatcher
    from autopersona_flows.agent.metrics import RuntimeMetrics
    from autopersona_flows.agent.openai import OpenAICompatibleJudge, OpenAICompatiblePolicy
    from autopersona_flows.agent.persona2web import query_to_persona_request
    from autopersona_flows.agent.planners import (
        DefaultPlanner,
        FunctionPlanner,
        SearchPlanner,
        requirement_label,
    )
    from autopersona_flows.agent.policies import FunctionPolicy, Policy
    from autopersona_flows.agent.reading import WordMatcher
else:
    __getattr__, __dir__ = exports(
        __name__,
        {
            "autopersona_flows.agent.agent": ("PersonaAgent",),
            "autopersona_flows.agent.decisions": (
                "ClarifyDecision",
                "Constraint",
                "FinalDecision",
                "NodeInfo",
                "PersonaDecision",
                "PersonaRequest",
                "Requirement",
                "parse_decision",
            ),
            "autopersona_flows.agent.evidence": ("EvidencePolicy",),
            "autopersona_flows.agent.judges": ("Judge", "LexicalJudge", "Verdict"),
            "autopersona_flows.agent.matchers": ("DenseWordMatcher",),
            "autopersona_flows.agent.metrics": ("RuntimeMetrics",),
            "autopersona_flows.agent.openai": ("OpenAICompatibleJudge", "OpenAICompatiblePolicy"),
            "autopersona_flows.agent.persona2web": ("query_to_persona_request",),
            "autopersona_flows.agent.planners": (
                "DefaultPlanner",
                "FunctionPlanner",
                "SearchPlanner",
                "requirement_label",
            ),
            "autopersona_flows.agent.policies": ("FunctionPolicy", "Policy"),
            "autopersona_flows.agent.reading": ("WordMatcher",),
        },
        # Re-exported here in 0.1: code written then still runs, with a DeprecationWarning.
        moved={
            "autopersona_flows.agent.evaluation": (
                "CaseResult",
                "ClarificationCase",
                "ClarificationReport",
                "JudgementCase",
                "JudgementReport",
                "evaluate_clarification_policy",
                "evaluate_judgement",
                "read_clarification_cases",
                "read_judgement_cases",
                "seed_memories",
            ),
        },
    )

__all__ = [
    "ClarifyDecision",
    "Constraint",
    "DefaultPlanner",
    "DenseWordMatcher",
    "EvidencePolicy",
    "FinalDecision",
    "FunctionPlanner",
    "FunctionPolicy",
    "Judge",
    "LexicalJudge",
    "NodeInfo",
    "OpenAICompatibleJudge",
    "OpenAICompatiblePolicy",
    "PersonaAgent",
    "PersonaDecision",
    "PersonaRequest",
    "Policy",
    "Requirement",
    "RuntimeMetrics",
    "SearchPlanner",
    "Verdict",
    "WordMatcher",
    "parse_decision",
    "query_to_persona_request",
    "requirement_label",
]
