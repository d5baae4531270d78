"""Slots: what a persona memory is about, so that a reworded topic updates it.

People name the same attribute in different words from one day to the next
("hotel budget", "budget for hotels", "hotel price"), and different attributes of
one thing in words that overlap ("hotel budget", "hotel location"). Two topics
name the same *slot* when they name the same attribute (the head of the noun
phrase, or a weak head's modifiers, see `Phrase`; kin heads such as "budget" and
"price" count as one) of the same thing: the same other words, whatever their
order, words that only say "a preference" ("seat preference") left out. Any other
word tells two slots apart: "budget" and "daily budget", "email" and "work
email", "name" and "dog's name" are different slots, for a missed merge leaves an
old value to the judge's "newest wins", while a false one loses a current one.

A slot usually holds one value, the latest; a person who says "also" or "as well"
adds one. A statement that something stopped ("I quit coffee") ends what it names
even when it is filed under another topic.
"""

from __future__ import annotations

import re
from functools import lru_cache

from autopersona_flows.memory.phrases import (
    CESSATION,
    QUALIFIER_ROOTS,
    clauses,
    content_roots,
    kin,
    phrase,
    root,
    value_kinds,
    words,
)
from autopersona_flows.memory.text import normalise

__all__ = ["adds_value", "announces_change", "ended_things", "ends", "replaces", "same_slot"]

# "Also", "as well", "too" at a clause's end ("shellfish too"), not "too noisy".
_ADDING = re.compile(
    r"\b(?:also|as well|in addition|additionally|besides|on top of)\b|\btoo\s*(?:[,.;!?]|$)",
    re.IGNORECASE,
)


# Words that say "a preference" without saying of what.
_MARKERS = frozenset(
    "preference preferences prefer preferred favourite favorite favourites favorites choice "
    "choices option options setting settings info information detail details need needs "
    "want wants like likes usual typical ideal".split()
)


def _others(topic: str, identity: frozenset[str]) -> frozenset[str]:
    """The roots of a topic beyond its attribute and the words that mark a preference."""
    return (
        frozenset(
            root(word)
            for word in words(topic.replace("-", " ").replace("_", " "))
            if word not in _MARKERS and content_roots(word) | QUALIFIER_ROOTS & {root(word)}
        )
        - identity
        - {phrase(topic).head}
    )


@lru_cache(maxsize=16384)
def same_slot(a: str, b: str) -> bool:
    """Whether topics ``a`` and ``b`` name the same attribute of the same thing."""
    if normalise(a) == normalise(b):
        return True
    first, second = phrase(a), phrase(b)
    mine, theirs = first.identity, second.identity
    if not mine or not theirs:
        return False  # generic words only, or a question: only the same words meet
    if not all(any(kin(x, y) for y in theirs) for x in mine) or not all(
        any(kin(y, x) for x in mine) for y in theirs
    ):
        return False
    return _others(a, mine) == _others(b, theirs)


def adds_value(preference: str) -> bool:
    """Whether ``preference`` adds to its slot rather than replacing it ("also X")."""
    return bool(_ADDING.search(preference))


def ends(preference: str, topic: str) -> bool:
    """Whether ``preference`` says that what ``topic`` is about stopped ("quit coffee").

    True when what follows an announced end ("no longer", "stopped", "quit") is,
    by its head, what the topic is of or about: "I quit coffee" ends a "coffee
    order" and "I stopped smoking" ends "smoking", while "I cancelled the dentist
    appointment" ends no "dentist" (it ended an appointment).
    """
    read = phrase(topic)
    wanted = (read.modifiers - QUALIFIER_ROOTS) | ({read.head} if read.head else set())
    for match in CESSATION.finditer(preference.casefold()):
        ended = phrase(_AFTER_END.sub("", preference[match.end() :])).head
        if ended is not None and ended in wanted:
            return True
    return False


