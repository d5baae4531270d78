"""Reading a memory's text against a requirement: which attribute, which subject, which value.

`Reader` is the part of `LexicalJudge` that reads words: how a topic relates to a
requirement's name (`Relation`), what a value text says about it (options stated,
the attribute named, a value of its shape, change), and how strongly that answers
(`strength`). A `WordMatcher` widens what counts as the same word.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal, Protocol

from autopersona_flows.agent.decisions import PersonaRequest, Requirement
from autopersona_flows.memory.phrases import (
    KIN_WORDS,
    Clause,
    Phrase,
    attribute_kinds,
    clauses,
    content_roots,
    kin,
    phrase,
    root,
    value_kinds,
    words,
)

__all__ = ["Found", "Need", "Reader", "Relation", "WordMatcher", "strength"]


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


_QUESTION_WORDS = frozenset({"what", "where", "which", "who", "whom", "whose", "how"})


@dataclass(frozen=True)
class Need:
    """A requirement read once per decision: its phrase, options, context and shapes."""

    name: Phrase
    described: frozenset[str]  # roots of the description and the declared question
    options: tuple[tuple[str, frozenset[str]], ...]  # option text, its roots
    context: frozenset[str]  # roots of the query, node id and instruction
    kinds: frozenset[str]  # value shapes the attribute takes
    open: bool = False  # named or described as a question ("where to collect from")

    @classmethod
    def of(cls, requirement: Requirement, request: PersonaRequest) -> Need:
        """Read ``requirement`` in the context of ``request``."""
        node = request.node
        where = [request.query, *((node.id, node.instruction) if node else ())]
        name = phrase(requirement.name)
        # A weak head ("number", "format") says nothing of the value's shape; its
        # modifiers may ("date format" takes a date).
        head = frozenset({name.head}) if name.head else frozenset()
        named = name.modifiers if name.weak else head
        return cls(
            name=name,
            described=content_roots(f"{requirement.description} {requirement.question or ''}"),
            options=tuple(
                (option, roots)
                for option in requirement.options
                if (roots := _option_roots(option))
            ),
            context=content_roots(" ".join(where).replace("-", " ").replace("_", " ")),
            kinds=attribute_kinds(named) | name.asks,
            open=any(
                text.split(maxsplit=1)[0].casefold() in _QUESTION_WORDS
                for text in (requirement.name, requirement.description)
                if text.strip()
            ),
        )

    @property
    def option_roots(self) -> frozenset[str]:
        """Every root of the declared options."""
        return frozenset(word for _, roots in self.options for word in roots)


def _option_roots(option: str) -> frozenset[str]:
    """The roots an option is stated by.

    Its content words and its numbers ("4 spaces"), or, for an option of function words
    only ("own", "other"), its words.
    """
    found = content_roots(option) | frozenset(re.findall(r"\d+", option))
    return found or frozenset(root(word) for word in words(option))


@dataclass(frozen=True)
class Found:
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


class Reader:
    """Reads topics and value texts against a requirement, through a word matcher.

    Args:
        matcher: Tells which words mean the same beyond equal roots; roots only if ``None``.
    """

    def __init__(self, matcher: WordMatcher | None = None) -> None:
        self.matcher = matcher

    # -- words, through the matcher -------------------------------------------------------

    def has(self, word: str | None, roots: frozenset[str], surface: Mapping[str, str]) -> bool:
        """Whether ``roots`` hold ``word``: equal roots, kin attributes, or the matcher's say."""
        if word is None:
            return False
        if word in roots or (word in KIN_WORDS and any(kin(word, other) for other in roots)):
            return True
        if self.matcher is None:
            return False
        mine = surface.get(word, word)
        return any(self.matcher.same(mine, surface.get(other, other)) for other in roots)

    def has_all(
        self, wanted: frozenset[str], roots: frozenset[str], surface: Mapping[str, str]
    ) -> bool:
        """Whether ``roots`` hold every word of ``wanted``."""
        return all(self.has(word, roots, surface) for word in wanted)

    def has_any(
        self, wanted: frozenset[str], roots: frozenset[str], surface: Mapping[str, str]
    ) -> bool:
        """Whether ``roots`` hold some word of ``wanted``."""
        return any(self.has(word, roots, surface) for word in wanted)

    # -- topics ---------------------------------------------------------------------------

    def relate(self, need: Need, topic: Phrase) -> Relation:  # noqa: PLR0911 - a return a case
        """How a topic relates to the requirement's name; see `Relation`."""
        name = need.name
        if name.head is None or topic.head is None:
            return "none"
        surface = {**topic.surface, **name.surface}
        known = name.modifiers | need.described | need.context | need.option_roots
        same_head = (
            kin(topic.head, name.head)
            or self.has(topic.head, frozenset({name.head}), surface)
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
            if self.has_any(mine, theirs, surface):
                return self._subjects(mine, mine, theirs, known | mine, surface)
        elif self.has(topic.head, name.modifiers | need.described, surface):
            return "about"  # "Biscuit's food" for "dog food brand": the value says the rest
        if self.has_any(frozenset(name.roots), frozenset(topic.roots), surface):
            return "conflict"  # a shared word, another attribute: "budget spreadsheet"
        if self.has(topic.head, need.context, surface):
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
        if any(not self.has(word, known, surface) for word in theirs):
            return "conflict"  # "dog training class" for a train's "travel class"
        if subject and theirs and not self.has_any(subject | mine, theirs, surface):
            return "conflict"  # "lesson length" for "quiz length"
        return "partial" if mine and not theirs else "match"

    # -- values ---------------------------------------------------------------------------

    def read(self, need: Need, text: str, topic: frozenset[str] = frozenset()) -> Found:
        """What ``text`` says about the need: options, the attribute, its shape, change.

        ``topic`` are the roots of the memory's topic: it may name the attribute's
        subject ("Mia school run") while the text gives the value ("3:15").
        """
        parts = clauses(text)
        if not parts:
            return Found()
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
            attribute = bool(name.identity) and self.has_all(name.identity, everything, surface)
            elsewhere = attribute and self._elsewhere(need, parts, everything, surface)
            attribute = attribute and not elsewhere
        mentioned = [
            part
            for part in parts
            if (option is not None and self.has_any(need.option_roots, part.joined, surface))
            or self.has_any(name.identity | name.modifiers, part.joined, surface)
        ] or list(parts)
        return Found(
            option=option,
            polarity=polarity,
            distinct=distinct,
            attribute=attribute,
            elsewhere=elsewhere,
            modifiers=bool(name.modifiers) and self.has_all(name.modifiers, around, surface),
            said=bool(name.modifiers) and self.has_all(name.modifiers, everything, surface),
            closest=name.closest is not None and self.has(name.closest, around, surface),
            kinds=need.kinds & shapes,
            ceases=any(part.ceasing for part in mentioned)
            and not any(part.changing and not part.ceasing for part in parts),
            changes=any(part.changing and not part.ceasing for part in parts),
        )

    def _option(self, need: Need, parts: Sequence[Clause]) -> tuple[str | None, int, bool]:
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

    def rejected(self, need: Need, text: str) -> frozenset[str]:
        """The declared options ``text`` rules out: "anything but the window", "X over Y"."""
        out: set[str] = set()
        for part in clauses(text):
            for option, roots in need.options:
                positions = part.positions(roots)
                if positions and part.polarity(positions[0]) < 0:
                    out.add(option)
        return frozenset(out)

    def _elsewhere(
        self,
        need: Need,
        parts: Sequence[Clause],
        everything: frozenset[str],
        surface: Mapping[str, str],
    ) -> bool:
        """Whether every mention of the attribute is another subject's ("the grocery budget")."""
        name = need.name
        if (
            name.head is None
            or not name.modifiers
            or name.weak
            or self.has_all(name.modifiers, everything, surface)
        ):
            return False
        known = name.modifiers | need.context | need.described
        mentions = 0
        for part in parts:
            for i in part.positions(frozenset({name.head})):
                mentions += 1
                before = i - 1 if i > 0 and part.content[i - 1] else None
                if before is None or self.has(part.roots[before], known, surface):
                    return False
        return mentions > 0


# -- strength ------------------------------------------------------------------------------


def strength(
    need: Need, relation: Relation, found: Found, *, specific: bool = False
) -> tuple[float, str]:
    """How strongly a memory answers, from its topic's relation and what its value says.

    ``specific``: the topic names one attribute of something ("writing tone"): a
    declared option merely said in its value ("plain") is about that attribute.
    """
    if relation in ("match", "partial") and need.options and found.option is None:
        if found.ceases:  # "deleted Todoist, not using any to-do app now": ask again
            return (1.0 if relation == "match" else 0.7), "it says the preference no longer holds"
        # "citation style: Chicago" where APA or MLA must be chosen: ask, with the options.
        return 0.0, "its value is none of the options"
    if relation == "match":
        return 1.0, "its topic names the requirement"
    if relation == "partial":
        return 0.7, "its topic names the attribute in general"
    if relation == "none" and specific and found.option is not None and found.polarity <= 0:
        found = replace(found, option=None)
    from_value = _value_strength(need, relation, found)
    if relation == "conflict":
        # Another attribute's topic answers only if its value says so plainly.
        strength, reason = from_value
        return (strength - 0.1, reason) if strength >= 0.7 else (0.0, "about another attribute")
    return from_value


def _value_strength(need: Need, relation: Relation, found: Found) -> tuple[float, str]:
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
    return max(scores)
