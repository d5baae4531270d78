"""Situations a preference holds in: "on work trips, the aisle; otherwise the window".

People tie values to circumstances. `situated` reads that structure out of a text:
each part of it, the situation it holds in (``None`` for the general part) and the
words that state its value. Only the structure is read here, by the words that
mark a condition; whether a situation is the one a request is in is a question of
meaning, which the judge answers with the sentence encoder.

What counts as a condition:

- a clause opened by a conditional conjunction (*when*, *whenever*, *if*, *while*,
  *unless*, *during*), before or after the value: "when it's for work, the aisle",
  "decaf if it's after 3";
- a prepositional phrase (*on*, *for*, *with*, *in*, *at*, *before*, *after*)
  set off by a colon or comma before the value ("with the kids: window"), or, when
  the text contrasts situations (two parts, or "otherwise", "in general"), before
  or after it ("aisle for work trips, window otherwise").

Hedges ("if possible", "when I can") are no situations.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

__all__ = ["Part", "situated"]


@dataclass(frozen=True)
class Part:
    """One part of a preference: the situation it holds in, and its value's words.

    Attributes:
        situation: The circumstance, as said ("work trips", "the kids come"), or
            ``None`` for what holds in general.
        text: The words stating the value in it.
    """

    situation: str | None
    text: str


_STRONG = r"when|whenever|if|while|whilst|unless|during"
# Times that open a value without a preposition: "weekdays it's 6am", "summer: a
# convertible", "mornings decaf".
_TIMES = (
    r"week ?days?|week ?ends?|week ?nights?|mornings?|afternoons?|evenings?|nights?|"
    r"summer|winter|spring|autumn|fall|term time|school holidays|holidays|"
    r"mondays?|tuesdays?|wednesdays?|thursdays?|fridays?|saturdays?|sundays?"
)
_WEAK = r"on|for|with|in|at|before|after"
_GENERAL = re.compile(
    r"^(?:otherwise|else|in general|generally|normally|usually|by default|default"
    r"|the rest of the time|any other time|other times|all other times|rest of the time"
    r"|every other time|most of the time)\b[\s,:-]*",
    re.IGNORECASE,
)
_GENERAL_TAIL = re.compile(
    r"[\s,]*\b(?:otherwise|in general|generally|the rest of the time|any other time"
    r"|other times|by default|most of the time)$",
    re.IGNORECASE,
)
_HEDGES = re.compile(
    r"^(?:possible|at all possible|poss|available|they have (?:it|them|one)|i can|you can|we can"
    r"|there'?s (?:one|room|space)|it'?s there|any|needed|necessary|so|ever|that works"
    r"|it works|in doubt|not sure|unsure|unclear|pushed|asked|anything|nothing else)\b",
    re.IGNORECASE,
)
_SENTENCES = re.compile(r"[.;!?\n]+|\s+(?:but|whereas)\s+|,\s*(?:but|whereas)\s+")
# A part starting with a general marker, or a conditional clause, after a comma.
_PARTS = re.compile(
    rf",\s*(?=(?:otherwise|else|in general|generally|normally|usually|{_STRONG}|{_WEAK})\b)",
    re.IGNORECASE,
)
_LEADING_STRONG = re.compile(rf"^\s*(?:{_STRONG})\s+(?P<tail>.+)$", re.IGNORECASE)
_TRAILING_STRONG = re.compile(
    rf"^(?P<rest>.+?)(?<!\beven)\s+(?:{_STRONG})\s+(?P<situation>[^,]{{2,80}})$",
    re.IGNORECASE,
)
_TRAILING_WEAK = re.compile(
    rf"^(?P<rest>.+?)\s+(?:{_WEAK})\s+(?P<situation>[^,]{{2,60}})$", re.IGNORECASE
)
_LEADING_WEAK = re.compile(
    rf"^\s*(?:(?:{_WEAK})\s+(?=.)|(?=(?:{_TIMES})\b))(?P<tail>.+)$", re.IGNORECASE
)
# Where a main clause starts after a leading condition without a comma: "when I fly
# for work I want the aisle", "for work trips the aisle".
_IMPERATIVES = (
    r"give|put|book|get|go|use|make|keep|pick|take|send|order|choose|set|do|grab|bring|stick"
)
_MAIN = re.compile(
    rf"\s(?=(?:i|we|she|he|they|you|i'd|i'll|i'm|it's|it|that's|there's|{_IMPERATIVES}"
    r"|always|never|only|just|prefer|please|pls|not)\b)",
    re.IGNORECASE,
)

# Without a contrast, a fronted phrase is a situation only before a subject or an
# object ("on weekends I sleep till 9", "for work trips the aisle"), not before a cue
# ("with oat milk please").
_SUBJECT = re.compile(
    rf"\s(?=(?:i|we|she|he|they|i'd|i'll|i'm|it's|it|the|a|an|my|no|{_IMPERATIVES})\b)",
    re.IGNORECASE,
)


@lru_cache(maxsize=16384)
def situated(text: str) -> tuple[Part, ...]:
    """The parts of ``text``: each situation it names with its value, and the general rest.

    A text with no condition is one general part, itself. Parts keep their order.

    >>> [(p.situation, p.text) for p in situated("for work trips the aisle, otherwise window")]
    [('work trips', 'the aisle'), (None, 'window')]
    """
    sentences = [sentence for sentence in _SENTENCES.split(text) if sentence.strip()]
    # Weak markers ("on", "with") mark situations only where the text contrasts them:
    # "20 in winter, 18 in summer", "aisle for work, window otherwise".
    pieces = [piece.strip() for sentence in sentences for piece in sentence.split(",")]
    pieces = [piece for piece in pieces if piece]
    contrasted = [_part(piece, contrast=True) for piece in pieces]
    situations = sum(part.situation is not None for part in contrasted)
    marked = any(_GENERAL.match(piece) or _GENERAL_TAIL.search(piece) for piece in pieces)
    # Parallel parts are short: "aisle on work trips, window with the kids".
    short = all(len(piece.split()) <= _PARALLEL_WORDS for piece in pieces)
    if len(pieces) > 1 and ((situations >= 2 and short) or (situations and marked)):
        parts = contrasted
    else:
        pieces = [
            piece.strip()
            for sentence in sentences
            for piece in _PARTS.split(sentence)
            if piece.strip()
        ]
        parts = [_part(piece, contrast=False) for piece in pieces]
    if not any(part.situation for part in parts):
        return (Part(None, text.strip()),)
    merged: list[Part] = []
    for part in parts:
        if part.situation is None and merged and merged[-1].situation is None:
            merged[-1] = Part(None, f"{merged[-1].text}. {part.text}")
        else:
            merged.append(part)
    return tuple(part for part in merged if part.text)


def _part(piece: str, *, contrast: bool) -> Part:
    general = _GENERAL.match(piece)
    if general:
        return Part(None, piece[general.end() :].strip())
    tail = _GENERAL_TAIL.search(piece)
    if tail:
        return Part(None, piece[: tail.start()].strip())
    for leading, main, words in (
        (_LEADING_STRONG, _MAIN, _STRONG_WORDS),
        (_LEADING_WEAK, _MAIN if contrast else _SUBJECT, _WEAK_WORDS),
    ):
        found = leading.match(piece)
        if found is None:
            continue
        rest = found["tail"]
        # The condition ends where the value starts: at a comma, colon or dash, or
        # where a main clause begins ("when I fly for work I want the aisle"),
        # whichever comes first.
        ends = [m.start() for m in (_DELIMITER.search(rest), main.search(rest, 2)) if m]
        if not ends:
            continue
        situation = rest[: min(ends)].strip()
        value = rest[min(ends) :]
        at_start = _DELIMITER.match(value)
        value = value[at_start.end() :].strip() if at_start else value.strip()
        if value and len(situation.split()) <= words and _situation(situation):
            return Part(situation, value)
    for trailing, allowed in ((_TRAILING_STRONG, True), (_TRAILING_WEAK, contrast)):
        found = trailing.match(piece)
        if found and allowed and _situation(found["situation"]):
            return Part(found["situation"].strip(), found["rest"].strip())
    return Part(None, piece)


_DELIMITER = re.compile(r"^\s*[,:]\s*|\s*[,:]\s+|\s[-\u2013\u2014]\s|\bthen\b")
_PARALLEL_WORDS = 8
_STRONG_WORDS = 10  # "when I'm travelling with the kids and it's a long flight"
_WEAK_WORDS = 5  # "on work trips", "with the kids", "for Sam's birthday"


def _situation(text: str) -> bool:
    """Whether ``text`` names a circumstance, not a hedge ("possible") or nothing."""
    text = text.strip()
    return len(text) >= 2 and any(c.isalpha() for c in text) and not _HEDGES.match(text)