def ended_things(preference: str) -> list[str]:
    """What ``preference`` says stopped, as said: "eating meat" of "I stopped eating meat"."""
    found = []
    for match in CESSATION.finditer(preference.casefold()):
        thing = _AFTER_END.sub("", preference[match.end() :]).strip(" :-")
        if content_roots(thing):
            found.append(thing)
    return found


# Where what an end is announced of stops: the clause, a time, a reason.
_AFTER_END = re.compile(
    r"[,.;!?(].*|\b(?:because|since|but|so|and|when|after|before|last|this|in|on|at|for)\b.*",
    re.IGNORECASE | re.DOTALL,
)


def announces_change(preference: str) -> bool:
    """Whether ``preference`` says something changed ("now", "these days", "switched")."""
    return any(clause.changing or clause.ceasing for clause in clauses(preference))


def replaces(new_topic: str, new_value: str, old_topic: str, old_value: str) -> bool:
    """Whether a value announced as a change replaces an older memory in other words.

    A person saying "43 these days" of "trainers for running" speaks of the
    "running shoes" stored before, though the topics name no common attribute.
    The announcement is the evidence that an older value exists; it replaces one
    that names the same person or place in its value, or one related to it (the
    topics share a word, or one topic is named in the other's value) whose value
    has the same shape: both amounts, both days, both with a
    number, or both without any shape ("whatsapp lately" for "email is best"), so
    that "near the beach now" of a hotel never replaces its budget.
    """
    if not announces_change(new_value) or _other_subjects(new_topic, old_topic):
        return False
    if _same_names(new_value, old_value):  # "Marta's moved" of "Marta comes in"
        return True
    mine, theirs = content_roots(new_topic), content_roots(old_topic)
    related = (
        mine & theirs
        or _compounds(mine, theirs)  # "haircuts" of "hair appointment"
        or theirs & content_roots(new_value)
        or mine & content_roots(old_value)  # "sugar: cut it out" of "tea: two sugars"
    )
    if not related:
        return False
    shapes, old_shapes = value_kinds(new_value), value_kinds(old_value)
    if shapes & old_shapes or not (shapes or old_shapes):
        return True
    return _has_number(new_value) and _has_number(old_value)


# A capitalised word past the start of a clause, or before a possessive: a name.
_NAMED = re.compile(r"(?<![.!?,;:\-(])(?<!^)\s+([A-Z][a-z]{2,})\b|\b([A-Z][a-z]{2,})['\u2019]s\b")
_CAPITALISED = re.compile(r"\b[A-Z][a-z]{2,}\b")


def _same_names(a: str, b: str) -> bool:
    """Whether both texts name one person or place.

    A capitalised word counts where it must be a name in one of them (past a
    clause's start, or "Marta's"): "Switched" and "Actually" opening two
    sentences name nobody.
    """

    def named(text: str) -> set[str]:
        found = {x or y for x, y in _NAMED.findall(text.strip())}
        return {word for word in found if content_roots(word)}

    def capitalised(text: str) -> set[str]:
        return set(_CAPITALISED.findall(text))

    return bool(named(a) & capitalised(b) or named(b) & capitalised(a))


def _other_subjects(a: str, b: str) -> bool:
    """Whether two topics name one attribute of different things ("hotel"/"flight budget")."""
    first, second = phrase(a), phrase(b)
    if first.head is None or second.head is None or not kin(first.head, second.head):
        return False
    rest = first.modifiers - QUALIFIER_ROOTS
    other = second.modifiers - QUALIFIER_ROOTS
    return bool(rest) and bool(other) and not rest & other


def _compounds(a: frozenset[str], b: frozenset[str]) -> bool:
    """Whether a word of one is a compound of a word of the other ("haircut", "hair")."""
    return any(
        len(x) >= 4 and len(y) > len(x) and (y.startswith(x) or y.endswith(x))
        for first, second in ((a, b), (b, a))
        for x in first
        for y in second
    )


def _has_number(text: str) -> bool:
    return any(character.isdigit() for character in text)
