"""Judges: does a recalled memory answer a requirement, and with what value?

Retrieval recalls candidates by similarity; a `Judge` decides. Similarity cannot
judge: a memory sharing the *wrong* words ("hotel booking method" for a "hotel
budget") is as close as a paraphrase. The default `LexicalJudge` reads each
candidate on the right fields, attribute-aware (see `phrases.Phrase`):

- a persona memory's **topic** (and aliases) against the requirement's name: the
  same attribute of a compatible subject answers; the same word as another
  attribute ("budget spreadsheet" for "budget") or the same attribute of another
  subject ("lesson length" for "quiz length") conflicts;
- its **value** (preference and strategy; a trajectory's insight; a workspace
  entry) when the topic is vague ("travel", "misc"): a declared option stated, the
  attribute named, its subject named together with a value of the attribute's
  shape (an amount for a budget, a time for a pickup);
- a trajectory's **trace** as a past *choice*, evidence only when repeated (the
  policy counts them); a trajectory about the attribute ("Book a venue for ...")
  makes its lesson a statement about it;
- **change**: a value that no longer holds ("I don't drink coffee any more")
  ceases the requirement; one that announces a change ("pescatarian now") is
  marked, so that it replaces what came before;
- a **learned answer** (`PersonaAgent.learn`) by its aliases and options, and at
  the node or request it was learned for, even in other words, unless another
  requirement of the request claims it or its value does not fit.

Strengths are fixed weights of these features, never frequencies of the user's
bank, so a threshold means the same in an empty bank and in a noisy one.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Annotated, Literal, NamedTuple, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from autopersona_flows.agent import reading
from autopersona_flows.agent.decisions import PersonaRequest
from autopersona_flows.agent.reading import Found, Need, Reader, Relation, WordMatcher
from autopersona_flows.memory.phrases import clauses, content_roots, kin, phrase, value_kinds
from autopersona_flows.memory.records import PersonaMemory, TrajectoryMemory, WorkspaceMemory
from autopersona_flows.memory.retrieval import ScoredMemory
from autopersona_flows.memory.text import json_text, normalise, trace_text

__all__ = ["Judge", "LexicalJudge", "Reading", "Verdict"]


class Verdict(BaseModel):
    """A judge's finding on one candidate memory for one requirement.

    Attributes:
        memory_id: The candidate judged.
        answers: Whether it answers the requirement.
        strength: How clearly, in [0, 1]; the policy's threshold applies to it.
        value: The value it gives: a declared option, or the memory's own words.
        kind: ``statement`` (the person said so) or ``choice`` (a past task chose it:
            evidence only when several agree).
        ceases: It says the preference no longer holds, without a new value.
        changes: It says the preference changed ("now", "switched to"): it replaces
            older answers even when they match more clearly.
        situation: The circumstance it answers for ("work trips"), when it holds in
            a specific one and that is the request's: it outranks general answers.
        reason: Why, in a few words (shown with the constraint).
        hint: For a memory that does not answer although it gives a value (for
            another situation, or none of the options), why not, as a question can
            say it: "but for work trips".
    """

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    memory_id: str
    answers: bool
    strength: Annotated[float, Field(ge=0.0, le=1.0)] = 0.0
    value: str | None = None
    kind: Literal["statement", "choice"] = "statement"
    ceases: bool = False
    changes: bool = False
    situation: str | None = None
    reason: str = ""
    hint: str = ""


@runtime_checkable
class Judge(Protocol):
    """Decides which recalled memories answer which requirement of a request.

    Contract: for each requirement name in ``candidates``, return one `Verdict` per
    candidate judged (a candidate left out answers nothing); every ``memory_id``
    must be one of that requirement's candidates.
    """

    def judge(
        self, request: PersonaRequest, candidates: Mapping[str, Sequence[ScoredMemory]]
    ) -> Mapping[str, Sequence[Verdict]]:
        """Judge each requirement's candidates."""
        ...


