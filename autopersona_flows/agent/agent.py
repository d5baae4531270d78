"""The PersonaAgent: apply what we know about a person, and ask when it is not enough."""

from __future__ import annotations

import time
from typing import Any

from autopersona_flows.agent.decisions import (
    ClarifyDecision,
    PersonaDecision,
    PersonaRequest,
    parse_decision,
)
from autopersona_flows.agent.metrics import RuntimeMetrics
from autopersona_flows.agent.planners import DefaultPlanner, SearchPlanner
from autopersona_flows.agent.policies import EvidencePolicy, Policy
from autopersona_flows.errors import PolicyError
from autopersona_flows.memory.records import LAYERS, PersonaMemory
from autopersona_flows.memory.retrieval import (
    MemoryBundle,
    MemoryRetriever,
    SearchRequest,
    check_min_similarity,
    check_top_k,
)
from autopersona_flows.memory.updates import MemoryUpdater, UpdateDecision

__all__ = ["PersonaAgent"]


class PersonaAgent:
    """Decides, for each request, between final guidance and one targeted question.

    Args:
        retriever: Reads the user's memory.
        policy: Turns the retrieved memories into a decision; `EvidencePolicy` by default.
        planner: Chooses what to retrieve; `DefaultPlanner` by default.
        updater: Writes learned answers; one over the retriever's store is made if
            not given.
        top_k: Memories per search.
        min_similarity: Weakest retrieval score considered (see `Scoring`).
        metrics: Receives counters and timings when given.
    """

    def __init__(
        self,
        retriever: MemoryRetriever,
        policy: Policy | None = None,
        *,
        planner: SearchPlanner | None = None,
        updater: MemoryUpdater | None = None,
        top_k: int = 3,
        min_similarity: float = 0.0,
        metrics: RuntimeMetrics | None = None,
    ) -> None:
        self.retriever = retriever
        self.policy = policy if policy is not None else EvidencePolicy()
        self.planner = planner if planner is not None else DefaultPlanner()
        self.updater = updater or MemoryUpdater(retriever.store, retriever=retriever)
        if self.updater.store is not retriever.store:
            raise ValueError("the updater must write to the store object the retriever reads")
        self.top_k = check_top_k(top_k)
        self.min_similarity = check_min_similarity(min_similarity)
        self.metrics = metrics

    def __repr__(self) -> str:
        return f"PersonaAgent({self.retriever!r}, policy={self.policy!r})"

    def decide(self, request: PersonaRequest | dict[str, Any]) -> PersonaDecision:
        """Retrieve what the planner asks for, then let the policy decide.

        Raises:
            PolicyError: If the policy returns anything but a valid decision.
            RetrievalError: If the planner returns something that is not a search.
        """
        if isinstance(request, dict):
            request = PersonaRequest.model_validate(request)
        if not isinstance(request, PersonaRequest):
            raise TypeError(f"expected a PersonaRequest, got {type(request).__name__}")
        top_k = request.retrieval_top_k or self.top_k
        min_similarity = (
            self.min_similarity
            if request.retrieval_min_similarity is None
            else request.retrieval_min_similarity
        )
        started = time.perf_counter()
        memories = self._retrieve(
            request.user_id, self.planner.plan(request), top_k, min_similarity
        )
        retrieved = time.perf_counter()
        try:
            decision = parse_decision(self.policy.decide(request, memories))
        except PolicyError:
            self._count("policy_errors")
            raise
        if not decision.memories:
            # Policies need not echo the evidence back; the decision carries it.
            decision = decision.model_copy(update={"memories": memories})
        if self.metrics is not None:
            self.metrics.time("retrieval", retrieved - started)
            self.metrics.time("policy", time.perf_counter() - retrieved)
            self.metrics.count("decisions")
            self.metrics.count("finals" if decision.action == "final" else "clarifications")
        return decision

    def learn(self, user_id: str, decision: ClarifyDecision, answer: str) -> UpdateDecision:
        """Remember the person's answer to a clarification, so it is not asked again.

        The answer becomes a persona memory whose topic is the requirement asked
        about (or the question itself); it goes through the updater, so a newer
        answer replaces an older one.

        Raises:
            PolicyError: If ``decision`` is not a clarification.
            ValueError: If ``answer`` is empty.
        """
        if not isinstance(decision, ClarifyDecision):
            raise PolicyError(f"only a clarification can be answered, got {decision!r}")
        if not isinstance(answer, str) or not answer.strip():
            raise ValueError(f"an answer must be non-empty text, got {answer!r}")
        memory = PersonaMemory(
            topic=decision.requirement or decision.question,
            preference=answer.strip(),
        )
        result = self.updater.update(user_id, "persona", memory)
        self._count("learned_answers")
        return result

    def _retrieve(
        self, user_id: str, searches: list[SearchRequest], top_k: int, min_similarity: float
    ) -> MemoryBundle:
        """Retrieve each label's searches on their own, then merge.

        A retrieval hands each memory to the first search that finds it. Within one
        purpose that removes repeats; across purposes it would let one requirement's
        weak match take another requirement's evidence, so purposes do not share.
        """
        groups: dict[str | None, list[SearchRequest]] = {}
        for search in searches:
            groups.setdefault(search.label, []).append(search)
        if len(groups) <= 1:
            return self.retriever.retrieve(user_id, searches, top_k, min_similarity)
        bundles = [
            self.retriever.retrieve(user_id, group, top_k, min_similarity)
            for group in groups.values()
        ]
        return MemoryBundle(
            **{
                layer: sorted(
                    (memory for bundle in bundles for memory in bundle.layer(layer)),
                    key=lambda memory: -memory.score,
                )
                for layer in LAYERS
            }
        )

    def _count(self, name: str) -> None:
        if self.metrics is not None:
            self.metrics.count(name)
