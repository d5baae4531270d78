"""Long-term memory of chats: what a person said weeks ago, applied or asked for.

A `ChatCase` is a person's chat history (sessions of messages, weeks or months
apart) and probes: requests whose requirements the history answers (the newest
value, if it changed) or does not answer although related words appear (another
person's value, a neighbouring attribute, a question the person asked).
`evaluate_chats` ingests each history the way `MemoryBank.ingest` does
(`chat_sessions`, then the bank's extractor and resolver) and runs the agent on
every probe: an answered requirement must carry the value, an unanswered one
must be asked.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterable
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from autopersona_flows.agent.agent import PersonaAgent
from autopersona_flows.agent.decisions import (
    ClarifyDecision,
    FinalDecision,
    NonBlank,
    PersonaRequest,
)
from autopersona_flows.agent.evaluation._common import ratio, read_cases
from autopersona_flows.errors import EvaluationError
from autopersona_flows.memory.bank import MemoryBank
from autopersona_flows.memory.chatlog import chat_sessions
from autopersona_flows.memory.jsonl import JsonlMemoryStore
from autopersona_flows.memory.protocol import MemoryStore
from autopersona_flows.memory.records import AwareDatetime

__all__ = ["ChatCase", "ChatReport", "evaluate_chats", "read_chat_cases"]


class _Model(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class Message(_Model):
    """One message of a session."""

    role: NonBlank
    text: str


class Session(_Model):
    """One conversation, and when it started."""

    at: AwareDatetime
    messages: Annotated[list[Message], Field(min_length=1)]


class Expect(_Model):
    """A probe's expected decision: the values a final must carry, or what to ask."""

    action: Literal["final", "clarify"]
    values: dict[str, NonBlank] = Field(default_factory=dict)
    requirement: NonBlank | None = None


class Probe(_Model):
    """A request after the history, and what a careful assistant does with it."""

    request: PersonaRequest
    expect: Expect


class ChatCase(_Model):
    """A person's chat history and the probes run after it."""

    name: NonBlank
    user_id: NonBlank
    sessions: Annotated[list[Session], Field(min_length=1)]
    probes: Annotated[list[Probe], Field(min_length=1)]


class ChatReport(_Model):
    """How the agent did on the probes (a vacuous ratio is 1.0).

    Attributes:
        probes: How many probes ran.
        answered: Of the probes the history answers, those decided final with the value.
        asked: Of the probes it does not answer, those asked about the requirement.
        failures: The names of the probes not right (``case#index``).
    """

    probes: int
    answered: float
    asked: float
    failures: list[str]


def read_chat_cases(path: str | Path) -> list[ChatCase]:
    """Read one `ChatCase` as JSON a line.

    Raises:
        EvaluationError: If the file cannot be read or a line is invalid (named).
    """
    return read_cases(path, ChatCase, "the chat cases file")


def evaluate_chats(
    cases: Iterable[ChatCase], agent: Callable[[MemoryStore], PersonaAgent] | None = None
) -> ChatReport:
    """Ingest each case's history into a fresh bank and run the agent on its probes.

    Args:
        cases: The cases; each person is kept apart from every other case's.
        agent: Builds the agent over the store; the default agent by default.

    Raises:
        EvaluationError: If there are no cases.
    """
    cases = list(cases)
    if not cases:
        raise EvaluationError("no chat cases to run")
    build = agent or (lambda store: PersonaAgent(MemoryBank(store)))
    finals = [0, 0]
    clarifies = [0, 0]
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="autopersona-chats-") as folder:
        runner = build(JsonlMemoryStore(folder))
        for case in cases:
            user = f"{case.name}/{case.user_id}"
            messages = [
                {"role": m.role, "text": m.text, "at": s.at + timedelta(seconds=30 * i)}
                for s in case.sessions
                for i, m in enumerate(s.messages)
            ]
            runner.bank.ingest(chat_sessions(user, messages))
            for index, probe in enumerate(case.probes):
                request = probe.request.model_copy(update={"user_id": user})
                right = _right(runner.decide(request), probe.expect)
                tally = finals if probe.expect.action == "final" else clarifies
                tally[0] += right
                tally[1] += 1
                if not right:
                    failures.append(f"{case.name}#{index}")
    return ChatReport(
        probes=finals[1] + clarifies[1],
        answered=ratio(*finals),
        asked=ratio(*clarifies),
        failures=failures,
    )


def _right(decision: FinalDecision | ClarifyDecision, expect: Expect) -> bool:
    if expect.action == "clarify":
        return isinstance(decision, ClarifyDecision) and (
            expect.requirement is None or decision.requirement == expect.requirement
        )
    if not isinstance(decision, FinalDecision):
        return False
    for name, value in expect.values.items():
        wanted = value.casefold()
        if not any(
            wanted in (c.value or "").casefold() or wanted in c.text.casefold()
            for c in decision.constraints
            if c.requirement == name
        ):
            return False
    return True
