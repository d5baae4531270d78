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
from dataclasses import dataclass, field
from typing import Annotated, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from autopersona_flows.agent.decisions import PersonaRequest, Requirement
from autopersona_flows.agent.phrases import (
    _KIN_WORDS,
    Clause,
    Phrase,
    attribute_kinds,
    clauses,
    content_roots,
    kin,
    phrase,
    value_kinds,
)
from autopersona_flows.memory.records import PersonaMemory, TrajectoryMemory, WorkspaceMemory
from autopersona_flows.memory.retrieval import ScoredMemory
from autopersona_flows.memory.text import json_text, normalise

__all__ = ["Judge", "LexicalJudge", "Verdict", "WordMatcher"]


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
        reason: Why, in a few words (shown with the constraint).
    """

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    memory_id: str
    answers: bool
    strength: Annotated[float, Field(ge=0.0, le=1.0)] = 0.0
    value: str | None = None
    kind: Literal["statement", "choice"] = "statement"
    ceases: bool = False
    changes: bool = False
    reason: str = ""


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


class WordMatcher(Protocol):
    """Tells whether two content words name the same thing, beyond equal roots."""

    def same(self, a: str, b: str) -> bool:
        """Whether ``a`` and ``b`` (words as written) mean the same here."""
        ...


Relation = Literal["match", "partial", "about", "subject", "none", "conflict"]
"""How a topic relates to a requirement's name: the same attribute (``match``), the
attribute in general (``partial``: "budget" for "hotel budget"), what the attribute
is of (``about``: "Biscuit's food" for "dog food brand"), what the node is about
(``subject``), nothing said, or another attribute (``conflict``)."""


@dataclass(frozen=True)
class _Need:
    """A requirement read once per decision: its phrase, options, context and shapes."""

    name: Phrase
    described: frozenset[str]  # roots of the description and the declared question
    options: tuple[tuple[str, frozenset[str]], ...]  # option text, its roots
    context: frozenset[str]  # roots of the query, node id and instruction
    kinds: frozenset[str]  # value shapes the attribute takes

    @classmethod
    def of(cls, requirement: Requirement, request: PersonaRequest) -> _Need:
        node = request.node
        where = [request.query, *((node.id, node.instruction) if node else ())]
        name = phrase(requirement.name)
        # A weak head ("number", "format") says nothing of the value's shape; its
        # modifiers may ("date format" takes a date).
        named = name.modifiers if name.weak else frozenset(name.roots[-1:])
        return cls(
            name=name,
            described=content_roots(f"{requirement.description} {requirement.question or ''}"),
            options=tuple(
                (option, roots)
                for option in requirement.options
                if (roots := content_roots(option))
            ),
            context=content_roots(" ".join(where).replace("-", " ").replace("_", " ")),
            kinds=attribute_kinds(named) | name.asks,
        )

    @property
    def subject_known(self) -> bool:
        """Whether the request itself says what the attribute is of (or nothing need)."""
        return self.name.subject <= self.context

    @property
    def option_roots(self) -> frozenset[str]:
        return frozenset(word for _, roots in self.options for word in roots)


@dataclass(frozen=True)
class _Found:
    """What a value text says about a need."""

    option: str | None = None  # the declared option it states
    polarity: int = 0  # +1 stated with a preference cue, 0 plainly
    distinct: bool = False  # the option is specific (several words, a digit) or the only one said
    attribute: bool = False  # names the attribute, not as another subject's
    elsewhere: bool = False  # names the attribute, but only as another subject's
    modifiers: bool = False  # names every modifier of the requirement, with the topic
    said: bool = False  # names every modifier in the text itself
    closest: bool = False  # names the modifier closest to the head
    kinds: frozenset[str] = frozenset()  # the attribute's value shapes it holds
    ceases: bool = False  # says it no longer holds, and nothing new
    changes: bool = False  # announces a change
    short: bool = False  # a statement of a few words, about one thing
    mentioned: list[Clause] = field(default_factory=list)


class LexicalJudge:
    """The default judge: attribute-aware reading of topics and values; no model.

    Args:
        matcher: Tells which words mean the same beyond equal roots (e.g. a
            `DenseWordMatcher` over a sentence encoder); roots only if ``None``.
    """

    def __init__(self, matcher: WordMatcher | None = None) -> None:
        self.matcher = matcher

    def __repr__(self) -> str:
        return f"LexicalJudge({self.matcher!r})" if self.matcher else "LexicalJudge()"

    def judge(
        self, request: PersonaRequest, candidates: Mapping[str, Sequence[ScoredMemory]]
    ) -> dict[str, list[Verdict]]:
        """Judge each requirement's candidates; see the module documentation."""
        requirements = {requirement.name: requirement for requirement in request.requirements}
        needs = {name: _Need.of(requirements[name], request) for name in candidates}
        verdicts = {
            name: [self.verdict(needs[name], memory) for memory in memories]
            for name, memories in candidates.items()
        }
        self._learned_here(request, needs, candidates, verdicts)
        return verdicts

    def verdict(self, need: _Need, memory: ScoredMemory) -> Verdict:
        """Judge one candidate for one requirement."""
        content = memory.record.content
        memory_id = memory.record.id
        if isinstance(content, PersonaMemory):
            return self._persona(need, memory_id, content)
        if isinstance(content, TrajectoryMemory):
            return self._trajectory(need, memory_id, content)
        return self._workspace(need, memory_id, content)

    # -- words, through the matcher -------------------------------------------------------

    def _has(self, word: str | None, roots: frozenset[str], surface: Mapping[str, str]) -> bool:
        if word is None:
            return False
        if word in roots or (word in _KIN_WORDS and any(kin(word, other) for other in roots)):
            return True
        if self.matcher is None:
            return False
        mine = surface.get(word, word)
        return any(self.matcher.same(mine, surface.get(other, other)) for other in roots)

    def _all(
        self, wanted: frozenset[str], roots: frozenset[str], surface: Mapping[str, str]
    ) -> bool:
        return all(self._has(word, roots, surface) for word in wanted)

    def _any(
        self, wanted: frozenset[str], roots: frozenset[str], surface: Mapping[str, str]
    ) -> bool:
        return any(self._has(word, roots, surface) for word in wanted)

    # -- topics ---------------------------------------------------------------------------

    def relate(self, need: _Need, topic: Phrase) -> Relation:  # noqa: PLR0911 - a return a case
        """How a topic relates to the requirement's name; see `Relation`."""
        name = need.name
        if name.head is None or topic.head is None:
            return "none"
        surface = {**topic.surface, **name.surface}
        known = name.modifiers | need.described | need.context | need.option_roots
        same_head = (
            kin(topic.head, name.head)
            or self._has(topic.head, frozenset({name.head}), surface)
            or bool(name.asks and attribute_kinds(frozenset({topic.head})) & name.asks)
        )
        if topic.activity:
            known |= topic.modifiers  # "citing sources": the object of the activity
        if same_head and not (name.weak or topic.weak):
            return self._subjects(name.subject, name.modifiers, topic.modifiers, known, surface)
        if name.weak or topic.weak:
            # "citation style" ~ "citation format" ~ "citation": the modifiers name it.
            mine = name.identity
            theirs = topic.modifiers if topic.weak else frozenset(topic.roots)
            if self._any(mine, theirs, surface):
                return self._subjects(mine, mine, theirs, known | mine, surface)
        elif self._has(topic.head, name.modifiers | need.described, surface):
            return "about"  # "Biscuit's food" for "dog food brand": the value says the rest
        if self._any(frozenset(name.roots), frozenset(topic.roots), surface):
            return "conflict"  # a shared word, another attribute: "budget spreadsheet"
        if self._has(topic.head, need.context, surface):
            return "subject"
        return "none"

    def _subjects(
        self,
        subject: frozenset[str],
        mine: frozenset[str],
        theirs: frozenset[str],
        known: frozenset[str],
        surface: Mapping[str, str],
    ) -> Relation:
        """The same attribute: are the subjects compatible?

        ``subject`` are the requirement's modifiers that say what the attribute is of,
        ``mine`` all of them, ``theirs`` the topic's.
        """
        if any(not self._has(word, known, surface) for word in theirs):
            return "conflict"  # "dog training class" for a train's "travel class"
        if subject and theirs and not self._any(subject | mine, theirs, surface):
            return "conflict"  # "lesson length" for "quiz length"
        return "partial" if mine and not theirs else "match"

    # -- values ---------------------------------------------------------------------------

    def read(self, need: _Need, text: str, topic: frozenset[str] = frozenset()) -> _Found:
        """What ``text`` says about the need: options, the attribute, its shape, change.

        ``topic`` are the roots of the memory's topic: it may name the attribute's
        subject ("Mia school run") while the text gives the value ("3:15").
        """
        parts = clauses(text)
        if not parts:
            return _Found()
        name = need.name
        surface = dict(name.surface)
        everything = frozenset().union(*(part.joined for part in parts))
        around = everything | topic
        option, polarity, distinct = self._option(need, parts)
        shapes = value_kinds(text)
        elsewhere = False
        if name.asks:  # a question ("when I can meet") is answered by a value of its shape
            attribute = bool(name.asks & shapes)
        else:
            attribute = bool(name.identity) and self._all(name.identity, everything, surface)
            elsewhere = attribute and self._elsewhere(need, parts, everything, surface)
            attribute = attribute and not elsewhere
        mentioned = [
            part
            for part in parts
            if (option is not None and self._any(need.option_roots, part.joined, surface))
            or self._any(name.identity | name.modifiers, part.joined, surface)
        ] or list(parts)
        return _Found(
            option=option,
            polarity=polarity,
            distinct=distinct,
            attribute=attribute,
            elsewhere=elsewhere,
            modifiers=bool(name.modifiers) and self._all(name.modifiers, around, surface),
            said=bool(name.modifiers) and self._all(name.modifiers, everything, surface),
            closest=name.closest is not None and self._has(name.closest, around, surface),
            kinds=need.kinds & shapes,
            ceases=any(part.ceasing for part in mentioned)
            and not any(part.changing and not part.ceasing for part in parts),
            changes=any(part.changing and not part.ceasing for part in parts),
            short=sum(sum(part.content) for part in parts) <= 12,
            mentioned=mentioned,
        )

    def _option(self, need: _Need, parts: Sequence[Clause]) -> tuple[str | None, int, bool]:
        """The declared option ``parts`` state, how (+1 preferred, 0 plainly), and if distinct."""
        said: dict[str, int] = {}
        everything = frozenset().union(*(part.joined for part in parts))
        for option, roots in need.options:
            for part in parts:
                positions = part.positions(roots)
                if (
                    len({part.roots[i] for i in positions}) < len(roots)
                    and not roots <= part.joined
                ):
                    continue
                polarity = part.polarity(positions[0]) if positions else 0
                said[option] = max(said.get(option, -1), polarity)
            if option not in said and len(roots) > 1 and roots <= everything:
                said[option] = 0  # an option across clauses: "firm but polite"
        stated = {option: polarity for option, polarity in said.items() if polarity >= 0}
        if not stated:
            return None, 0, False
        option = max(stated, key=lambda o: (stated[o], len(o)))
        specific = len(content_roots(option)) > 1 or any(c.isdigit() for c in option)
        return option, stated[option], specific or len(said) == 1

    def _elsewhere(
        self,
        need: _Need,
        parts: Sequence[Clause],
        everything: frozenset[str],
        surface: Mapping[str, str],
    ) -> bool:
        """Whether every mention of the attribute is another subject's ("the grocery budget")."""
        name = need.name
        if not name.modifiers or name.weak or self._all(name.modifiers, everything, surface):
            return False
        known = name.modifiers | need.context | need.described
        mentions = 0
        for part in parts:
            for i in part.positions(frozenset({name.head})):
                mentions += 1
                before = i - 1 if i > 0 and part.content[i - 1] else None
                if before is None or self._has(part.roots[before], known, surface):
                    return False
        return mentions > 0

    # -- layers ---------------------------------------------------------------------------

    def _persona(self, need: _Need, memory_id: str, content: PersonaMemory) -> Verdict:
        relations = [
            self.relate(need, phrase(topic)) for topic in (content.topic, *content.aliases)
        ]
        relation = max(relations, key=_RANK.__getitem__)
        if relation in ("none", "subject") and self._same_choices(need, content):
            relation = "match"
        text = (
            f"{content.preference}. {content.strategy}" if content.strategy else content.preference
        )
        topic = phrase(content.topic)
        found = self.read(need, text, frozenset(topic.roots))
        strength, reason = _strength(need, relation, found, specific=topic.specific)
        if relation in ("match", "partial"):
            reason = f"its topic {content.topic!r} names the requirement"
        return _verdict(memory_id, found, strength, reason, default=content.preference)

    def _same_choices(self, need: _Need, content: PersonaMemory) -> bool:
        """A learned answer that was offered the same specific choices: the same need."""
        offered = {content_roots(option) for option in content.options} - {frozenset()}
        shared = offered & {roots for _, roots in need.options}
        return len(shared - _GENERIC_ANSWERS) >= 2

    def _trajectory(self, need: _Need, memory_id: str, content: TrajectoryMemory) -> Verdict:
        asked = content_roots(content.query)
        relation: Relation = (
            "about"  # a past task about the attribute: "Book a venue for Aisha's leaving do"
            if need.name.identity and self._all(need.name.identity, asked, need.name.surface)
            else "subject"  # a task like this one
            if self._any(need.context, asked, need.name.surface)
            else "none"
        )
        if content.insight:
            found = self.read(need, content.insight)
            strength, reason = _strength(need, relation, found)
            if strength:
                return _verdict(
                    memory_id,
                    found,
                    strength,
                    f"the lesson of a past task ({content.query!r}): {reason}",
                    default=content.insight,
                )
        trace = ". ".join(
            part for part in (json_text(content.trace), json_text(content.outcome)) if part
        )
        found = self.read(need, trace)
        value = found.option or (self._chosen(need, trace) if found.attribute else None)
        if value is None:
            return Verdict(memory_id=memory_id, answers=False, reason="no choice of it")
        return Verdict(
            memory_id=memory_id,
            answers=True,
            strength=0.6,
            value=value,
            kind="choice",
            reason=f"chosen in a past task ({content.query!r})",
        )

    def _chosen(self, need: _Need, trace: str) -> str | None:
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

    def _workspace(self, need: _Need, memory_id: str, content: WorkspaceMemory) -> Verdict:
        best = Verdict(memory_id=memory_id, answers=False, reason="not in the workspace")
        for key, value in _pairs({"task": content.task, "state": content.state}):
            topic = phrase(key)
            relation = self.relate(need, topic)
            if relation == "conflict":
                continue
            found = self.read(need, value, frozenset(topic.roots))
            strength, reason = _strength(need, relation, found, specific=topic.specific)
            if relation == "about" and found.kinds - {"name"}:
                strength, reason = max(strength, 0.6), "its subject, with a value of its shape"
            if strength > best.strength:
                best = _verdict(
                    memory_id,
                    found,
                    strength,
                    f"the workspace's {key!r}: {reason}",
                    default=f"{key} = {value}",
                )
        return best

    # -- learned answers ------------------------------------------------------------------

    def _learned_here(
        self,
        request: PersonaRequest,
        needs: Mapping[str, _Need],
        candidates: Mapping[str, Sequence[ScoredMemory]],
        verdicts: dict[str, list[Verdict]],
    ) -> None:
        """Answers learned at this node or for this request answer its need in other words.

        Only where nothing else ties them to a requirement: a learned answer already
        answering one requirement of the request, or fitting several, is left alone,
        and its value must fit (one of the options, the attribute's shape).
        """
        node = request.node
        here = {
            normalise(text)
            for text in (request.query, *((node.id, node.instruction) if node else ()))
            if text
        }
        learned: dict[str, list[tuple[str, int]]] = {}
        claimed: set[str] = set()
        for name, memories in candidates.items():
            for i, memory in enumerate(memories):
                content = memory.record.content
                verdict = verdicts[name][i]
                if verdict.answers and verdict.strength >= 0.6:
                    claimed.add(memory.record.id)
                if isinstance(content, PersonaMemory) and here & {
                    normalise(c) for c in content.contexts
                }:
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
                    value=self.read(needs[name], content.preference).option or content.preference,
                    reason=f"the person answered {content.topic!r} at this step",
                )

    def _fits(self, need: _Need, memory: ScoredMemory) -> bool:
        content = memory.record.content
        assert isinstance(content, PersonaMemory)
        found = self.read(need, content.preference)
        if need.options:
            return found.option is not None  # the answer is one of this requirement's choices
        topic = phrase(content.topic)
        other_attribute = (
            self.relate(need, topic) == "conflict"
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
_GENERIC_ANSWERS = frozenset(
    frozenset({word}) for word in ("yes", "no", "none", "other", "either", "any", "both", "skip")
)


def _strength(
    need: _Need, relation: Relation, found: _Found, *, specific: bool = False
) -> tuple[float, str]:
    """How strongly a memory answers, from its topic's relation and what its value says.

    ``specific``: the topic names some other attribute of some other thing
    ("meeting doorbell"), so its value is about that, unless it names this one.
    """
    if relation == "match":
        return 1.0, "its topic names the requirement"
    if relation == "partial":
        return 0.7, "its topic names the attribute in general"
    from_value = _value_strength(need, relation, found)
    if (
        relation == "none"
        and specific
        and not (found.attribute or found.polarity > 0 or found.said)
    ):
        return 0.0, "its topic is about something else"
    if relation == "conflict":
        # Another attribute's topic answers only if its value says so plainly.
        strength, reason = from_value
        return (strength - 0.1, reason) if strength >= 0.7 else (0.0, "about another attribute")
    return from_value


def _value_strength(need: _Need, relation: Relation, found: _Found) -> tuple[float, str]:
    if found.elsewhere:
        return 0.0, "names the attribute of something else"  # "the grocery budget"
    about = relation == "about"
    tied = about or found.attribute
    scores: list[tuple[float, str]] = [(0.0, "does not say")]
    if found.option is not None:
        if found.polarity > 0:
            scores.append((0.85 if tied else 0.75, f"states {found.option!r}"))
        elif found.distinct:
            scores.append((0.75 if tied else 0.65, f"says {found.option!r}"))
        elif tied:
            scores.append((0.6, f"says {found.option!r}"))
    elif need.options and not found.attribute:
        return scores[0]  # a choice must be stated, or at least its attribute named
    if found.attribute:
        whole = found.modifiers or not need.name.modifiers or about
        scores.append((0.8 if whole else 0.65, "names the attribute"))
    # A name is in almost any text: only with the attribute's subject is it one.
    shaped = found.kinds - {"name"}
    if shaped and (found.modifiers or about):
        scores.append((0.7, "names its subject, with a value of its shape"))
    elif shaped and (found.closest or relation == "subject"):
        scores.append((0.6, "a value of its shape, about the same thing"))
    elif found.kinds and found.said:
        scores.append((0.6, "names its subject, and a name"))
    elif shaped and relation in ("none", "subject") and need.subject_known:
        # "tradespeople: weekday mornings only" for a visit window, when the visit is
        # what the request is about: a value of the shape, under a vague topic.
        scores.append((0.55, "a value of its shape, for what the request is about"))
    return max(scores)


def _verdict(
    memory_id: str, found: _Found, strength: float, reason: str, *, default: str
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
