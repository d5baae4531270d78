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
from autopersona_flows.agent.evidence import EvidencePolicy, statement
from autopersona_flows.agent.metrics import RuntimeMetrics
from autopersona_flows.agent.planners import LEARNED, STANDING, DefaultPlanner, SearchPlanner
from autopersona_flows.agent.policies import Policy
from autopersona_flows.agent.standing import applies, stake_words
from autopersona_flows.errors import BlankAnswerError, MemoryBankError, PolicyError
from autopersona_flows.memory.bank import MemoryBank
from autopersona_flows.memory.provenance import Provenance
from autopersona_flows.memory.records import MemoryLayer, MemoryRecord, PersonaMemory
from autopersona_flows.memory.retrieval import (
    MemoryBundle,
    MemoryRetriever,
    ScoredMemory,
    SearchRequest,
    check_min_similarity,
    check_top_k,
)
from autopersona_flows.memory.updates import MemoryUpdater, UpdateDecision

__all__ = ["PersonaAgent"]


class PersonaAgent:
    """Decides, for each request, between final guidance and one targeted question.

    Args:
        retriever: The user's memory: a `MemoryBank` (its retriever reads, its
            updater writes learned answers), or a `MemoryRetriever` alone.
        policy: Turns the retrieved memories into a decision; `EvidencePolicy` by default.
        planner: Chooses what to retrieve; `DefaultPlanner` by default.
        updater: Writes learned answers, with a `MemoryRetriever` only; one over the
            retriever's store is made if not given.
        top_k: Memories per search.
        min_similarity: Weakest retrieval score considered (see `Scoring`).
        metrics: Receives counters and timings when given.

    Attributes:
        bank: The memory, as a `MemoryBank` (one wrapping the retriever and updater
            when those were given); ``retriever`` and ``updater`` are its parts.

    Raises:
        MemoryBankError: If ``updater`` is given with a `MemoryBank`, which has its own.
        ValueError: If ``updater`` writes to another store object than the retriever reads.
    """

    def __init__(
        self,
        retriever: MemoryBank | MemoryRetriever,
        policy: Policy | None = None,
        *,
        planner: SearchPlanner | None = None,
        updater: MemoryUpdater | None = None,
        top_k: int = 5,
        min_similarity: float = 0.0,
        metrics: RuntimeMetrics | None = None,
    ) -> None:
        if isinstance(retriever, MemoryBank):
            if updater is not None:
                raise MemoryBankError(
                    "a MemoryBank brings its updater: build the bank with the resolver you "
                    "want (MemoryBank(store, resolver=...)) instead of passing updater="
                )
            self.bank = retriever
        else:
            updater = updater or MemoryUpdater(retriever.store, retriever=retriever)
            if updater.store is not retriever.store:
                raise ValueError("the updater must write to the store object the retriever reads")
            self.bank = MemoryBank.from_retriever(retriever, updater)
        self.retriever: MemoryRetriever = self.bank.retriever
        self.updater: MemoryUpdater = self.bank.updater
        self.policy = policy if policy is not None else EvidencePolicy()
        self.planner = planner if planner is not None else DefaultPlanner()
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
        with self.retriever.reading():  # one state of each bank for all its searches
            memories = self._retrieve(request, top_k, min_similarity)
        retrieved = time.perf_counter()
        try:
            decision = parse_decision(self.policy.decide(request, memories))
        except PolicyError:
            self._count("policy_errors")
            raise
        # Policies need not echo the evidence back; the decision carries it, each
        # memory once.
        shown = (decision.memories or memories).distinct()
        decision = decision.model_copy(update={"memories": shown})
        if isinstance(decision, ClarifyDecision) and decision.request is None:
            decision = decision.model_copy(update={"request": request})
        if self.metrics is not None:
            self.metrics.time("retrieval", retrieved - started)
            self.metrics.time("policy", time.perf_counter() - retrieved)
            self.metrics.count("decisions")
            self.metrics.count("finals" if decision.action == "final" else "clarifications")
        return decision

    def learn(
        self,
        user_id: str,
        decision: ClarifyDecision,
        answer: str,
        *,
        flow_run_id: str | None = None,
        node: str | None = None,
    ) -> UpdateDecision:
        """Remember the person's answer to a clarification, so it is never asked again.

        The answer becomes a persona memory whose topic is the requirement asked
        about (or the question itself), with the requirement's other names as
        aliases (its description and declared question), its options, and where it
        was asked (node id, instruction, request): a later requirement naming the
        same need in other words, or offering the same choices, finds it. It goes
        through the updater, so a newer answer replaces an older one, keeping where
        that one was learned. The memory's provenance is the clarification: the
        question, the node and the flow run (a flow passes its id in; the agent
        knows nothing of Prefect).

        Args:
            user_id: Whose answer.
            decision: The clarification answered.
            answer: The person's answer.
            flow_run_id: The flow run that asked, if one did.
            node: The id of the node that asked; the request's node by default.

        Raises:
            PolicyError: If ``decision`` is not a clarification, or was made for
                another user.
            BlankAnswerError: If ``answer`` is empty or only whitespace (a
                ``ValueError``); the message names the question.
        """
        if not isinstance(decision, ClarifyDecision):
            raise PolicyError(f"only a clarification can be answered, got {decision!r}")
        if not isinstance(answer, str) or not answer.strip():
            raise BlankAnswerError(decision.question, answer)
        request = decision.request
        if request is not None and request.user_id != user_id:
            raise PolicyError(
                f"this question was asked for user {request.user_id!r}, not {user_id!r}"
            )
        asked = next(
            (
                r
                for r in (request.requirements if request else [])
                if r.name == decision.requirement
            ),
            None,
        )
        names = [asked.description, asked.question or ""] if asked else []
        info = request.node if request else None
        contexts = [info.id, info.instruction] if info else []
        memory = PersonaMemory(
            topic=decision.requirement or decision.question,
            preference=answer.strip(),
            aliases=_distinct(names, exclude=decision.requirement),
            options=list(asked.options) if asked else list(decision.options),
            contexts=_distinct([*contexts, request.query if request else ""]),
            request=request.query.strip() if request else "",
        )
        source = Provenance.clarification(
            decision.question,
            node=node if node is not None else (info.id if info else None),
            flow_run_id=flow_run_id,
        )
        result = self.updater.update(user_id, "persona", memory, provenance=source)
        self._count("learned_answers")
        return result

    def correct(
        self,
        request: PersonaRequest,
        requirement: str,
        answer: str,
        *,
        flow_run_id: str | None = None,
    ) -> UpdateDecision:
        """Remember that, for ``request``, the person wants ``answer`` for ``requirement``.

        What a person says after seeing the agent act on a wrong value ("no, for
        work trips the aisle"): learned like the answer to a question asked for
        ``request``, so it holds where that request's situation does, beside what
        holds elsewhere, and replaces what was learned for requests like it.

        Raises:
            PolicyError: If ``request`` has no requirement of that name.
            BlankAnswerError: If ``answer`` is empty or only whitespace.
        """
        asked = next((r for r in request.requirements if r.name == requirement), None)
        if asked is None:
            raise PolicyError(
                f"the request has no requirement {requirement!r}; it has "
                f"{[r.name for r in request.requirements]}"
            )
        question = ClarifyDecision(
            question=f"What should {requirement!r} be? (a correction)",
            requirement=requirement,
            options=list(asked.options),
            request=request,
        )
        return self.learn(request.user_id, question, answer, flow_run_id=flow_run_id)

    def _retrieve(self, request: PersonaRequest, top_k: int, min_similarity: float) -> MemoryBundle:
        """Retrieve what the planner asks for, then look two things up exactly.

        Each label's searches are distinct on their own: a retrieval hands each
        memory to the first search that finds it, and across purposes that would let
        one requirement's weak match take another requirement's evidence. Answers
        learned at this node or for this request are looked up whatever words a
        requirement now uses, so that a question answered at a node is never asked
        there again; and memories stating a stake of the work (an allergy for a
        grocery order), however little they resemble the request, so that a
        standing constraint reaches it in any bank and at any ``min_similarity``.
        """
        user_id = request.user_id
        as_of = request.as_of
        bundle = self.retriever.retrieve(
            user_id,
            self.planner.plan(request),
            top_k,
            min_similarity,
            distinct_per_label=True,
            as_of=as_of,
        )
        node = request.node
        found: dict[MemoryLayer, list[tuple[MemoryRecord, str]]] = {"persona": [], "trajectory": []}
        if request.requirements:
            contexts = [request.query, *((node.id, node.instruction) if node else ())]
            found["persona"] += [
                (record, LEARNED)
                for record in self.retriever.learned_at(user_id, contexts, as_of=as_of)
            ]
        work = " ".join(part for part in (request.query, node.instruction if node else "") if part)
        words = stake_words(work)
        for layer in found if words else ():
            holding = self.retriever.containing(user_id, layer, words, as_of=as_of)
            holding = holding[:_STANDING_SCAN]
            standing = [r for r in holding if applies(statement(r) or "", work)][:_MAX_STANDING]
            found[layer] += [(record, STANDING) for record in standing]
        if not any(found.values()):
            return bundle
        return bundle.model_copy(update=_prepended(bundle, found))

    def _count(self, name: str) -> None:
        if self.metrics is not None:
            self.metrics.count(name)


