"""Deterministic noise for a benchmark bank: hundreds of memories that share words.

A real bank is full of memories that mention the words of a request in another
sense: "hotel parking", "the budget spreadsheet", a past task about the hotel's
wifi. `noise_memories` makes such a bank from a seed: every memory takes one of
the given words and pairs it with an unrelated attribute, so none answers what
the request needs (words of the requirements are never used as attributes).
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from autopersona_flows.memory.records import (
    LayerContent,
    MemoryRecord,
    PersonaMemory,
    TrajectoryMemory,
    WorkspaceMemory,
)
from autopersona_flows.memory.text import terms

__all__ = ["noise_memories"]

_ATTRIBUTES = (
    "parking newsletter photos receipts login wifi playlist colour-scheme notes-app "
    "umbrella charger spreadsheet folder nickname ringtone wallpaper keyboard bookmark "
    "calendar-colour magnet lanyard loyalty-number locker mug sticker font-size backup "
    "password-hint podcast screenshot voucher tote-bag hashtag emoji-set shortcut printer "
    "signature-image avatar label-maker key-fob postcard whiteboard plant desk-lamp "
    "badge-photo filing-tray mouse-pad coaster phone-case doorbell water-bottle"
).split()

_VALUES = (
    "the blue one, I think",
    "whatever is in the drawer",
    "ask Sam, he set it up",
    "it's in the shared drive somewhere",
    "no idea, never used it",
    "the one from last year still works",
    "keep it as it is",
    "I'll sort it out later",
    "it was fine last time",
    "the default, nothing special",
    "something with a cat on it",
    "the old one broke in March",
)

_TASKS = (
    "Find the {w} {a}",
    "Sort out the {a} for the {w} thing",
    "Look up the {w} {a} again",
    "Tidy the {a} notes about {w}",
    "Send the {w} {a} to the team",
)

_STEPS = ("opened the folder", "searched the inbox", "checked the notes", "asked in chat")


def noise_memories(
    words: Iterable[str], count: int, seed: int, *, avoid: Iterable[str] = ()
) -> list[MemoryRecord]:
    """``count`` memories of all three layers, each sharing one of ``words``, from ``seed``.

    Args:
        words: The words to share with the request (at least one).
        count: How many memories.
        seed: The same seed gives the same memories.
        avoid: Words (of the requirements) no memory may use as its attribute.

    Returns:
        Records with fixed timestamps between 2021 and 2026, oldest first.
    """
    shared = [word for word in words if word.strip()]
    if not shared:
        raise ValueError("noise needs at least one word to share")
    avoided = {term for word in avoid for term in terms(word)}
    attributes = [
        attribute.replace("-", " ")
        for attribute in _ATTRIBUTES
        if not set(terms(attribute.replace("-", " "))) & avoided
    ]
    rng = random.Random(seed)  # noqa: S311 - reproducible test data, not secrets
    start = datetime(2021, 1, 1, tzinfo=UTC)
    records = []
    for _ in range(count):
        word, attribute = rng.choice(shared), rng.choice(attributes)
        when = start + timedelta(minutes=rng.randrange(6 * 365 * 24 * 60))
        records.append(
            MemoryRecord.of(_content(rng, word, attribute), created_at=when, updated_at=when)
        )
    return sorted(records, key=lambda record: record.created_at)


def _content(rng: random.Random, word: str, attribute: str) -> LayerContent:
    kind = rng.random()
    if kind < 0.5:
        return PersonaMemory(topic=f"{word} {attribute}", preference=rng.choice(_VALUES))
    if kind < 0.8:
        return TrajectoryMemory(
            query=rng.choice(_TASKS).format(w=word, a=attribute),
            trace=rng.sample(_STEPS, 2),
            outcome="done",
        )
    return WorkspaceMemory(state={f"{word} {attribute}": rng.choice(_VALUES)})
