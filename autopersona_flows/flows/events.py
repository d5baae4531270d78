"""Announcing a question: the Prefect events a run emits when it waits and when it is answered.

``autopersona.clarification.requested`` is emitted when a run starts waiting for a
person, ``autopersona.clarification.answered`` when it has the answer. Both are about
the flow run (``prefect.resource.id = prefect.flow-run.<id>``, so an automation's
templates can use ``flow_run``), with the run's flow and deployment as related
resources. The payload of both::

    user_id       whose memory was asked about
    flow_run_id   the run, as text
    nodes         the ids of the nodes asking
    questions     one object each: node, step (the node in plain words), question,
                  options, requirement, key (the pause key)
    url           the run's page in the Prefect UI (see `flow_run_url`)
    message       one plain-text paragraph for a person: what is asked, and where
    answers       (answered only) the answers, in the order of ``questions``

A notification needs nothing else: ``{{ event.payload.message }}`` is the whole text
(see `create_clarification_automation`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

import prefect.settings as ps
from prefect.client.orchestration import get_client
from prefect.context import FlowRunContext
from prefect.events import Event, emit_event
from pydantic import BaseModel, ConfigDict

from autopersona_flows.agent.questions import names_options

__all__ = [
    "CLARIFICATION_ANSWERED",
    "CLARIFICATION_REQUESTED",
    "AskedQuestion",
    "emit_clarification_answered",
    "emit_clarification_requested",
    "flow_run_url",
]

CLARIFICATION_REQUESTED = "autopersona.clarification.requested"
"""The event a run emits when it starts waiting for a person's answer."""

CLARIFICATION_ANSWERED = "autopersona.clarification.answered"
"""The event a run emits when it has the answer it waited for."""


class AskedQuestion(BaseModel):
    """One question a run asks, as the events and notifications describe it.

    Attributes:
        node: The id of the node that asks.
        step: The node in plain words: its instruction, or its id made readable.
        question: The question.
        options: The allowed answers, if the answer is a choice.
        requirement: The requirement asked about, if any.
        key: The pause key the answer is given under.
    """

    model_config = ConfigDict(frozen=True)

    node: str
    step: str
    question: str
    options: list[str] = []
    requirement: str | None = None
    key: str


def _base_url() -> str | None:
    """The Prefect UI's address: `PREFECT_UI_URL`, else what the API's address implies."""
    ui = ps.PREFECT_UI_URL.value()
    if ui:
        return str(ui).rstrip("/")
    api = ps.PREFECT_API_URL.value()
    if not api:
        # An ephemeral server: the client knows where it was started.
        with get_client(sync_client=True) as client:
            api = str(client.api_url)
    # Prefect derives PREFECT_UI_URL the same way, but only when it reads its settings:
    # a server started before the API URL was set renders `{{ flow_run|ui_url }}` as
    # "None", which is why the link is computed here, where the run is.
    api = str(api).rstrip("/")
    return api.removesuffix("/api") if api else None


def flow_run_url(flow_run_id: UUID | str) -> str:
    """The page of a flow run in the Prefect UI.

    Built from `PREFECT_UI_URL`, or from `PREFECT_API_URL` without its ``/api``, or
    from the address of the ephemeral server this process talks to; never "None".
    An ephemeral or test server serves no UI, so there the link names the run without
    leading to a page.
    """
    return f"{_base_url() or 'http://127.0.0.1:4200'}/runs/flow-run/{flow_run_id}"


def _choices(question: AskedQuestion) -> str:
    if not question.options or names_options(question.question, question.options):
        return ""  # none, or the question names them already ("Window or aisle?")
    return f" (choose one of: {', '.join(question.options)})"


def _message(questions: Sequence[AskedQuestion], url: str, answers: Sequence[str] | None) -> str:
    if answers is not None:
        said = "; ".join(f"{q.question} {a!r}" for q, a in zip(questions, answers, strict=True))
        return f"Answered, the run goes on: {said}. {url}"
    where = ", ".join(dict.fromkeys(q.step for q in questions))
    asked = " ".join(f"{q.question}{_choices(q)}" for q in questions)
    return f"A run is waiting for your answer before {where}: {asked} Answer it here: {url}"


def _emit(
    event: str,
    questions: Sequence[AskedQuestion],
    user_id: str | None,
    answers: Sequence[str] | None = None,
) -> Event | None:
    context = FlowRunContext.get()
    if context is None or context.flow_run is None:
        return None  # not in a flow run: there is no run to announce
    run = context.flow_run
    url = flow_run_url(run.id)
    related = [
        {"prefect.resource.id": f"prefect.flow.{run.flow_id}", "prefect.resource.role": "flow"}
    ]
    if run.deployment_id:
        related.append(
            {
                "prefect.resource.id": f"prefect.deployment.{run.deployment_id}",
                "prefect.resource.role": "deployment",
            }
        )
    payload: dict[str, Any] = {
        "user_id": user_id,
        "flow_run_id": str(run.id),
        "nodes": list(dict.fromkeys(q.node for q in questions)),
        "questions": [q.model_dump(mode="json") for q in questions],
        "url": url,
        "message": _message(questions, url, answers),
    }
    if answers is not None:
        payload["answers"] = list(answers)
    return emit_event(
        event,
        resource={
            "prefect.resource.id": f"prefect.flow-run.{run.id}",
            "prefect.resource.name": run.name,
        },
        related=related,
        payload=payload,
    )


def emit_clarification_requested(
    questions: Sequence[AskedQuestion], user_id: str | None
) -> Event | None:
    """Announce that the current flow run waits for answers to ``questions``.

    Returns:
        The event sent, or ``None`` outside a flow run or when Prefect sends no events.
    """
    return _emit(CLARIFICATION_REQUESTED, questions, user_id)


def emit_clarification_answered(
    questions: Sequence[AskedQuestion], answers: Sequence[str], user_id: str | None
) -> Event | None:
    """Announce that the current flow run has ``answers`` to ``questions`` (same order).

    Returns:
        The event sent, or ``None`` outside a flow run or when Prefect sends no events.
    """
    return _emit(CLARIFICATION_ANSWERED, questions, user_id, answers)
