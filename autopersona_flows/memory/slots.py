"""Slots: what a persona memory is about, so that a reworded topic updates it.

People name the same attribute in different words from one day to the next
("seat preference", "flight seat"), and different attributes of one thing in
words that overlap ("hotel budget", "hotel location"). Two topics name the same
*slot* when they name the same attribute (the head of the noun phrase, or a weak
head's modifiers, see `Phrase`; kin heads such as "budget" and "price" count as
one) of the same thing: the other modifiers of one are among those of the other,
so "seat" and "flight seat" meet while "hotel budget" and "flight budget" do not.

A slot usually holds one value, the latest; a person who says "also" or "as well"
adds one. A statement that something stopped ("I quit coffee") ends what it names
even when it is filed under another topic.
"""

from __future__ import annotations

import re
from functools import lru_cache

from autopersona_flows.memory.phrases import QUALIFIER_ROOTS, clauses, kin, phrase
from autopersona_flows.memory.text import normalise

__all__ = ["adds_value", "ends", "same_slot"]

_ADDING = re.compile(
    r"\b(?:also|too|as well|another|in addition|additionally|besides|on top of)\b", re.IGNORECASE
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
    rest = first.modifiers - mine - QUALIFIER_ROOTS
    other = second.modifiers - theirs - QUALIFIER_ROOTS
    return rest <= other or other <= rest


def adds_value(preference: str) -> bool:
    """Whether ``preference`` adds to its slot rather than replacing it ("also X")."""
    return bool(_ADDING.search(preference))


def ends(preference: str, topic: str) -> bool:
    """Whether ``preference`` says that what ``topic`` is about stopped ("quit coffee").

    True when a clause announcing an end ("no longer", "stopped", "quit") names
    what the topic is of (its modifiers: "coffee" of "coffee order"), or its head
    if it has none ("smoking").
    """
    read = phrase(topic)
    wanted = read.modifiers - QUALIFIER_ROOTS or ({read.head} if read.head else set())
    return any(clause.ceasing and wanted & set(clause.roots) for clause in clauses(preference))
