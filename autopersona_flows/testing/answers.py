"""`answering`: a person, in a background thread, answering the questions runs ask.

A test runs its flow as it would run in production, and the questions it asks are
answered through the Prefect API, as the UI's resume dialog or the CLI answer them
(`pending_clarifications`, `answer_clarification`)::

    with answering({"citation style": "APA"}) as person:
        result = run_persona_graph(graph, "ada", "Finish my paper", agent=agent)
    assert [question.answer for question in person.asked] == ["APA"]

It needs a Prefect API: a test server (``prefect.testing.utilities.prefect_test_harness``),
the ephemeral one, or a real one.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from types import TracebackType
from typing import TypeAlias
from uuid import UUID

from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import State
from prefect.states import Failed, Running

from autopersona_flows.errors import AnswerRejectedError, AutopersonaError
from autopersona_flows.flows.answers import (
    PendingClarification,
    answer_clarification,
    pending_clarifications,
)

__all__ = ["Answering", "Question", "UnansweredQuestionError", "answering"]


class UnansweredQuestionError(AutopersonaError, AssertionError):
    """A run asked a question `answering` had no answer for (or whose answer it refused).

    An `AssertionError`: the run asked what the test did not expect.
    """


@dataclass(frozen=True)
class Question:
    """One question a run asked, as `answering` saw it.

    Attributes:
        text: The question.
        field: Its field in the run's form: ``answer`` when it is the only one, else
            the requirement's name in snake case (``citation_style``).
        options: The allowed answers, if the answer is a choice.
        flow_run_id: The run that asked.
        flow_run_name: Its name.
        user_id: The run's ``user_id`` parameter, if it has one.
        state: ``"Paused"`` or ``"Suspended"``.
        key: The run's pause key.
        answer: What `answering` answered (``None``: it did not).
    """

    text: str
    field: str
    options: tuple[str, ...]
    flow_run_id: UUID
    flow_run_name: str
    user_id: str | None
    state: str
    key: str
    answer: str | None = None


Answers: TypeAlias = Mapping[str, str | None] | Callable[[Question], str | None]
"""What `answering` answers with: a mapping, or a function of the `Question`."""


class _NoAnswerError(Exception):
    """Why `answering` has no answer to a question (the message says)."""


_SILENT = object()  # deliberately unanswered: the run waits, as if nobody answered in time


class Answering:
    """The person of an `answering` block: answers, and remembers what was asked.

    Made by `answering` (see there for the arguments); use it as a context manager.

    Attributes:
        user_id: Only runs whose ``user_id`` parameter is this are answered.
        flow_run_id: Only this run is answered.
        timeout: Seconds the block's end waits for the thread to stop.
        poll_interval: Seconds between looks for runs waiting for an answer.
    """

    def __init__(
        self,
        answers: Answers,
        *,
        user_id: str | None = None,
        flow_run_id: UUID | str | None = None,
        timeout: float = 30.0,
        poll_interval: float = 0.1,
    ) -> None:
        if not callable(answers) and not isinstance(answers, Mapping):
            raise TypeError(
                f"answers must be a mapping of answers or a function of the question, got "
                f"{type(answers).__name__}"
            )
        if timeout <= 0 or poll_interval <= 0:
            raise ValueError("timeout and poll_interval must be positive")
        self.answers = answers
        self.user_id = user_id
        self.flow_run_id = UUID(str(flow_run_id)) if flow_run_id is not None else None
        self.timeout = timeout
        self.poll_interval = poll_interval
        self._asked: list[Question] = []
        self._problems: list[tuple[Question, _NoAnswerError]] = []
        self._poll_error: Exception | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._seen: set[tuple[UUID, str]] = set()
        self._users: dict[UUID, str | None] = {}
        self._thread: threading.Thread | None = None

    def __repr__(self) -> str:
        return f"Answering({self.answers!r}, asked={len(self.asked)})"

    @property
    def asked(self) -> list[Question]:
        """Every question asked in scope, in order, with the answer given (or ``None``)."""
        with self._lock:
            return list(self._asked)

    @property
    def questions(self) -> list[str]:
        """The text of every question asked in scope, in order."""
        return [question.text for question in self.asked]

    @property
    def unanswered(self) -> list[Question]:
        """The questions asked in scope that were not answered."""
        return [question for question in self.asked if question.answer is None]

    # -- the block -------------------------------------------------------------------------

    def __enter__(self) -> Answering:
        if self._thread is not None:
            raise RuntimeError("this answering block was entered already: make a new one")
        # Started here, on the caller's thread: threads that race into the first client
        # of an ephemeral API can each start a server.
        with get_client(sync_client=True) as client:
            client.hello()
        # Questions waiting before the block began are not its own (a run left paused
        # by an earlier test), unless the block was given that run to answer.
        self._seen = {
            (pending.flow_run_id, pending.key)
            for pending in pending_clarifications()
            if pending.flow_run_id != self.flow_run_id
        }
        context = contextvars.copy_context()  # the caller's Prefect settings, in the thread
        self._thread = threading.Thread(
            target=context.run, args=(self._watch,), name="answering", daemon=True
        )
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(self.timeout)
            if thread.is_alive():
                raise TimeoutError(
                    f"the answering thread did not stop within {self.timeout:g} s (it was "
                    "answering a run); pass a longer timeout= to answering()"
                )
        with self._lock:
            problems, poll_error = list(self._problems), self._poll_error
        if problems:
            failure, cause = UnansweredQuestionError(_report(problems)), _cause(problems)
            if cause is not None:
                raise failure from cause
            raise failure  # in the context of what the block raised, if it did
        if poll_error is not None and error is None:
            raise RuntimeError(
                f"answering could not read the runs waiting for an answer: {poll_error}"
            ) from poll_error

    # -- the thread ------------------------------------------------------------------------

    def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                for pending in pending_clarifications():
                    if self._stop.is_set():
                        return
                    self._consider(pending)
                poll_error = None
            except Exception as exc:  # a server hiccup heals; one that stays is raised at exit
                poll_error = exc
            with self._lock:
                self._poll_error = poll_error
            self._stop.wait(self.poll_interval)

    def _consider(self, pending: PendingClarification) -> None:
        """Answer ``pending`` if it is new and in scope."""
        seen = (pending.flow_run_id, pending.key)
        if seen in self._seen:
            return
        in_scope = self.flow_run_id is None or pending.flow_run_id == self.flow_run_id
        user_id = self._user_of(pending.flow_run_id) if in_scope else None
        if in_scope and (self.user_id is None or user_id == self.user_id):
            self._answer(pending, user_id)  # if it raises, the next look tries again
        self._seen.add(seen)

    def _user_of(self, flow_run_id: UUID) -> str | None:
        if flow_run_id not in self._users:
            with get_client(sync_client=True) as client:
                user_id = client.read_flow_run(flow_run_id).parameters.get("user_id")
            self._users[flow_run_id] = user_id if isinstance(user_id, str) else None
        return self._users[flow_run_id]

    def _answer(self, pending: PendingClarification, user_id: str | None) -> None:
        """Answer every question of ``pending``'s form, or stop its run if one has no answer."""
        questions = [
            Question(
                text=asked.question,
                field=asked.field,
                options=tuple(asked.options),
                flow_run_id=pending.flow_run_id,
                flow_run_name=pending.flow_run_name,
                user_id=user_id,
                state=pending.state,
                key=pending.key,
            )
            for asked in pending.questions
        ]
        given: dict[str, str] = {}
        silent = False
        problems: list[tuple[Question, _NoAnswerError]] = []
        for question in questions:
            try:
                answer = self._lookup(question)
            except _NoAnswerError as missing:
                problems.append((question, missing))
                continue
            if answer is _SILENT:
                silent = True
            else:
                given[question.field] = str(answer)
        if problems or silent:
            given = {}  # a form is answered whole or not at all
        else:
            try:
                answer_clarification(pending.flow_run_id, given)
            except AnswerRejectedError as exc:
                refused = _NoAnswerError(f"the run refused the answers {given}: {exc}")
                problems, given = [(question, refused) for question in questions], {}
        if problems:
            _stop_run(pending, _report(problems))
        with self._lock:
            self._asked += [replace(q, answer=given.get(q.field)) for q in questions]
            self._problems += problems

    def _lookup(self, question: Question) -> object:
        """The answer to ``question`` (a str), or `_SILENT`.

        Raises:
            _NoAnswerError: If there is none, saying why.
        """
        if callable(self.answers):
            try:
                answer = self.answers(question)
            except Exception as exc:  # re-raised, as the cause, when the block ends
                raise _NoAnswerError(f"the answers function raised {exc!r}") from exc
            if answer is None:
                return _SILENT
            if not isinstance(answer, str):
                raise _NoAnswerError(f"the answers function returned a {type(answer).__name__}")
            return answer
        key = _matching_key(self.answers, question)
        if key is None:
            raise _NoAnswerError(
                f"no key of the answers matches it; they are {sorted(self.answers)}"
            )
        answer = self.answers[key]
        return _SILENT if answer is None else answer


