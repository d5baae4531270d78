"""LLM extraction: a model reads the persona memories out of a completed task.

`OpenAICompatibleExtractor` is an `Extractor` that shows a model what the person
wrote in one task (`person_texts`) and the persona items the task lists, and asks
for the preferences and constraints they stated, each with the words it comes
from and until when it holds. The answer is checked against what the person
wrote: a memory quoting words the person never wrote is invalid output, so the
model cannot invent a preference; it is told what was wrong and asked again.

Talking to the server is `StructuredChat`'s (``autopersona_flows/_chat.py``), as
for the LLM judge: the same retries, ``json_object`` fallback and errors.
"""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from autopersona_flows import _json
from autopersona_flows._chat import (
    ChatAdapter,
    InvalidOutputError,
    validated_json,
)
from autopersona_flows._validation import describe
from autopersona_flows.errors import ExtractionError
from autopersona_flows.memory.extraction import ExtractedMemory, names_secret, person_texts
from autopersona_flows.memory.phrases import content_roots, root, words
from autopersona_flows.memory.records import PersonaMemory, RawTaskRecord
from autopersona_flows.memory.text import normalise
from autopersona_flows.memory.validity import valid_until

__all__ = ["OpenAICompatibleExtractor"]

logger = logging.getLogger(__name__)

_SYSTEM_PROMPT = """\
You read, from what a person wrote during one task, the preferences and constraints \
they state about themselves, so that an assistant can remember them for later tasks.

You are shown when the task happened ("said_at"), the person's messages ("messages") \
and the preferences the task already lists ("listed").

For every preference or constraint the person states that is not listed, give:
- "topic": what it is about, in a few words ("seat", "hotel budget", "diet").
- "preference": the preference or constraint itself, in the person's words where \
possible ("aisle seats", "150 a night", "no longer eats meat").
- "until": when it stops holding, as an ISO 8601 date-time with a UTC offset \
("2027-03-01T00:00:00Z"), if the person says ("until March", "this week"); else null.
- "quote": the person's words it comes from, copied exactly from one message.

Rules:
1. Only what holds beyond this one request: "I prefer aisle seats" is a preference; \
"book a table for two at 8" is not.
2. Never a secret: no PIN, password, card or account number, key, token or login.
3. Never invent: every memory quotes the person's own words.
4. If the person states nothing to remember, give no memories.

Reply with one JSON object and nothing else:
{"memories": [{"topic": "...", "preference": "...", "until": null, "quote": "..."}]}"""

# Quotation marks a model may wrap a quote in; the person's words are inside them.
_QUOTE_MARKS = " \t\n\"'“”‘’«»"  # noqa: RUF001 - the typographic marks are the point


class _ModelMemory(BaseModel):
    """One memory as the model writes it."""

    model_config = ConfigDict(extra="forbid")

    topic: str
    preference: str
    until: str | None = Field(default=None, json_schema_extra={"format": "date-time"})
    quote: str


class _ModelAnswer(BaseModel):
    """The model's whole answer: the memories the task reveals."""

    model_config = ConfigDict(extra="forbid")

    memories: list[_ModelMemory]


_SCHEMA: dict[str, Any] = _ModelAnswer.model_json_schema()


