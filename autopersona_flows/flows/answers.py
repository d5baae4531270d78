"""For the person who answers: which runs are waiting for a clarification, and answering one.

The Prefect UI's resume dialog does the same; this is for scripts, notebooks, tests
and CLIs. A run paused in a process that is gone is listed as such (see
``waiting.py``) and refused an answer, which would resume it into a run that nobody
runs: `cancel_clarification` ends it instead.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import UTC, datetime
from uuid import UUID

import httpx
import orjson
from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterState,
    FlowRunFilterStateType,
)
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.exceptions import FlowPauseTimeout, NotPausedError, ObjectNotFound
from prefect.flow_runs import resume_flow_run
from prefect.states import Cancelled
from pydantic import BaseModel, ConfigDict

from autopersona_flows.errors import AnswerRejectedError, BlankAnswerError, RunGoneError
from autopersona_flows.flows.clarification import question_of
from autopersona_flows.flows.waiting import Liveness, last_seen, liveness, span_words

__all__ = [
    "FORM_WAIT_SECONDS",
    "PendingClarification",
    "PendingQuestion",
    "answer",
    "answer_clarification",
    "cancel_clarification",
    "pending_clarifications",
]


class PendingQuestion(BaseModel):
    """One question of a waiting run's form.

    Attributes:
        field: Its field in the form (``answer`` when it is the only one).
        question: The question.
        options: The allowed answers, if the answer is a choice.
        node: The node that asks it, if the run noted it.
        step: That node in plain words (what it is asked before), if noted.
    """

    model_config = ConfigDict(frozen=True)

    field: str
    question: str
    options: list[str]
    node: str | None = None
    step: str | None = None


class PendingClarification(BaseModel):
    """A run waiting for a person's answer (or answers: one form may ask several questions).

    Attributes:
        flow_run_id: The paused or suspended run.
        flow_run_name: Its name, as the UI shows it.
        flow_name: Its flow's name.
        user_id: The person asked (the run's note, else its ``user_id`` parameter).
        state: ``"Paused"`` or ``"Suspended"``.
        key: The clarification's pause key (``clarify-<node>-<digest>``).
        question: The question asked (several joined by `` / ``).
        options: The allowed answers, if the one question's answer is a choice.
        questions: Each question of the form.
        waiting_since: When the run started waiting.
        process: Whether anything runs it once answered (see `Liveness`).
        last_seen: The latest heartbeat of the process waiting, if it keeps one.
        pid: That process's id, if known.
        host: That process's host, if known.
    """

    model_config = ConfigDict(frozen=True)

    flow_run_id: UUID
    flow_run_name: str
    flow_name: str
    user_id: str | None
    state: str
    key: str
    question: str
    options: list[str]
    questions: list[PendingQuestion]
    waiting_since: datetime | None
    process: Liveness
    last_seen: datetime | None = None
    pid: int | None = None
    host: str | None = None


def _ours(flow_run: FlowRun) -> bool:
    """Whether ``flow_run`` waits on the form of one of our questions."""
    state = flow_run.state
    if state is None or not state.is_paused():
        return False
    details = state.state_details
    return bool(details.run_input_keyset) and str(details.pause_key or "").startswith("clarify-")


def _pending(
    client: SyncPrefectClient, flow_run: FlowRun, flows: dict[UUID, str] | None = None
) -> PendingClarification | None:
    """``flow_run`` as a pending clarification; ``None`` if it asks none (yet).

    Args:
        client: The client to read with.
        flow_run: The run.
        flows: Flow names read already, by id (filled in).
    """
    if not _ours(flow_run):
        return None  # not waiting, or paused for something else than one of our questions
    state = flow_run.state
    assert state is not None  # _ours checked it
    details = state.state_details
    keyset = details.run_input_keyset or {}
    try:
        description = _text(client.read_flow_run_input(flow_run.id, keyset["description"]))
        schema = orjson.loads(client.read_flow_run_input(flow_run.id, keyset["schema"]))
    except httpx.HTTPStatusError as exc:
        if exc.response.status_code == 404:
            # Prefect sets Paused first and saves the form just after: not askable yet.
            return None
        raise
    key = str(details.pause_key)
    seen = last_seen(client, flow_run.id, key)
    note = seen.note if seen is not None else None
    fields = schema.get("properties", {})
    if set(fields) == {"answer"}:
        answer_field = fields["answer"]
        # The form's field has no description (the dialog would repeat the question);
        # forms saved by earlier versions put the question there.
        question = question_of(description) or answer_field.get("description") or ""
        questions = [(("answer", question, answer_field.get("enum", [])))]
    else:  # a form of several questions: each field is titled by its question
        questions = [
            (name, field.get("title", name), field.get("enum", []))
            for name, field in fields.items()
        ]
    noted = note is not None and len(note.nodes) == len(note.steps) == len(questions)
    pending_questions = [
        PendingQuestion(
            field=name,
            question=question,
            options=options,
            node=note.nodes[n] if noted and note else None,
            step=note.steps[n] if noted and note else None,
        )
        for n, (name, question, options) in enumerate(questions)
    ]
    user_id = note.user_id if note is not None else None
    if user_id is None and isinstance(flow_run.parameters.get("user_id"), str):
        user_id = flow_run.parameters["user_id"]
    flows = {} if flows is None else flows
    if flow_run.flow_id not in flows:
        flows[flow_run.flow_id] = client.read_flow(flow_run.flow_id).name
    return PendingClarification(
        flow_run_id=flow_run.id,
        flow_run_name=flow_run.name,
        flow_name=flows[flow_run.flow_id],
        user_id=user_id,
        # Prefect's validator names an unnamed state after its type; the field is only
        # optional on input.
        state=state.name or state.type.value.capitalize(),
        key=key,
        question=" / ".join(q.question for q in pending_questions),
        options=pending_questions[0].options if len(pending_questions) == 1 else [],
        questions=pending_questions,
        waiting_since=state.timestamp,
        process=liveness(state, seen),
        last_seen=seen.at if seen is not None and note and note.pid is not None else None,
        pid=note.pid if note is not None else None,
        host=note.host if note is not None else None,
    )


def _text(stored: str) -> str:
    """A description as stored: JSON text (as Prefect saves it), or plain text."""
    try:
        text = orjson.loads(stored)
    except orjson.JSONDecodeError:
        return stored
    return text if isinstance(text, str) else stored


def pending_clarifications(user_id: str | None = None) -> list[PendingClarification]:
    """Every run of the current Prefect API waiting for an answer to a clarification.

    Args:
        user_id: Only the runs asking this person.

    Returns:
        The runs, oldest wait first; a run paused in a process that is gone too
        (``process == "gone"``: answering it would resume nothing, see
        `cancel_clarification`).
    """
    paused = FlowRunFilter(
        state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.PAUSED]))
    )
    flows: dict[UUID, str] = {}
    found: list[PendingClarification | None] = []
    with get_client(sync_client=True) as client:
        # Page by page: the server returns at most its default limit (200) at once.
        while runs := client.read_flow_runs(flow_run_filter=paused, offset=len(found), limit=200):
            found += [_pending(client, run, flows) for run in runs]
    waiting = [p for p in found if p is not None and user_id in (None, p.user_id)]
    return sorted(waiting, key=lambda p: p.waiting_since or datetime.min.replace(tzinfo=UTC))


FORM_WAIT_SECONDS = 10.0
"""How long an answer waits for the form of a run that has only just paused."""


def answer_clarification(
    flow_run_id: UUID | str, answer: str | Mapping[str, str], *, force: bool = False
) -> None:
    """Resume a waiting run with ``answer``.

    A run that has only just paused may not have saved its form yet (Prefect sets the
    state first); the answer then waits up to `FORM_WAIT_SECONDS` for it.

    Args:
        flow_run_id: The waiting run.
        answer: The answer to its one question; for a form of several questions, a
            mapping from each question (or its field, see `PendingQuestion`) to its
            answer.
        force: Answer even a run paused in a process that seems gone (one that only
            stalled comes back and goes on).

    Raises:
        BlankAnswerError: If ``answer`` is empty or only whitespace (an
            `AnswerRejectedError`); nothing is sent, and the message names the question.
        RunGoneError: If the run was paused in a process that is gone, unless
            ``force``: nothing would run it after the answer.
        AnswerRejectedError: If the server rejects the answer (not one of the options,
            or the run's form never appeared); the run stays paused and can be
            answered again; if one answer is given to a form of several questions;
            or if no such run is waiting for an answer.
    """
    pending = _waiting(_run_id(flow_run_id))
    if pending.process == "gone" and not force:
        raise RunGoneError(_gone(pending))
    run_input = _run_input(pending, answer)
    try:
        resume_flow_run(pending.flow_run_id, run_input=run_input)
    except (NotPausedError, FlowPauseTimeout):
        raise AnswerRejectedError(
            f"flow run {pending.flow_run_id} is not waiting for an answer"
        ) from None
    except RuntimeError as exc:
        raise AnswerRejectedError(
            f"the answer {answer!r} to {pending.question!r} was rejected: {exc}"
        ) from None


def answer(
    reply: str | Mapping[str, str],
    *,
    user_id: str | None = None,
    flow_run_id: UUID | str | None = None,
    timeout: float = 60.0,
    force: bool = False,
) -> PendingClarification:
    """Answer the run waiting for ``user_id`` (or run ``flow_run_id``), once it asks.

    For a notebook or a script: the process running a graph waits for the answer
    and cannot give it, so run the graph in a thread (or another process) and answer
    from here::

        with ThreadPoolExecutor(1) as pool:
            running = pool.submit(run_persona_graph, graph, "grace", "Finish my paper", agent=agent)
            asked = answer("MLA", user_id="grace")
            result = running.result()

    Args:
        reply: The answer (see `answer_clarification`: a mapping of field or question
            to answer for a form of several questions).
        user_id: Answer the latest run asking this person; the latest run asking
            anyone if neither this nor ``flow_run_id`` is given. Runs whose process
            is gone are left out.
        flow_run_id: Answer this run.
        timeout: Seconds to wait for the run to ask.
        force: Answer ``flow_run_id`` even if its process seems gone.

    Returns:
        The run answered, with the questions it asked.

    Raises:
        AnswerRejectedError: If no such run asks within ``timeout``, or the answer is
            refused (see `answer_clarification`).
    """
    run_id = _run_id(flow_run_id) if flow_run_id is not None else None
    until = time.monotonic() + timeout
    while True:
        waiting = [
            p
            for p in pending_clarifications(user_id)
            if p.flow_run_id == run_id or (run_id is None and p.process != "gone")
        ]
        if waiting:
            latest = waiting[-1]
            answer_clarification(latest.flow_run_id, reply, force=force)
            return latest
        if time.monotonic() >= until:
            whose = (
                f"flow run {run_id}" if run_id else f"a run for {user_id!r}" if user_id else "a run"
            )
            raise AnswerRejectedError(f"{whose} did not ask a question within {timeout:g} s")
        time.sleep(0.25)


def cancel_clarification(flow_run_id: UUID | str) -> None:
    """Cancel a run waiting for an answer that nothing waits in: suspended, or its process gone.

    Raises:
        AnswerRejectedError: If no such run waits for an answer, or if its process
            still waits for one (stop that process, or answer the run).
    """
    run_id = _run_id(flow_run_id)
    with get_client(sync_client=True) as client:
        run = _read(client, run_id)
        if not _ours(run) or run.state is None:
            raise AnswerRejectedError(f"flow run {run_id} is not waiting for an answer")
        key = str(run.state.state_details.pause_key)
        seen = last_seen(client, run_id, key)
        process = liveness(run.state, seen)
        if process == "alive" and seen is not None:
            raise AnswerRejectedError(
                f"flow run {run_id} still waits in process {seen.note.pid} on "
                f"{seen.note.host}: stop that process, or answer the run"
            )
        reason = {
            "gone": "its process was gone",
            "suspended": "it was suspended",
            "unknown": "it was paused",
        }[process]
        client.set_flow_run_state(
            run_id,
            Cancelled(message=f"Cancelled while waiting for an answer: {reason}"),
            force=True,
        )


def _run_id(flow_run_id: UUID | str) -> UUID:
    try:
        return UUID(str(flow_run_id))
    except ValueError:
        raise AnswerRejectedError(f"{flow_run_id!r} is not a flow run id") from None


def _read(client: SyncPrefectClient, run_id: UUID) -> FlowRun:
    try:
        return client.read_flow_run(run_id)
    except ObjectNotFound:
        raise AnswerRejectedError(f"there is no flow run {run_id}") from None


def _waiting(run_id: UUID) -> PendingClarification:
    """Run ``run_id`` as it waits for an answer, once its form is saved.

    Raises:
        AnswerRejectedError: If there is no such run, it waits for no answer of
            ours, or its form does not appear within `FORM_WAIT_SECONDS`.
    """
    give_up = time.monotonic() + FORM_WAIT_SECONDS
    with get_client(sync_client=True) as client:
        while True:
            run = _read(client, run_id)
            if not _ours(run):
                raise AnswerRejectedError(f"flow run {run_id} is not waiting for an answer")
            pending = _pending(client, run)
            if pending is not None:
                return pending
            if time.monotonic() >= give_up:
                raise AnswerRejectedError(
                    f"flow run {run_id} paused, but its question did not appear within "
                    f"{FORM_WAIT_SECONDS:g} s"
                )
            time.sleep(0.1)


def _listed(pending: PendingClarification) -> str:
    return "; ".join(
        f"{q.field}=  {q.question}" + (f" [{' | '.join(q.options)}]" if q.options else "")
        for q in pending.questions
    )


def _run_input(pending: PendingClarification, answer: str | Mapping[str, str]) -> dict[str, str]:
    """The resume input of ``answer`` to ``pending``'s form.

    Raises:
        AnswerRejectedError: If one answer is given to several questions, a question
            is left out or unknown, or an answer is blank (`BlankAnswerError`).
    """
    if isinstance(answer, str):
        if len(pending.questions) > 1:
            raise AnswerRejectedError(
                f"flow run {pending.flow_run_id} asks {len(pending.questions)} questions: "
                f"answer each as FIELD=ANSWER (in Python, a mapping of field to answer): "
                f"{_listed(pending)}"
            )
        answer = {"answer": answer}
    by_name = {q.field: q for q in pending.questions} | {q.question: q for q in pending.questions}
    unknown = [name for name in answer if name not in by_name]
    if unknown:
        raise AnswerRejectedError(
            f"flow run {pending.flow_run_id} asks no question {unknown[0]!r}; it asks: "
            + _listed(pending)
        )
    given = {by_name[name].field: value for name, value in answer.items()}
    for question in pending.questions:
        if question.field not in given:
            raise AnswerRejectedError(f"no answer to {question.question!r} ({question.field})")
        if not str(given[question.field]).strip():
            raise BlankAnswerError(question.question, given[question.field])
    return given


def _gone(pending: PendingClarification) -> str:
    """Why an answer to ``pending`` would resume nothing, and what to do instead."""
    now = datetime.now(UTC)
    if pending.last_seen is not None:
        where = f"process {pending.pid} on {pending.host}"
        why = f"was paused in {where}, last seen {span_words(now - pending.last_seen)} ago"
    else:
        why = "stopped waiting for an answer (its pause timed out)"
    return (
        f"flow run {pending.flow_run_id} {why}: nothing would run it after an answer. "
        f"Cancel it (`autopersona cancel {pending.flow_run_id}`) and start it again; or, "
        "if that process only stalled, answer anyway (`--force`, in Python force=True)"
    )
