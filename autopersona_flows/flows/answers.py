"""For the person who answers: which runs are waiting for a clarification, and answering one.

The Prefect UI's resume dialog does the same; this is for scripts, tests and CLIs.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
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
from pydantic import BaseModel, ConfigDict

from autopersona_flows.errors import AnswerRejectedError, BlankAnswerError
from autopersona_flows.flows.clarification import question_of

__all__ = [
    "PendingClarification",
    "PendingQuestion",
    "answer_clarification",
    "pending_clarifications",
]


class PendingQuestion(BaseModel):
    """One question of a waiting run's form.

    Attributes:
        field: Its field in the form (``answer`` when it is the only one).
        question: The question.
        options: The allowed answers, if the answer is a choice.
    """

    model_config = ConfigDict(frozen=True)

    field: str
    question: str
    options: list[str]


class PendingClarification(BaseModel):
    """A run waiting for a person's answer (or answers: one form may ask several questions).

    Attributes:
        flow_run_id: The paused or suspended run.
        flow_run_name: Its name, as the UI shows it.
        state: ``"Paused"`` or ``"Suspended"``.
        key: The clarification's pause key (``clarify-<node>-<digest>``).
        question: The question asked (several joined by `` / ``).
        options: The allowed answers, if the one question's answer is a choice.
        questions: Each question of the form.
    """

    model_config = ConfigDict(frozen=True)

    flow_run_id: UUID
    flow_run_name: str
    state: str
    key: str
    question: str
    options: list[str]
    questions: list[PendingQuestion]


def _pending(client: SyncPrefectClient, flow_run: FlowRun) -> PendingClarification | None:
    state = flow_run.state
    if state is None:
        return None
    details = state.state_details
    keyset = details.run_input_keyset
    if not keyset or not str(details.pause_key or "").startswith("clarify-"):
        return None  # paused for something else than one of our questions
    try:
        description = orjson.loads(client.read_flow_run_input(flow_run.id, keyset["description"]))
        schema = orjson.loads(client.read_flow_run_input(flow_run.id, keyset["schema"]))
    except httpx.HTTPStatusError as exc:
        if exc.response.status_code == 404:
            # Prefect sets Paused first and saves the form just after: not askable yet.
            return None
        raise
    fields = schema.get("properties", {})
    if set(fields) == {"answer"}:
        answer = fields["answer"]
        # The form's field has no description (the dialog would repeat the question);
        # forms saved by earlier versions put the question there.
        question = question_of(description) or answer.get("description") or ""
        questions = [
            PendingQuestion(field="answer", question=question, options=answer.get("enum", []))
        ]
    else:  # a form of several questions: each field is titled by its question
        questions = [
            PendingQuestion(
                field=name, question=field.get("title", name), options=field.get("enum", [])
            )
            for name, field in fields.items()
        ]
    return PendingClarification(
        flow_run_id=flow_run.id,
        flow_run_name=flow_run.name,
        # Prefect's validator names an unnamed state after its type; the field is only
        # optional on input.
        state=state.name or state.type.value.capitalize(),
        key=str(details.pause_key),
        question=" / ".join(q.question for q in questions),
        options=questions[0].options if len(questions) == 1 else [],
        questions=questions,
    )


def pending_clarifications() -> list[PendingClarification]:
    """Every run of the current Prefect API waiting for an answer to a clarification."""
    paused = FlowRunFilter(
        state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.PAUSED]))
    )
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=paused)
        found = [_pending(client, run) for run in runs]
    return [pending for pending in found if pending is not None]


_FORM_MISSING = "Run input schema not found"
FORM_WAIT_SECONDS = 10.0
"""How long an answer waits for the form of a run that has only just paused."""


def answer_clarification(flow_run_id: UUID | str, answer: str | Mapping[str, str]) -> None:
    """Resume a waiting run with ``answer``.

    A run that has only just paused may not have saved its form yet (Prefect sets the
    state first); the answer then waits up to `FORM_WAIT_SECONDS` for it.

    Args:
        flow_run_id: The waiting run.
        answer: The answer to its one question; for a form of several questions, a
            mapping from each question (or its field, see `PendingQuestion`) to its
            answer.

    Raises:
        BlankAnswerError: If ``answer`` is empty or only whitespace (an
            `AnswerRejectedError`); nothing is sent, and the message names the question.
        AnswerRejectedError: If the server rejects the answer (not one of the options,
            or the run's form never appeared); the run stays paused and can be
            answered again; or if no such run is waiting for an answer.
    """
    try:
        run_id = UUID(str(flow_run_id))
    except ValueError:
        raise AnswerRejectedError(f"{flow_run_id!r} is not a flow run id") from None
    if isinstance(answer, str):
        if not answer.strip():
            raise BlankAnswerError(_question_of_run(run_id), answer)
        run_input = {"answer": answer}
    else:
        run_input = _form_answers(run_id, answer)
    give_up = time.monotonic() + FORM_WAIT_SECONDS
    while True:
        try:
            resume_flow_run(run_id, run_input=run_input)
            return
        except ObjectNotFound:
            raise AnswerRejectedError(f"there is no flow run {run_id}") from None
        except (NotPausedError, FlowPauseTimeout):
            raise AnswerRejectedError(f"flow run {run_id} is not waiting for an answer") from None
        except RuntimeError as exc:
            if _FORM_MISSING in str(exc) and time.monotonic() < give_up:
                time.sleep(0.1)
                continue
            raise AnswerRejectedError(
                f"the answer {answer!r} to {_question_of_run(run_id)!r} was rejected: {exc}"
            ) from None


def _form_answers(run_id: UUID, answers: Mapping[str, str]) -> dict[str, str]:
    """The run input of ``answers`` (by question or field) to the form run ``run_id`` waits on.

    Raises:
        AnswerRejectedError: If the run is not waiting, a question is left out or
            unknown, or an answer is blank (`BlankAnswerError`).
    """
    with get_client(sync_client=True) as client:
        try:
            pending = _pending(client, client.read_flow_run(run_id))
        except ObjectNotFound:
            pending = None
    if pending is None:
        raise AnswerRejectedError(f"flow run {run_id} is not waiting for an answer")
    by_name = {q.field: q for q in pending.questions} | {q.question: q for q in pending.questions}
    unknown = [name for name in answers if name not in by_name]
    if unknown:
        raise AnswerRejectedError(
            f"flow run {run_id} asks no question {unknown[0]!r}; it asks: "
            + "; ".join(f"{q.field} ({q.question})" for q in pending.questions)
        )
    given = {by_name[name].field: value for name, value in answers.items()}
    for question in pending.questions:
        if question.field not in given:
            raise AnswerRejectedError(f"no answer to {question.question!r} ({question.field})")
        if not str(given[question.field]).strip():
            raise BlankAnswerError(question.question, given[question.field])
    return given


def _question_of_run(run_id: UUID) -> str:
    """The question run ``run_id`` waits for an answer to, for an error message."""
    with get_client(sync_client=True) as client:
        try:
            pending = _pending(client, client.read_flow_run(run_id))
        except ObjectNotFound:
            pending = None
    return pending.question if pending is not None else f"the question of flow run {run_id}"
