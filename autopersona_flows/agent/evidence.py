"""The default policy: recall, judge, and ask exactly when a required need is unanswered.

`EvidencePolicy` hands each requirement's recalled candidates to a `Judge`, then
decides what the person currently holds:

1. A *statement* (a preference, a past task's lesson, workspace state) the judge
   finds strong enough answers on its own; *choices* made in past tasks answer
   only when at least two agree on the value.
2. The clearest answer holds unless something said later replaces it: an answer
   about as clear (within ``margin``), one announcing a change ("pescatarian
   now"), or a habit of later past tasks. If what holds says the preference no
   longer does, nothing answers and the person is asked.
3. A required requirement nothing answers is asked about; the first one, with its
   options, in a question `compose_question` words as a person would. Otherwise
   the decision is final, with one constraint per answered requirement, each
   saying where its value came from and why, and the guidance the node should
   see: the standing constraints (allergies, access, hard budget caps, legal
   limits) that apply to the node's work, and memories about it.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import ClassVar

from pydantic import ValidationError

from autopersona_flows.agent.decisions import (
    ClarifyDecision,
    Constraint,
    FinalDecision,
    NodeInfo,
    PersonaDecision,
    PersonaRequest,
    Requirement,
)
from autopersona_flows.agent.judges import Judge, Verdict
from autopersona_flows.agent.planners import LEARNED, requirement_label
from autopersona_flows.agent.questions import compose_question
from autopersona_flows.agent.semantic import SemanticJudge
from autopersona_flows.agent.standing import applies
from autopersona_flows.errors import AutopersonaError, PolicyError
from autopersona_flows.memory.phrases import clauses, content_roots, phrase, root
from autopersona_flows.memory.records import (
    MemoryRecord,
    PersonaMemory,
    TrajectoryMemory,
)
from autopersona_flows.memory.retrieval import MemoryBundle, ScoredMemory
from autopersona_flows.memory.slots import same_slot
from autopersona_flows.memory.text import memory_text, normalise, trace_text

__all__ = ["EvidencePolicy", "constraint_text", "statement"]


def constraint_text(memory: ScoredMemory | MemoryRecord) -> str:
    """Render a memory as a constraint a tool or a person can act on."""
    record = memory.record if isinstance(memory, ScoredMemory) else memory
    content = record.content
    if isinstance(content, PersonaMemory):
        text = f"{content.topic}: {content.preference}"
        return f"{text} ({content.strategy})" if content.strategy else text
    if isinstance(content, TrajectoryMemory):
        # What was done and what was learned: the lesson alone may not name the value
        # ("he said keep doing it this way" of a report shared as Google Sheets).
        done = "; ".join(part for part in (trace_text(content.trace), content.insight) if part)
        return f"earlier, for {content.query!r}: {done or memory_text(content)}"
    return f"workspace: {memory_text(content)}"


def _passes_through(exc: Exception) -> bool:
    """Whether a judge's error is raised as it is, not as a `PolicyError`.

    Ours say what went wrong already; a network failure of a remote judge is left
    for the task's retries.
    """
    # httpx is looked up, not imported: the default judge never needs it, and a judge
    # that raised one of its errors has imported it.
    httpx = sys.modules.get("httpx")
    return isinstance(exc, AutopersonaError | OSError) or (
        httpx is not None and isinstance(exc, httpx.TransportError)
    )


@dataclass(frozen=True)
class _Answer:
    """The evidence one requirement rests on: one statement, or agreeing choices."""

    strength: float
    when: datetime
    value: str | None
    memories: tuple[ScoredMemory, ...]  # newest first
    reason: str
    ceases: bool = False
    changes: bool = False
    situation: str | None = None  # the request's situation it answers for, if specific


class EvidencePolicy:
    """The default policy: ask exactly when a required requirement is unanswered.

    See the module documentation for how answers are found and chosen. A request
    without requirements is never asked about.

    Args:
        threshold: The strength (see `Verdict`) a memory needs to answer.
        margin: A later answer this close to the clearest one replaces it.
        max_guidance: At most this many memories beyond the requirements' evidence.
        judge: Decides which candidates answer; `SemanticJudge` by default.
    """

    asks_without_requirements: ClassVar[bool] = False  # see `Policy`

    def __init__(
        self,
        threshold: float = 0.3,
        margin: float = 0.1,
        max_guidance: int = 5,
        *,
        judge: Judge | None = None,
    ) -> None:
        for name, value in (("threshold", threshold), ("margin", margin)):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{name} must be a number, got {value!r}")
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must lie in [0, 1], got {value}")
        if isinstance(max_guidance, bool) or not isinstance(max_guidance, int) or max_guidance < 0:
            raise ValueError(f"max_guidance must be an int >= 0, got {max_guidance!r}")
        self.threshold = threshold
        self.margin = margin
        self.max_guidance = max_guidance
        self.judge = judge if judge is not None else SemanticJudge()

    def __repr__(self) -> str:
        return f"EvidencePolicy(threshold={self.threshold}, judge={self.judge!r})"

    def decide(self, request: PersonaRequest, memories: MemoryBundle) -> PersonaDecision:
        """Decide final or clarify; see the module documentation."""
        candidates = {
            requirement.name: _candidates(requirement, memories)
            for requirement in request.requirements
        }
        verdicts = self._judged(request, candidates)
        constraints = []
        weighed: set[str] = set()  # every memory that answered: superseded ones are no guidance
        for requirement in request.requirements:
            answer, found = self._answer(candidates[requirement.name], verdicts[requirement.name])
            weighed |= {m.record.id for a in found for m in a.memories}
            if answer is None:
                if requirement.required:
                    return self._clarify(request, requirement, verdicts[requirement.name], memories)
                continue
            constraints.append(_constraint(requirement, answer))
        constraints += self._guidance(request, memories, weighed)
        return FinalDecision(
            guidance=_compose(request, constraints), constraints=constraints, memories=memories
        )

    # -- judging -------------------------------------------------------------------------

    def _judged(
        self, request: PersonaRequest, candidates: Mapping[str, list[ScoredMemory]]
    ) -> dict[str, list[Verdict]]:
        """Ask the judge, and hold its answer to the contract (see `Judge`)."""
        if not any(candidates.values()):
            return {name: [] for name in candidates}  # nothing can answer: no judge needed
        try:
            raw = self.judge.judge(request, candidates)
        except Exception as exc:
            if _passes_through(exc):
                raise
            # A bug in a plugged-in judge, told apart from bad verdicts.
            raise PolicyError(f"judge {self.judge!r} raised {type(exc).__name__}: {exc}") from exc
        try:
            answer = {
                name: [Verdict.model_validate(v) for v in raw.get(name, ())] for name in candidates
            }
        except (AttributeError, TypeError, ValidationError) as exc:
            raise PolicyError(f"judge {self.judge!r} returned invalid verdicts: {exc}") from exc
        for name, found in answer.items():
            shown = {memory.record.id for memory in candidates[name]}
            stray = [v.memory_id for v in found if v.memory_id not in shown]
            if stray:
                raise PolicyError(
                    f"judge {self.judge!r} judged memories {stray} for {name!r}, which were not "
                    "among its candidates"
                )
        return answer

    def _answer(
        self, candidates: list[ScoredMemory], verdicts: Sequence[Verdict]
    ) -> tuple[_Answer | None, list[_Answer]]:
        """The current answer (``None`` if nothing answers now), and every answer found."""
        by_id = {memory.record.id: memory for memory in candidates}
        answers: list[_Answer] = []
        choices: list[tuple[Verdict, ScoredMemory]] = []
        for verdict in verdicts:
            memory = by_id[verdict.memory_id]
            if verdict.strength < self.threshold:
                continue
            if verdict.ceases or (verdict.answers and verdict.kind == "statement"):
                answers.append(_single(verdict, memory))
            elif verdict.answers:
                choices.append((verdict, memory))
        answers += [_repeated(agreeing) for agreeing in _agreeing(choices) if len(agreeing) >= 2]
        if not answers:
            return None, []
        found = answers
        # What was said for the request's situation ("on work trips, the aisle")
        # outranks what holds in general, however clearly and lately that was said.
        answers = [answer for answer in found if answer.situation] or found
        # The clearest answer holds, unless something said later replaces it: about
        # as clear, on the same topic, announcing a change ("pescatarian now"), or
        # a habit of past tasks.
        clearest = current = max(answers, key=lambda answer: (answer.strength, answer.when))
        for answer in sorted(answers, key=lambda answer: answer.when):
            if answer.when > current.when and (
                answer.strength >= clearest.strength - self.margin
                or _same_topic(answer, current)
                or answer.changes
                or answer.ceases
                or len(answer.memories) > 1
            ):
                current = answer
        return (None if current.ceases else current), found

    # -- clarifying and guidance ---------------------------------------------------------

    def _clarify(
        self,
        request: PersonaRequest,
        requirement: Requirement,
        verdicts: Sequence[Verdict],
        memories: MemoryBundle,
    ) -> ClarifyDecision:
        earlier = [v.value for v in verdicts if v.kind == "choice" and v.value]
        options = requirement.options or list(dict.fromkeys(earlier))
        question = compose_question(requirement, request, options)
        # Name what memory holds that came close: "I have 'Chicago', which is none of
        # the options", "I have 'the aisle', but for work trips".
        close = max(
            (
                v
                for v in verdicts
                if not v.answers
                and not v.ceases
                and v.value
                and v.hint
                and v.strength >= self.threshold
            ),
            key=lambda v: v.strength,
            default=None,
        )
        if close is not None:
            question += f" I have {close.value!r}, {close.hint}."
        return ClarifyDecision(
            question=question,
            requirement=requirement.name,
            options=options,
            memories=memories,
            request=request,
        )

    def _guidance(
        self, request: PersonaRequest, memories: MemoryBundle, used: set[str]
    ) -> list[Constraint]:
        """Standing constraints for the node's work first, then memories about it.

        A memory about the work that a later change on its topic replaces is left
        out: "diet: vegetarian" guides no more once "diet: pescatarian now" is said.
        An answer learned at another node is about this one only if its own work
        (id, instruction) names its topic: the request is every node's, and "share
        them" in it makes "sharing channel", asked at ``share``, no concern of
        ``draft``.
        """
        node = request.node
        work = " ".join(part for part in (request.query, node.instruction if node else "") if part)
        about = content_roots(f"{work} {node.id if node else ''}".replace("-", " "))
        own = content_roots(f"{node.instruction} {node.id}".replace("-", " ")) if node else about
        standing: dict[str, Constraint] = {}
        related: dict[str, Constraint] = {}
        superseded = _superseded(memories)
        for memory in sorted(memories, key=lambda m: -m.score):
            record = memory.record
            if record.id in used or record.id in standing or record.id in related:
                continue
            text = statement(record)
            if text is None:
                continue
            # A standing constraint is shown even if a later memory shares its topic:
            # two allergies are both true, and a stale one shown costs less than a
            # live one dropped.
            if applies(text, work) or (
                _CONSTRAINT.search(text) and memory.score >= _RELEVANT and record.layer == "persona"
            ):
                standing[record.id] = _guide(memory, "a standing constraint for this work")
            elif record.id not in superseded and _about(
                record, own if _learned_elsewhere(record, node) else about
            ):
                related[record.id] = _guide(memory, "about this work")
        return [*standing.values(), *related.values()][: self.max_guidance]


# A person's rule: "never book anything Thursday afternoons", "latex allergy", "no
# red-eye flights, ever". One that the work's own searches found relevant in meaning
# ("balloons" for a latex allergy, a car service for "I don't drive on Shabbat") is a
# standing constraint of it, beside those the stakes of `standing.applies` name.
_CONSTRAINT = re.compile(
    r"\b(?:never|no|not|don't|do not|can't|cannot|won't|avoid|allerg\w*|intoleran\w*|"
    r"only|must|always|strictly|banned)\b",
    re.IGNORECASE,
)
_RELEVANT = 0.15
"""The retrieval score (see `Scoring`) from which a rule the work's searches found bears
on it: well above what unrelated memories score (0), below a plain paraphrase."""


def _candidates(requirement: Requirement, memories: MemoryBundle) -> list[ScoredMemory]:
    """The memories that may answer a requirement, each once.

    What its own searches recalled, what the node's and the request's searches
    recalled (memories about the same work), and the answers learned here.
    """
    mine = requirement_label(requirement)
    found: dict[str, ScoredMemory] = {}
    for layer in requirement.layers:
        for memory in memories.layer(layer):
            label = memory.search.label
            if label == mine or label in _SHARED or (label == LEARNED and layer == "persona"):
                found.setdefault(memory.record.id, memory)
    return list(found.values())


_SHARED = frozenset({"node", "query"})


def _same_topic(later: _Answer, earlier: _Answer) -> bool:
    """Whether two answers are persona memories filed under one slot ("citation style")."""
    a, b = later.memories[0].record.content, earlier.memories[0].record.content
    return (
        isinstance(a, PersonaMemory)
        and isinstance(b, PersonaMemory)
        and same_slot(a.topic, b.topic)
    )


def _single(verdict: Verdict, memory: ScoredMemory) -> _Answer:
    return _Answer(
        strength=verdict.strength,
        when=memory.record.at,
        value=verdict.value,
        memories=(memory,),
        reason=verdict.reason,
        ceases=verdict.ceases,
        changes=verdict.changes,
        situation=verdict.situation,
    )


def _agreeing(
    choices: list[tuple[Verdict, ScoredMemory]],
) -> list[list[tuple[Verdict, ScoredMemory]]]:
    """Group past choices that share a word of their value ("aisle", "Premier Inn")."""
    groups: list[tuple[frozenset[str], list[tuple[Verdict, ScoredMemory]]]] = []
    for choice in choices:
        roots = content_roots(choice[0].value or "")
        for i, (shared, members) in enumerate(groups):
            if roots & shared:
                groups[i] = (shared & roots, [*members, choice])
                break
        else:
            groups.append((roots, [choice]))
    return [members for _, members in groups]


def _repeated(agreeing: list[tuple[Verdict, ScoredMemory]]) -> _Answer:
    """Choices several past tasks agree on: stronger the more of them there are."""
    newest = sorted(agreeing, key=lambda pair: pair[1].record.at, reverse=True)
    shared = frozenset.intersection(*(content_roots(v.value or "") for v, _ in agreeing))
    value = newest[0][0].value or ""
    value = " ".join(word for word in value.split() if content_roots(word) & shared) or value
    return _Answer(
        strength=min(0.9, 0.55 + 0.1 * len(agreeing)),
        when=newest[0][1].record.at,
        value=value,
        memories=tuple(memory for _, memory in newest),
        reason=f"chosen in {len(agreeing)} past tasks",
    )


def _constraint(requirement: Requirement, answer: _Answer) -> Constraint:
    first = answer.memories[0]
    if len(answer.memories) > 1:
        tasks = [
            repr(m.record.content.query)
            for m in answer.memories
            if isinstance(m.record.content, TrajectoryMemory)
        ]
        where = ", ".join(tasks) if tasks else f"{len(answer.memories)} memories"
        text = f"{requirement.name}: {answer.value} (chosen before, in {where})"
    else:
        text = constraint_text(first)
        if answer.value and answer.value.casefold() not in text.casefold():
            text = f"{requirement.name}: {answer.value} ({text})"
    return Constraint(
        text=text,
        requirement=requirement.name,
        memory_id=first.record.id,
        layer=first.record.layer,
        score=answer.strength,
        value=answer.value,
        evidence=[m.record.id for m in answer.memories],
        reason=answer.reason,
    )


def statement(record: MemoryRecord) -> str | None:
    """The text of what a memory states about the person, if it states anything.

    A preference or workspace state as stored; a past task's lesson, not its trace.
    """
    content = record.content
    if isinstance(content, PersonaMemory):
        return memory_text(content)
    if isinstance(content, TrajectoryMemory):
        return content.insight or None
    return memory_text(content)


def _superseded(memories: MemoryBundle) -> set[str]:
    """Persona memories a later one on their topic replaces by announcing a change.

    The change must be about what the older one says, sharing a word of its value
    beyond the topic ("no longer vegetarian" replaces "vegetarian dinners"): two
    memories on "Pip (dog)", "check treats for xylitol" and "grain-free food now",
    both hold.
    """
    by_topic: dict[str, list[tuple[MemoryRecord, PersonaMemory]]] = {}
    for memory in memories.persona:
        content = memory.record.content
        assert isinstance(content, PersonaMemory)
        by_topic.setdefault(normalise(content.topic), []).append((memory.record, content))
    older: set[str] = set()
    for held in by_topic.values():
        if len({record.id for record, _ in held}) < 2:
            continue
        for changed, content in held:
            if not any(part.changing or part.ceasing for part in clauses(content.preference)):
                continue
            said = content_roots(content.preference) - content_roots(content.topic)
            older |= {
                record.id
                for record, other in held
                if record.at < changed.at and said & content_roots(other.preference)
            }
    return older


def _learned_elsewhere(record: MemoryRecord, node: NodeInfo | None) -> bool:
    """Whether a memory is a person's answer to a question another node asked."""
    source = record.provenance
    return (
        node is not None
        and source is not None
        and source.kind == "clarification"
        and source.node is not None
        and source.node != node.id
    )


def _about(record: MemoryRecord, work: frozenset[str]) -> bool:
    """Whether a memory is about the node's work: its topic or task shares its words."""
    content = record.content
    if isinstance(content, PersonaMemory):
        topic = phrase(content.topic)
        return bool(set(topic.roots) & work) or root(content.topic) in work
    if isinstance(content, TrajectoryMemory):
        return bool(content.insight) and len(content_roots(content.query) & work) >= 2
    return len(content_roots(memory_text(content)) & work) >= 2


def _guide(memory: ScoredMemory, reason: str) -> Constraint:
    return Constraint(
        text=constraint_text(memory),
        memory_id=memory.record.id,
        layer=memory.record.layer,
        score=memory.score,
        evidence=[memory.record.id],
        reason=reason,
    )


def _compose(request: PersonaRequest, constraints: list[Constraint]) -> str:
    target = f"step {request.node.id!r}" if request.node else "this request"
    if not constraints:
        return f"No stored preference applies to {target}; proceed as asked."
    lines = "\n".join(f"- {constraint.text}" for constraint in constraints)
    return f"For {target}, respect what this person has told us:\n{lines}"
