"""Turning memories and queries into text and terms.

`memory_text` says what of a record is searchable. `terms` is the analyzer of the
lexical index: Unicode words (split at underscores too), lowercased, English stop
words dropped, and Snowball's English stemmer, so that "prefers", "preferred" and
"preference" meet. Measured on LoCoMo (see ``benchmarks/locomo_retrieval.py``), it
lifts BM25's recall@5 by 21% over plain lowercase words (our own light stemmer
reached 17%).

`hashing_terms` is the analyzer the `HashingEmbedder` was built on, kept exactly as
it was: its vectors are stored with every memory, and a changed analyzer would
silently mix old vectors with new ones. `stem` is its light suffix stripper, also
the base of the judge's word roots (``memory/phrases.py``).
"""

from __future__ import annotations

import re
import threading
from functools import lru_cache
from typing import Any

import snowballstemmer

from autopersona_flows.memory.records import LayerContent, PersonaMemory, TrajectoryMemory

__all__ = [
    "hashing_terms",
    "json_text",
    "memory_text",
    "normalise",
    "stem",
    "terms",
    "trace_text",
]

_WORD = re.compile(r"[^\W_]+")  # underscores split words: "delivery_address"
_WORD_V1 = re.compile(r"\w+")

_STOP_TEXT = """
    a about am an and any are as at be been being both but by can could d did do does doing
    down during each few for from had has have having he her here hers herself him himself his
    how i if in into is it its itself just ll m me might more most must my myself no nor not
    now o of off on once only or other our ours ourselves out over own re s same shall she
    should so some such t than that the their theirs them themselves then there these they this
    those through to too under until up ve very was we were what when where which while who
    whom why will with would y you your yours yourself yourselves
"""
_STOP_WORDS = frozenset(_STOP_TEXT.split())

# Longest first; each is removed only if at least three letters remain.
_SUFFIXES = (
    ("ational", "ate"),
    ("ization", "ize"),
    ("fulness", "ful"),
    ("iveness", "ive"),
    ("ousness", "ous"),
    ("ements", ""),
    ("ement", ""),
    ("ments", ""),
    ("ingly", ""),
    ("ness", ""),
    ("ment", ""),
    ("ings", ""),
    ("edly", ""),
    ("ies", "y"),
    ("ied", "y"),
    ("ing", ""),
    ("ed", ""),
    ("es", ""),
    ("ly", ""),
    ("s", ""),
)


_UNDOUBLE = frozenset({"ed", "ing", "edly", "ingly", "ings"})


@lru_cache(maxsize=65536)
def stem(word: str) -> str:
    """Strip one common English suffix from a lowercase word (digits and short words stay)."""
    if len(word) <= 3 or not word.isalpha() or word.endswith("ss"):
        return word
    for suffix, replacement in _SUFFIXES:
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            word = word[: -len(suffix)] + replacement
            if suffix in _UNDOUBLE and word[-1] == word[-2] and word[-1] not in "lsz":
                word = word[:-1]  # "preferred" -> "prefer", "stopping" -> "stop"
            return word
    return word


def normalise(text: str) -> str:
    """Case- and spacing-insensitive form of a short text such as a topic."""
    return re.sub(r"\s+", " ", text).strip().casefold()


# A stemmer keeps state between calls (PyStemmer says so): one per thread.
_STEMMERS = threading.local()


@lru_cache(maxsize=65536)
def _snowball(word: str) -> str:
    stemmer = getattr(_STEMMERS, "english", None)
    if stemmer is None:
        stemmer = _STEMMERS.english = snowballstemmer.stemmer("english")
    return stemmer.stemWord(word)


def terms(text: str) -> list[str]:
    """Return the index terms of ``text``, in order, repeats kept."""
    return [_snowball(word) for word in _WORD.findall(text.lower()) if word not in _STOP_WORDS]


def hashing_terms(text: str) -> list[str]:
    """The terms `HashingEmbedder` hashes: `stem` over whole words (frozen: see above)."""
    return [stem(word) for word in _WORD_V1.findall(text.lower()) if word not in _STOP_WORDS]


def json_text(value: Any) -> str:
    """Flatten a JSON value into searchable text: object keys and scalar values, in order."""
    parts: list[str] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, child in reversed(item.items()):
                stack.append(child)
                stack.append(key)
        elif isinstance(item, list):
            stack.extend(reversed(item))
        elif item is not None:
            parts.append(str(item))
    return " ".join(parts)


def trace_text(trace: list[Any]) -> str:
    """A task's trace as text.

    A chat message reads as ``role: text`` (its time and keys left out, see
    `chat_sessions`), any other step as `json_text` reads it.
    """
    lines = []
    for step in trace:
        said = _said(step)
        lines.append(said if said is not None else json_text(step))
    return " ".join(line for line in lines if line)


def _said(step: Any) -> str | None:
    if isinstance(step, dict) and isinstance(step.get("role"), str):
        text = step.get("text", step.get("content"))
        if isinstance(text, str):
            return f"{step['role']}: {text}"
    return None


def memory_text(content: LayerContent) -> str:
    """Return the searchable text of a memory's content: what gets embedded and indexed."""
    if isinstance(content, PersonaMemory):
        return " ".join(
            part
            for part in (content.topic, *content.aliases, content.preference, content.strategy)
            if part
        )
    parts: tuple[str, ...]
    if isinstance(content, TrajectoryMemory):
        parts = (
            content.query,
            trace_text(content.trace),
            json_text(content.outcome),
            content.insight,
        )
    else:
        parts = (json_text(content.task), json_text(content.interaction), json_text(content.state))
    return " ".join(part for part in parts if part)
