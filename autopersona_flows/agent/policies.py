"""Decision policies: from a request and the retrieved memories to final or clarify."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Protocol, runtime_checkable

from autopersona_flows.agent.decisions import (
    ClarifyDecision,
    Constraint,
    FinalDecision,
    PersonaDecision,
    PersonaRequest,
    Requirement,
)
from autopersona_flows.agent.planners import requirement_label
from autopersona_flows.memory.records import PersonaMemory, TrajectoryMemory
from autopersona_flows.memory.retrieval import MemoryBundle, ScoredMemory
from autopersona_flows.memory.text import memory_text, normalise

__all__ = ["EvidencePolicy", "FunctionPolicy", "Policy"]


@runtime_checkable
class Policy(Protocol):
    """Decides, from what memory holds, whether a node can proceed.

    Contract: return a `PersonaDecision` (or a dict that validates as one): final
    guidance with the constraints that apply, or a clarification asking one
    question about what is missing. ``memories`` were retrieved for ``request``
    from its user's bank only.

    A policy may also declare ``asks_without_requirements = False``: a promise never
    to clarify a request without required requirements. Graphs then decide for
    such nodes inside the node's own task, saving a Prefect task per node; a
    policy that breaks the promise fails the node with a `PolicyError`. Without
    the attribute a policy is assumed to ask anywhere.
    """

    def decide(self, request: PersonaRequest, memories: MemoryBundle) -> PersonaDecision:
        """Decide for ``request``."""
        ...


class FunctionPolicy:
    """Adapt a callable ``(request, memories) -> PersonaDecision | dict``."""

    def __init__(self, fn: Callable[[PersonaRequest, MemoryBundle], Any]) -> None:
        self._fn = fn

    def __repr__(self) -> str:
        return f"FunctionPolicy({self._fn!r})"

    def decide(self, request: PersonaRequest, memories: MemoryBundle) -> PersonaDecision:
        """Call the function; `PersonaAgent` validates what it returns."""
        return self._fn(request, memories)


def constraint_text(memory: ScoredMemory) -> str:
    """Render a memory as a constraint a tool or a person can act on."""
    content = memory.record.content
    if isinstance(content, PersonaMemory):
        text = f"{content.topic}: {content.preference}"
        return f"{text} ({content.strategy})" if content.strategy else text
    if isinstance(content, TrajectoryMemory):
        return f"earlier, for {content.query!r}: {content.insight or memory_text(content)}"
    return f"workspace: {memory_text(content)}"


class EvidencePolicy:
    """The default policy: ask exactly when a required requirement lacks evidence.

    A requirement is met by a memory in one of its layers that its own search
    found (see `requirement_label`) with a score of at least ``threshold``. Among
    persona memories of the same topic the newest wins, so an evolved preference
    replaces the one it superseded. The first unmet required requirement yields a
    clarification naming it, the node it is for, and the options: the declared
    ones, or the values this user chose before for the same topic. When all are
    met the decision is final, with a constraint per requirement and the other
    relevant preferences and workspace state as guidance. A request without
    requirements is never asked about.

    Args:
        threshold: The score a memory needs to count as evidence.
        guidance_threshold: The score other memories need to be added as guidance.
        max_guidance: At most this many memories beyond the requirements' evidence.
    """

    asks_without_requirements: ClassVar[bool] = False  # see `Policy`

    def __init__(
        self, threshold: float = 0.5, guidance_threshold: float = 0.1, max_guidance: int = 5
    ) -> None:
        for name, value in (("threshold", threshold), ("guidance_threshold", guidance_threshold)):
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must lie in [0, 1], got {value}")
        if isinstance(max_guidance, bool) or not isinstance(max_guidance, int) or max_guidance < 0:
            raise ValueError(f"max_guidance must be an int >= 0, got {max_guidance!r}")
        self.threshold = threshold
        self.guidance_threshold = guidance_threshold
        self.max_guidance = max_guidance

    def __repr__(self) -> str:
        return f"EvidencePolicy(threshold={self.threshold})"

    def decide(self, request: PersonaRequest, memories: MemoryBundle) -> PersonaDecision:
        """Decide final or clarify; see the class documentation."""
        constraints = []
        for requirement in request.requirements:
            evidence = self.evidence(requirement, memories)
            if evidence is None:
                if requirement.required:
                    return self._clarify(request, requirement, memories)
                continue
            constraints.append(
                Constraint(
                    text=constraint_text(evidence),
                    requirement=requirement.name,
                    memory_id=evidence.record.id,
                    layer=evidence.record.layer,
                    score=evidence.score,
                )
            )
        constraints += self._guidance(memories, {c.memory_id for c in constraints})
        return FinalDecision(
            guidance=_compose(request, constraints), constraints=constraints, memories=memories
        )

    def evidence(self, requirement: Requirement, memories: MemoryBundle) -> ScoredMemory | None:
        """Return the memory that best satisfies ``requirement``, or ``None``."""
        label = requirement_label(requirement)
        found = [
            memory
            for layer in requirement.layers
            for memory in memories.layer(layer)
            if memory.search.label == label and memory.score >= self.threshold
        ]
        if not found:
            return None
        best = max(found, key=lambda memory: memory.score)
        return _newest_of_topic(best, found)

    def _guidance(self, memories: MemoryBundle, used: set[str]) -> list[Constraint]:
        extra: dict[str, ScoredMemory] = {}
        for memory in [*memories.persona, *memories.workspace]:
            if memory.score >= self.guidance_threshold:
                kept = _newest_of_topic(memory, [*memories.persona, *memories.workspace])
                if kept.record.id not in used:
                    extra.setdefault(kept.record.id, kept)
        ranked = sorted(extra.values(), key=lambda memory: -memory.score)[: self.max_guidance]
        return [
            Constraint(
                text=constraint_text(memory),
                memory_id=memory.record.id,
                layer=memory.record.layer,
                score=memory.score,
            )
            for memory in ranked
        ]

    def _clarify(
        self, request: PersonaRequest, requirement: Requirement, memories: MemoryBundle
    ) -> ClarifyDecision:
        options = requirement.options or _earlier_choices(requirement, memories)
        if requirement.question:
            question = requirement.question
        else:
            where = (
                f" for step {request.node.id!r} ({request.node.instruction})"
                if request.node and request.node.instruction
                else f" for step {request.node.id!r}"
                if request.node
                else f" for {request.query!r}"
            )
            question = f"Which {requirement.name} should I use{where}?"
            if options:
                question += f" Options: {', '.join(options)}."
        return ClarifyDecision(
            question=question, requirement=requirement.name, options=options, memories=memories
        )


def _newest_of_topic(memory: ScoredMemory, pool: list[ScoredMemory]) -> ScoredMemory:
    """Among persona memories of ``memory``'s topic in ``pool``, the most recently updated."""
    content = memory.record.content
    if not isinstance(content, PersonaMemory):
        return memory
    topic = normalise(content.topic)
    same = [
        other
        for other in pool
        if isinstance(other.record.content, PersonaMemory)
        and normalise(other.record.content.topic) == topic
    ]
    return max(same, key=lambda other: (other.record.updated_at, other.record.id))


def _earlier_choices(requirement: Requirement, memories: MemoryBundle) -> list[str]:
    topic = normalise(requirement.name)
    choices = [
        memory.record.content.preference
        for memory in memories.persona
        if isinstance(memory.record.content, PersonaMemory)
        and normalise(memory.record.content.topic) == topic
    ]
    return list(dict.fromkeys(choices))


def _compose(request: PersonaRequest, constraints: list[Constraint]) -> str:
    target = f"step {request.node.id!r}" if request.node else "this request"
    if not constraints:
        return f"No stored preference applies to {target}; proceed as asked."
    lines = "\n".join(f"- {constraint.text}" for constraint in constraints)
    return f"For {target}, respect what this person has told us:\n{lines}"
