"""Adapter for chat logs: timestamped messages in, sessions as tasks out.

A conversation history is a list of messages (``role``, ``text``, ``at``, and
optionally ``session``). `chat_sessions` cuts it into sessions, at a change of
``session`` or at a silence longer than ``gap``, and turns each into a
`RawTaskRecord` stated at its first message, so a whole history is ingested in
one loop over `ingest_task_history` and each preference keeps the time it was
said. The person's messages are the ones `RuleExtractor` reads statements from;
what the assistant said is kept in the trace, never read as the person's.
`read_chat_log` does the same for a JSONL file of messages, as
``autopersona ingest --chat USER FILE`` reads it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError

from autopersona_flows._validation import describe, valid_lines
from autopersona_flows.errors import IngestionError
from autopersona_flows.memory.provenance import Provenance
from autopersona_flows.memory.records import AwareDatetime, RawTaskRecord, Text, non_blank

__all__ = ["DEFAULT_GAP", "ChatMessage", "chat_sessions", "read_chat_log"]

DEFAULT_GAP = timedelta(hours=3)
"""The silence after which a new session starts."""


class ChatMessage(BaseModel):
    """One message of a conversation.

    Attributes:
        role: Who wrote it: ``"user"`` for the person, anything else (``"assistant"``,
            ``"tool"``) for the rest.
        text: What it says.
        at: When it was sent (timezone-aware, or ISO 8601 text with a zone), in the
            person's zone if the log has it: bounds such as "today" are read there.
        session: The conversation it belongs to, if the log says.
    """

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    role: Annotated[Text, AfterValidator(non_blank)]
    text: Text
    at: AwareDatetime
    session: str | None = None


def chat_sessions(
    user_id: str,
    messages: Iterable[ChatMessage | Mapping[str, Any]],
    *,
    gap: timedelta = DEFAULT_GAP,
) -> list[RawTaskRecord]:
    """Cut a conversation history into sessions, one `RawTaskRecord` each.

    Messages of each ``session`` (all of them, if the log names none) are put in
    time order (a stable sort: ties keep their order) and cut at silences. A
    session's ``query`` is its first message from the person, its ``trace`` every
    message as ``{"role", "text", "at"}``, its ``outcome`` the last message from
    anyone else, and its ``at`` the time of its first message. A session in which
    the person said nothing is left out: there is nothing of theirs to learn.

    Args:
        user_id: Whose conversation it is.
        messages: The messages, as `ChatMessage` or dicts of its fields.
        gap: A silence longer than this starts a new session.

    Raises:
        IngestionError: If a message is invalid (naming its index and field), or
            ``gap`` is not a positive timedelta.
    """
    _check_gap(gap)
    parsed = [(index, _message(raw, index)) for index, raw in enumerate(messages)]
    return [_task(user_id, session) for _, session in _sessions(parsed, gap)]


def read_chat_log(
    lines: Iterable[bytes], source: str | Path, user_id: str, *, gap: timedelta = DEFAULT_GAP
) -> list[RawTaskRecord]:
    """A JSONL chat log of one person, one `ChatMessage` a line, as `chat_sessions` cuts it.

    Every line is validated before any session is made. Each task's
    `RawTaskRecord.provenance` is ``source`` and the line of its session's first
    message. A line reads ``{"role": "user", "text": "I prefer aisle seats",
    "at": "2025-01-10T09:00:00+00:00"}``, with an optional ``"session"``.

    Args:
        lines: The file's lines (blank ones are skipped).
        source: The file, as provenance and messages name it.
        user_id: Whose conversation it is.
        gap: A silence longer than this starts a new session.

    Raises:
        IngestionError: If any line is not a valid message (every bad line is
            listed, by line and field; no task is returned), or ``gap`` is not a
            positive timedelta.
    """
    _check_gap(gap)
    numbered = valid_lines(lines, source, ChatMessage, "chat message")
    return [
        _task(user_id, session, Provenance.ingestion(str(source), line))
        for line, session in _sessions(numbered, gap)
    ]


def _check_gap(gap: timedelta) -> None:
    if not isinstance(gap, timedelta) or gap <= timedelta(0):
        raise IngestionError(f"gap must be a positive timedelta, got {gap!r}")


def _sessions(
    messages: list[tuple[int, ChatMessage]], gap: timedelta
) -> list[tuple[int, list[ChatMessage]]]:
    """The sessions the person spoke in, in time order.

    Each message comes with its place (an index, or a line of a file); each session
    with the place of its first message, and its messages.
    """
    by_session: dict[str | None, list[tuple[int, ChatMessage]]] = {}
    for place, message in messages:  # interleaved conversations stay apart
        by_session.setdefault(message.session, []).append((place, message))
    sessions: list[tuple[int, list[ChatMessage]]] = []
    for conversation in by_session.values():
        conversation.sort(key=lambda placed: placed[1].at)
        start = len(sessions)
        for place, message in conversation:
            if len(sessions) > start and message.at - sessions[-1][1][-1].at <= gap:
                sessions[-1][1].append(message)
            else:
                sessions.append((place, [message]))
    sessions.sort(key=lambda session: session[1][0].at)
    return [session for session in sessions if _said(session[1])]


def _message(raw: ChatMessage | Mapping[str, Any], index: int) -> ChatMessage:
    if isinstance(raw, ChatMessage):
        return raw
    if not isinstance(raw, Mapping):
        raise IngestionError(f"message {index}: expected an object, got {type(raw).__name__}")
    try:
        return ChatMessage.model_validate(dict(raw))
    except ValidationError as exc:
        raise IngestionError(f"message {index}: {describe(exc, 'message')}") from None


def _said(session: list[ChatMessage]) -> bool:
    """Whether the person said anything: a session of the assistant alone is no task."""
    return any(message.role == "user" and message.text.strip() for message in session)


def _task(
    user_id: str, session: list[ChatMessage], provenance: Provenance | None = None
) -> RawTaskRecord:
    spoken = [message for message in session if message.text.strip()]
    theirs = [message for message in spoken if message.role == "user"]
    others = [message for message in spoken if message.role != "user"]
    try:
        return RawTaskRecord(
            user_id=user_id,
            query=theirs[0].text,
            trace=[{"role": m.role, "text": m.text, "at": m.at.isoformat()} for m in session],
            outcome=others[-1].text if others else None,
            at=session[0].at,
            provenance=provenance,
        )
    except ValidationError as exc:  # a bad user id: say so once, not per session
        raise IngestionError(f"cannot make a task for user {user_id!r}: {exc}") from None