def answering(
    answers: Answers,
    *,
    user_id: str | None = None,
    flow_run_id: UUID | str | None = None,
    timeout: float = 30.0,
    poll_interval: float = 0.1,
) -> Answering:
    """Answer the questions runs ask while the block runs, as a person would.

    A background thread looks for runs waiting for an answer (paused or suspended)
    and answers each question through the Prefect API. Questions already waiting
    when the block begins are left alone, unless ``flow_run_id`` names their run.

    With a mapping, a question is answered with the value of the key that is (in
    this order of preference) the question's text, its form field or the
    requirement name the field was made from (``"citation style"`` for
    ``citation_style``), or else the longest key found in the question's text,
    ignoring case (``"citation style"`` in ``"Which citation style would you
    like? APA or MLA?"``). With a function, its return value is the answer.

    An answer of ``None`` leaves the question unanswered on purpose: the run waits
    for its ``pause_timeout``, as when nobody answers (to test ``on_timeout``). A
    question with no answer at all (no key matches, the function raises, or the
    run refuses the answer, e.g. one not among its options) fails its run at once,
    so the test ends in seconds rather than after the run's ``pause_timeout``; the
    block then raises `UnansweredQuestionError` naming it. A paused run is woken
    without an answer and fails as it reads none (Prefect's own validation error
    for the form); a suspended one is marked failed.

    Args:
        answers: A mapping from requirement name, form field or question text to
            the answer, or a function from the `Question` to its answer.
        user_id: Answer only runs whose ``user_id`` parameter is this
            (`run_persona_graph`'s is).
        flow_run_id: Answer only this run.
        timeout: Seconds the end of the block waits for the thread to stop (it may
            be sending an answer); past it, the block raises `TimeoutError`.
        poll_interval: Seconds between looks for runs waiting for an answer.

    Returns:
        The person: a context manager; `Answering.asked`, `Answering.questions` and
        `Answering.unanswered` tell what the runs asked.

    Raises:
        UnansweredQuestionError: When the block ends, if a question had no answer.
    """
    return Answering(
        answers,
        user_id=user_id,
        flow_run_id=flow_run_id,
        timeout=timeout,
        poll_interval=poll_interval,
    )