class Reading(NamedTuple):
    """How `LexicalJudge` read one candidate: its verdict, and what it rests on.

    Attributes:
        verdict: The verdict.
        relation: How the memory's topic (a persona memory's), task or key relates
            to the requirement's name.
        found: What its value text says about the requirement.
    """

    verdict: Verdict
    relation: Relation
    found: Found


class LexicalJudge:
    """The default judge: attribute-aware reading of topics and values; no model.

    Args:
        matcher: Tells which words mean the same beyond equal roots (e.g. a
            `DenseWordMatcher` over a sentence encoder); roots only if ``None``.
    """

    def __init__(self, matcher: WordMatcher | None = None) -> None:
        self.matcher = matcher
        self.reader = Reader(matcher)

    def __repr__(self) -> str:
        return f"LexicalJudge({self.matcher!r})" if self.matcher else "LexicalJudge()"

    def judge(
        self, request: PersonaRequest, candidates: Mapping[str, Sequence[ScoredMemory]]
    ) -> dict[str, list[Verdict]]:
        """Judge each requirement's candidates; see the module documentation."""
        requirements = {requirement.name: requirement for requirement in request.requirements}
        needs = {name: Need.of(requirements[name], request) for name in candidates}
        verdicts = {
            name: [self.verdict(needs[name], memory) for memory in memories]
            for name, memories in candidates.items()
        }
        self.learned_here(request, needs, candidates, verdicts)
        return verdicts

    def verdict(self, need: Need, memory: ScoredMemory) -> Verdict:
        """Judge one candidate for one requirement."""
        return self.reading(need, memory).verdict

    def reading(self, need: Need, memory: ScoredMemory, text: str | None = None) -> Reading:
        """Judge one candidate for one requirement, with what the verdict rests on.

        Args:
            need: The requirement, read in its request.
            memory: The candidate.
            text: Read this as the memory's value instead of its own (a part of it
                that holds in the request's situation); persona memories only.
        """
        content = memory.record.content
        memory_id = memory.record.id
        if isinstance(content, PersonaMemory):
            return self._persona(need, memory_id, content, text)
        if isinstance(content, TrajectoryMemory):
            return self._trajectory(need, memory_id, content)
        return self._workspace(need, memory_id, content)

    # -- layers ---------------------------------------------------------------------------

    def _persona(
        self, need: Need, memory_id: str, content: PersonaMemory, text: str | None = None
    ) -> Reading:
        relations = [
            self.reader.relate(need, phrase(topic)) for topic in (content.topic, *content.aliases)
        ]
        relation = max(relations, key=_RANK.__getitem__)
        if relation in ("none", "subject") and self._same_choices(need, content):
            relation = "match"
        if text is None:
            text = (
                f"{content.preference}. {content.strategy}"
                if content.strategy
                else content.preference
            )
        topic = phrase(content.topic)
        found = self.reader.read(need, text, frozenset(topic.roots))
        strength, reason = reading.strength(need, relation, found, specific=topic.specific)
        if strength and relation in ("match", "partial"):
            reason = f"its topic {content.topic!r} names the requirement"
        verdict = _verdict(memory_id, found, strength, reason, default=content.preference)
        return Reading(verdict, relation, found)

    def _same_choices(self, need: Need, content: PersonaMemory) -> bool:
        """A learned answer that was offered the same specific choices: the same need."""
        offered = {content_roots(option) for option in content.options} - {frozenset()}
        shared = offered & {roots for _, roots in need.options}
        return len(shared - _GENERIC_ANSWERS) >= 2

    def _trajectory(self, need: Need, memory_id: str, content: TrajectoryMemory) -> Reading:
        asked = content_roots(content.query)
        surface = need.name.surface
        relation: Relation = (
            "about"  # a past task about the attribute: "Book a venue for Aisha's leaving do"
            if need.name.identity and self.reader.has_all(need.name.identity, asked, surface)
            else "subject"  # a task like this one
            if self.reader.has_any(need.context, asked, surface)
            else "none"
        )
        if content.insight:
            found = self.reader.read(need, content.insight)
            strength, reason = reading.strength(need, relation, found)
            if strength:
                verdict = _verdict(
                    memory_id,
                    found,
                    strength,
                    f"the lesson of a past task ({content.query!r}): {reason}",
                    default=content.insight,
                )
                return Reading(verdict, relation, found)
        trace = ". ".join(
            part for part in (trace_text(content.trace), json_text(content.outcome)) if part
        )
        found = self.reader.read(need, trace)
        value = found.option or (self._chosen(need, trace) if found.attribute else None)
        if value is None:
            verdict = Verdict(memory_id=memory_id, answers=False, reason="no choice of it")
            return Reading(verdict, relation, found)
        verdict = Verdict(
            memory_id=memory_id,
            answers=True,
            strength=0.6,
            value=value,
            kind="choice",
            reason=f"chosen in a past task ({content.query!r})",
        )
        return Reading(verdict, relation, found)

    def _chosen(self, need: Need, trace: str) -> str | None:
        """The words next to the attribute in a trace ("aisle" in "picked seat 14C (aisle)")."""
        skip = need.name.identity | need.name.modifiers
        for part in clauses(trace.replace("(", " ").replace(")", " ")):
            for i in part.positions(need.name.identity):
                near = [
                    part.surface[j]
                    for j in (*range(max(0, i - 2), i), *range(i + 1, min(len(part.roots), i + 4)))
                    if part.content[j]
                    and part.roots[j] not in skip
                    and not part.surface[j].endswith("ed")
                ]
                if near:
                    return " ".join(near)
        return None

    def _workspace(self, need: Need, memory_id: str, content: WorkspaceMemory) -> Reading:
        best = Reading(
            Verdict(memory_id=memory_id, answers=False, reason="not in the workspace"),
            "none",
            Found(),
        )
        for key, value in _pairs({"task": content.task, "state": content.state}):
            topic = phrase(key)
            relation = self.reader.relate(need, topic)
            if relation == "conflict":
                continue
            found = self.reader.read(need, value, frozenset(topic.roots))
            strength, reason = reading.strength(need, relation, found)
            if relation == "about" and found.kinds - {"name"}:
                strength, reason = max(strength, 0.6), "its subject, with a value of its shape"
            if strength > best.verdict.strength:
                verdict = _verdict(
                    memory_id,
                    found,
                    strength,
                    f"the workspace's {key!r}: {reason}",
                    default=f"{key} = {value}",
                )
                best = Reading(verdict, relation, found)
        return best

    # -- learned answers ------------------------------------------------------------------

    def learned_here(
        self,
        request: PersonaRequest,
        needs: Mapping[str, Need],
        candidates: Mapping[str, Sequence[ScoredMemory]],
        verdicts: dict[str, list[Verdict]],
    ) -> None:
        """An answer learned at this node answers its need here in any words.

        Only where nothing else ties it to a requirement: an answer already answering
        one requirement of the request, or fitting several, is left alone, and its
        value must fit (one of the options, the attribute's shape). Elsewhere in the
        same job (the same request, another node) a quantity must also be linked to
        the requirement by more than its shape (see `_same_need`).
        """
        node = request.node
        at_node = {
            normalise(text) for text in ((node.id, node.instruction) if node else ()) if text
        }
        for_job = {normalise(request.query)}
        learned: dict[str, list[tuple[str, int]]] = {}
        claimed: set[str] = set()
        for name, memories in candidates.items():
            for i, memory in enumerate(memories):
                content = memory.record.content
                verdict = verdicts[name][i]
                if verdict.answers and verdict.strength >= 0.6:
                    claimed.add(memory.record.id)
                if not isinstance(content, PersonaMemory) or not content.contexts:
                    continue
                contexts = {normalise(context) for context in content.contexts}
                if contexts & at_node or (
                    contexts & for_job and self._same_need(needs[name], content)
                ):
                    learned.setdefault(memory.record.id, []).append((name, i))
        for memory_id, places in learned.items():
            if memory_id in claimed:
                continue
            fitting = [
                (name, i)
                for name, i in places
                if not verdicts[name][i].answers and self._fits(needs[name], candidates[name][i])
            ]
            if len(fitting) == 1:
                name, i = fitting[0]
                content = candidates[name][i].record.content
                assert isinstance(content, PersonaMemory)
                verdicts[name][i] = Verdict(
                    memory_id=memory_id,
                    answers=True,
                    strength=0.6,
                    value=self.reader.read(needs[name], content.preference).option
                    or content.preference,
                    reason=f"the person answered {content.topic!r} at this node",
                )

    def _same_need(self, need: Need, content: PersonaMemory) -> bool:
        """Whether another node's unanswered need may be what was answered in this job.

        It must be linked to the answer (see `_linked`), unless it is asked as an open
        question ("where to collect from" after "pharmacy", "what they can't eat"
        after "dietary needs") about something other than a quantity. A need named
        by a noun names its own attribute: "hotel" is no "airline", whatever fits;
        and a quantity is the shape of many needs of one job: a tip is no hotel
        budget.
        """
        quantities = (need.kinds | value_kinds(content.preference)) & _QUANTITIES
        return (need.open and not quantities) or self._linked(need, content)

    def _linked(self, need: Need, content: PersonaMemory) -> bool:
        """Whether a requirement is tied to a learned answer by more than its value's shape."""
        offered = frozenset().union(*(content_roots(option) for option in content.options))
        stated = self.reader.read(need, content.preference).option is not None
        topic = phrase(content.topic)
        return (
            (bool(offered & need.option_roots) and stated)  # the same choices, answered
            or bool(need.described & (offered | topic.identity | frozenset(topic.roots)))
        )

    def _fits(self, need: Need, memory: ScoredMemory) -> bool:
        content = memory.record.content
        assert isinstance(content, PersonaMemory)
        found = self.reader.read(need, content.preference)
        if need.options:
            return found.option is not None  # the answer is one of this requirement's choices
        topic = phrase(content.topic)
        other_attribute = (
            self.reader.relate(need, topic) == "conflict"
            and topic.head is not None
            and need.name.head is not None
            and not kin(topic.head, need.name.head)
        )
        # At the same step, "collection time" may well be the "pickup time" answered:
        # only another attribute ("meeting room" for "meeting hours") rules it out.
        return not other_attribute and (not need.kinds or bool(found.kinds))