_STANDING_SCAN = 200
"""Memories holding a stake word read per layer and decision, the most recently said
first: what bounds the lookup's cost in a bank full of such words."""
_MAX_STANDING = 20
"""Standing constraints found by the lookup kept per layer."""


def _prepended(
    bundle: MemoryBundle, found: dict[MemoryLayer, list[tuple[MemoryRecord, str]]]
) -> dict[str, list[ScoredMemory]]:
    """The layers of ``bundle`` with memories found by exact lookups (and labels) first.

    Each scores what a search of ``bundle`` scored it, or 0.0: a score is a
    similarity, and these were found by other means.
    """
    scores: dict[str, float] = {}
    for memory in bundle:
        scores[memory.record.id] = max(memory.score, scores.get(memory.record.id, 0.0))
    return {
        layer: [
            *(
                ScoredMemory.model_construct(
                    record=record,
                    score=scores.get(record.id, 0.0),
                    search=SearchRequest(layer=layer, query=_LOOKUPS[label], label=label),
                )
                for record, label in records
            ),
            *bundle.layer(layer),
        ]
        for layer, records in found.items()
    }


_LOOKUPS = {LEARNED: "learned answers", STANDING: "standing constraints"}


def _distinct(texts: list[str], exclude: str | None = None) -> list[str]:
    """Non-blank texts, each once, stripped; ``exclude`` left out."""
    kept = dict.fromkeys(text.strip() for text in texts if text.strip())
    kept.pop((exclude or "").strip(), None)
    return list(kept)
