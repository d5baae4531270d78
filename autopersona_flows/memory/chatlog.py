"""Adapter for chat logs: timestamped messages in, sessions as tasks out.

A conversation history is a list of messages (``role``, ``text``, ``at``, and
optionally ``session``). `chat_sessions` cuts it into sessions, at a change of
``session`` or at a silence longer than ``gap``, and turns each into a
`RawTaskRecord` stated at its first message, so a whole history is ingested in
one loop over `ingest_task_history` and each preference keeps the time it was
said. The person's messages are the ones `RuleExtractor` reads statements from;
what the assistant said is kept in the trace, never read as the person's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError

from autopersona_flows._validation import describe
from autopersona_flows.errors import IngestionError
from autopersona_flows.memory.records import AwareDatetime, RawTaskRecord, Text, non_blank

__all__ = ["ChatMessage", "chat_sessions"]


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
    gap: timedelta = timedelta(hours=3),
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
    if not isinstance(gap, timedelta) or gap <= timedelta(0):
        raise IngestionError(f"gap must be a positive timedelta, got {gap!r}")
    parsed = [_message(raw, index) for index, raw in enumerate(messages)]
    by_session: dict[str | None, list[ChatMessage]] = {}
    for message in parsed:  # interleaved conversations stay apart
        by_session.setdefault(message.session, []).append(message)
    sessions: list[list[ChatMessage]] = []
    for conversation in by_session.values():
        conversation.sort(key=lambda message: message.at)
        start = len(sessions)
        for message in conversation:
            last = sessions[-1][-1] if len(sessions) > start else None
            if last is None or message.at - last.at > gap:
                sessions.append([message])
            else:
                sessions[-1].append(message)
    sessions.sort(key=lambda session: session[0].at)
    return [_task(user_id, session) for session in sessions if _said(session)]


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


def _task(user_id: str, session: list[ChatMessage]) -> RawTaskRecord:
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
        )
    except ValidationError as exc:  # a bad user id: say so once, not per session
        raise IngestionError(f"cannot make a task for user {user_id!r}: {exc}") from None