class OpenAICompatibleExtractor(ChatAdapter):
    """Let a language model read the persona memories a task reveals.

    Works with any server speaking ``POST {base_url}/chat/completions`` (OpenAI,
    vLLM, Ollama, llama.cpp's server). One request per task: the model is sent
    the task's time, what the person wrote (the request and their messages in the
    trace) and the listed persona items (topic and preference); never the user id,
    the outcome nor the workspace.

    Returns the listed persona items first, as given (their validity read from
    their text, as `RuleExtractor` does), then the model's memories that are not
    already listed. Each of these must quote words the person wrote (ignoring case
    and spacing); its ``until`` must be an ISO 8601 time after the task's, and
    without one the quote's own words say how long it holds (`valid_until`). A
    memory naming a secret (a PIN, a password, a card number) is dropped, as
    `RuleExtractor` drops it. Any other invalid answer is sent back with what was
    wrong and the model asked again, up to ``max_retries`` times; timeouts,
    refused connections, HTTP 408, 429 and 5xx are retried within the same budget.
    A server that refuses ``response_format: json_schema`` is asked with
    ``json_object`` and the schema, from then on.

    Args:
        base_url: The API root, e.g. ``"http://127.0.0.1:8000/v1"``.
        model: The model name the server knows.
        api_key: Sent as ``Authorization: Bearer ...`` when given; never logged.
        timeout: Seconds to wait for each response (also for an injected client).
        temperature: Sampling temperature; 0 for the most repeatable memories.
        max_retries: How many more requests after a failed one.
        response_format: ``"json_schema"`` (OpenAI's structured outputs, the
            default) or ``"json_object"`` with the schema (llama.cpp, Ollama).
        max_tokens: The most tokens an answer may take; the server's default if
            ``None``. An answer cut off there is invalid output.
        client: An `httpx.Client` to send requests with (pooling, tests); it stays
            open on `close`. One is made, and closed, otherwise.

    Raises:
        ValueError: If ``base_url`` is not an http(s) URL, ``model`` is empty, or
            ``timeout``, ``max_retries``, ``max_tokens`` or ``response_format`` is
            out of range.

    Example::

        with OpenAICompatibleExtractor("http://127.0.0.1:11434/v1", "qwen2.5") as extractor:
            ingest_task_history(store, updater, record, extractor=extractor)
    """

    _error = ExtractionError
    _answers = "memories"
    _logger = logger

    def extract(self, record: RawTaskRecord) -> list[ExtractedMemory]:
        """The listed persona items, then the memories the model read and quoted.

        Raises:
            ExtractionError: If the model's last answer is invalid (the message
                says why), or the server cannot be reached or answers with an
                error (the message gives the HTTP status or the failure).
        """
        at = record.at or datetime.now(UTC)
        listed = [
            ExtractedMemory(content=item, valid_until=valid_until(item.preference, at))
            for item in record.persona
        ]
        texts = person_texts(record)
        task = {
            "said_at": at.isoformat(),
            "messages": texts,
            "listed": [{"topic": i.topic, "preference": i.preference} for i in record.persona],
        }
        messages = [
            {"role": "system", "content": _SYSTEM_PROMPT},
            {"role": "user", "content": _json.dumps(task).decode()},
        ]
        known = {normalise(item.preference) for item in record.persona}
        read = self._chat.ask(
            messages, _SCHEMA, lambda content: _checked(content, texts, at, frozenset(known))
        )
        for memory in read:
            preference = normalise(memory.content.preference)
            if preference not in known:  # a listed item, or the same one read twice
                known.add(preference)
                listed.append(memory)
        return listed


def _checked(
    content: str, texts: list[str], at: datetime, listed: frozenset[str]
) -> list[ExtractedMemory]:
    """Validate the model's answer against the schema and against what the person wrote.

    A memory repeating a listed item (``listed``: their normalised preferences) is
    left out unchecked: the listed one is kept as given.
    """
    answer = validated_json(_ModelAnswer, content, "memories")
    written = [normalise(text) for text in texts]
    found: list[ExtractedMemory] = []
    for i, given in enumerate(answer.memories):
        topic, preference = given.topic.strip(), given.preference.strip()
        if normalise(preference) in listed:
            continue
        if not topic or not preference:
            blank = "topic" if not topic else "preference"
            raise InvalidOutputError(f"memories[{i}].{blank} is blank; give it or leave it out")
        quote = _squashed(given.quote)
        if not quote or not any(_quotes(quote, text) for text in written):
            raise InvalidOutputError(
                f"memories[{i}].quote {given.quote!r} is not in what the person wrote; copy "
                "their words exactly, or leave the memory out"
            )
        if not _terms(given.preference) & _terms(given.quote):
            raise InvalidOutputError(
                f"memories[{i}].preference {given.preference!r} says nothing of its quote "
                f"{given.quote!r}; quote the words the preference comes from"
            )
        if any(names_secret(text) for text in (topic, preference, given.quote)):
            continue  # never remembered, however the model was told
        try:
            memory = PersonaMemory(topic=topic, preference=preference)
        except ValidationError as exc:
            raise InvalidOutputError(f"memories[{i}] cannot be stored ({describe(exc)})") from None
        if given.until is None or not given.until.strip():
            until = valid_until(given.quote, at)
        else:
            until = _until(given.until, i, at)
        found.append(ExtractedMemory(content=memory, valid_until=until))
    return found


def _terms(text: str) -> set[str]:
    return {root(word) for word in words(text) if word.isdigit() or content_roots(word)}


def _quotes(quote: str, text: str) -> bool:
    """Whether ``quote`` is words of ``text``: whole words, at least one that means something."""
    if not content_roots(quote):
        return False
    return re.search(rf"(?<!\w){re.escape(quote)}(?!\w)", text) is not None


def _until(given: str, index: int, at: datetime) -> datetime:
    """The model's ``until``, as a UTC time after the task's (a time without an offset is UTC)."""
    try:
        when = datetime.fromisoformat(given.strip())
    except ValueError:
        raise InvalidOutputError(
            f"memories[{index}].until {given!r} is not an ISO 8601 date-time such as "
            "'2027-03-01T00:00:00Z'; give one, or null"
        ) from None
    when = when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)
    if when <= at:
        raise InvalidOutputError(
            f"memories[{index}].until {given!r} is not after the task's time "
            f"({at.isoformat()}); a preference cannot end before it was said"
        )
    return when


def _squashed(text: str) -> str:
    """``text`` for finding a quote: case- and spacing-insensitive, without quotation marks."""
    return normalise(text).strip(_QUOTE_MARKS)