def _matching_key(answers: Mapping[str, str | None], question: Question) -> str | None:
    """The key of ``answers`` that answers ``question`` (see `answering`), or None."""
    if question.text in answers:
        return question.text
    for key in answers:
        if key == question.field or _field_of(key) == question.field:
            return key
    text = question.text.casefold()
    found = [key for key in answers if key.strip() and key.casefold() in text]
    return max(found, key=len) if found else None


def _field_of(name: str) -> str:
    """The form field a requirement name becomes (``field_names``' rule, without clashes)."""
    return "_".join(
        "".join(c if c.isascii() and c.isalnum() else " " for c in name.lower()).split()
    )


def _report(problems: list[tuple[Question, _NoAnswerError]]) -> str:
    lines = ["answering() had no answer for what the runs asked:"]
    for question, why in problems:
        options = f" (options: {', '.join(question.options)})" if question.options else ""
        lines.append(
            f"- {question.text!r}{options}, field {question.field!r}, of flow run "
            f"{question.flow_run_name!r} for user {question.user_id!r}: {why}"
        )
    lines.append(
        "Add an answer keyed by the requirement name, the field or the question, or use None "
        "to leave a question unanswered on purpose."
    )
    return "\n".join(lines)


def _cause(problems: list[tuple[Question, _NoAnswerError]]) -> BaseException | None:
    """What the answers function raised, if it did: the cause of the block's error."""
    return next((why.__cause__ for _, why in problems if why.__cause__ is not None), None)


def _stop_run(pending: PendingClarification, message: str) -> None:
    """End a run waiting for a question nobody will answer, so the test does not wait it out.

    A paused run's process polls for the Running state: set, it wakes, finds no
    answer and fails. A suspended run has no process left: it is marked failed.
    """
    state: State[None] = (
        Failed(message=message) if pending.state == "Suspended" else Running(message=message)
    )
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(pending.flow_run_id, state, force=True)