# -- strength ------------------------------------------------------------------------------

_RANK: dict[str, int] = {
    "conflict": 0,
    "none": 1,
    "subject": 2,
    "about": 3,
    "partial": 4,
    "match": 5,
}
_QUANTITIES = frozenset({"amount", "limit", "time", "day", "date", "duration", "count", "size"})
_GENERIC_ANSWERS = frozenset(
    frozenset({word}) for word in ("yes", "no", "none", "other", "either", "any", "both", "skip")
)


def _verdict(
    memory_id: str, found: Found, strength: float, reason: str, *, default: str
) -> Verdict:
    if strength == 0.0:
        return Verdict(memory_id=memory_id, answers=False, reason=reason)
    if found.ceases and not found.option:
        return Verdict(
            memory_id=memory_id,
            answers=False,
            strength=strength,
            ceases=True,
            reason="says it no longer holds",
        )
    return Verdict(
        memory_id=memory_id,
        answers=True,
        strength=strength,
        value=found.option or default,
        changes=found.changes,
        reason=reason,
    )


def _pairs(value: object, key: str = "") -> Iterator[tuple[str, str]]:
    """(key, value text) of every scalar in a JSON value, keyed by its nearest object key."""
    if isinstance(value, dict):
        for child_key, child in value.items():
            if isinstance(child, dict | list):
                yield from _pairs(child, str(child_key))
            elif child is not None:
                yield str(child_key), str(child)
    elif isinstance(value, list):
        items = [
            str(item) for item in value if not isinstance(item, dict | list) and item is not None
        ]
        if items and key:
            yield key, ", ".join(items)
        for child in value:
            if isinstance(child, dict | list):
                yield from _pairs(child, key)
    elif value is not None and key:
        yield key, str(value)
