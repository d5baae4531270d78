"""The tiers of judgement the benchmarks compare: the semantic default and no model.

- ``semantic`` (the default): ``PersonaAgent(MemoryBank(store))``, the shipped sentence
  encoder as the bank's embedder and `SemanticJudge`;
- ``no-model``: words and rules only, as the default was before meaning came from a
  model: a `HashingEmbedder` bank and the `LexicalJudge`, with the policy settings it
  was tuned with.

The LLM tier (`OpenAICompatiblePolicy`) needs a server; ``benchmarks/judgement_tiers.py``
runs it when given one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from autopersona_flows.agent.agent import PersonaAgent
from autopersona_flows.agent.evidence import EvidencePolicy
from autopersona_flows.agent.judges import LexicalJudge
from autopersona_flows.memory.bank import MemoryBank
from autopersona_flows.memory.embedders import Embedder, HashingEmbedder, default_embedder
from autopersona_flows.memory.protocol import MemoryStore

__all__ = ["TIER_NAMES", "Tier", "tier"]

Tier = Literal["semantic", "no-model"]
TIER_NAMES: tuple[Tier, ...] = ("semantic", "no-model")


def tier(name: Tier) -> tuple[Callable[[MemoryStore], PersonaAgent], Embedder]:
    """The agent factory of a tier and the embedder its banks are written with.

    Raises:
        ValueError: If ``name`` is no tier.
    """
    if name == "semantic":
        embedder = default_embedder()
        return (lambda store: PersonaAgent(MemoryBank(store, embedder))), embedder
    if name == "no-model":
        hashing = HashingEmbedder()

        def words_only(store: MemoryStore) -> PersonaAgent:
            policy = EvidencePolicy(threshold=0.5, margin=0.1, judge=LexicalJudge())
            return PersonaAgent(MemoryBank(store, hashing), policy)

        return words_only, hashing
    raise ValueError(f"unknown tier {name!r}: use one of {', '.join(TIER_NAMES)}")
