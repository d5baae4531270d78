"""Asking the person: a typed resume form in the Prefect UI, and waiting for the answer."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, cast
from uuid import UUID

import httpx
import orjson
from prefect.artifacts import create_markdown_artifact
from prefect.client.orchestration import get_client
from prefect.context import FlowRunContext
from prefect.exceptions import FlowPauseTimeout
from prefect.flow_runs import pause_flow_run, suspend_flow_run
from prefect.input import RunInput, keyset_from_paused_state
from prefect.states import Paused, Suspended
from pydantic import Field, ValidationError, create_model

from autopersona_flows import _json
from autopersona_flows.agent.decisions import ClarifyDecision
from autopersona_flows.errors import ClarificationTimeoutError
from autopersona_flows.flows._sync import blocking
from autopersona_flows.flows.runtime import PersonaRuntime

__all__ = [
    "ClarificationForm",
    "answer_given",
    "ask",
    "clarification_form",
    "clarification_key",
    "question_markdown",
    "response_key",
]

_UNSAFE = re.compile(r"[^a-z0-9-]+")


def clarification_key(node_id: str, decision: ClarifyDecision) -> str:
    """A deterministic pause key for this question at this node.

    Prefect accepts only lowercase letters, digits and dashes (an underscore breaks
    the run *after* it paused), and a key that already fired returns its stored
    answer instead of pausing, which is what makes a resumed run skip the question.
    """
    slug = _UNSAFE.sub("-", node_id.lower()).strip("-")[:40] or "node"
    digest = _json.digest({"node": node_id, "question": decision.question})[:10]
    return f"clarify-{slug}-{digest}"


def question_markdown(node_id: str, decision: ClarifyDecision) -> str:
    """The question with its evidence, as shown in the resume dialog and the artifact."""
    lines = [f"### Step `{node_id}` needs an answer", "", f"**{decision.question}**", ""]
    if decision.options:
        lines += ["Options: " + ", ".join(f"`{option}`" for option in decision.options), ""]
    # The closest first, whatever their layer; a memory found by a lookup, not by
    # similarity (a standing constraint, score 0), came close to nothing.
    evidence = sorted((m for m in decision.memories if m.score > 0), key=lambda m: -m.score)[:5]
    if evidence:
        lines += ["What memory holds that came close:", ""]
        lines += [f"- {m.record.layer} `{m.record.id}` (score {m.score:.2f})" for m in evidence]
        lines.append("")
    lines.append("The answer is remembered, so this is not asked again.")
    return "\n".join(lines)


class ClarificationForm(RunInput):
    """The base of every clarification form: what the type checker knows of ``answer``.

    `clarification_form` redefines the field for each question (a choice or text); the
    form Prefect renders and validates is the same as with `RunInput` as the base.
    """

    answer: Any


def clarification_form(decision: ClarifyDecision) -> type[ClarificationForm]:
    """The typed input the resume dialog renders: a required ``answer`` field.

    With options it is a choice (an enum in the form); without, non-empty text. No
    default is given on purpose: if every field had one, Prefect would accept an
    empty resume.
    """
    answer_type: Any = (
        Literal[tuple(decision.options)]
        if decision.options
        else Annotated[str, Field(min_length=1)]
    )
    return create_model(
        "Clarification",
        __base__=ClarificationForm,
        answer=(answer_type, Field(description=decision.question)),
    )


def _suspends(runtime: PersonaRuntime) -> bool:
    context = FlowRunContext.get()
    deployed = (
        context is not None
        and context.flow_run is not None
        and bool(context.flow_run.deployment_id)
    )
    return runtime.pause_mode == "suspend" or (runtime.pause_mode == "auto" and deployed)


def response_key(node_id: str, decision: ClarifyDecision, runtime: PersonaRuntime) -> str:
    """The flow-run input under which Prefect keeps the answer `ask` waits for in this run.

    Prefect names it after the waiting state (``paused-<key>-response`` or
    ``suspended-<key>-response``); the server stores the answer there in the same
    transaction that resumes the run.
    """
    waiting = Suspended if _suspends(runtime) else Paused
    return keyset_from_paused_state(waiting(pause_key=clarification_key(node_id, decision)))[
        "response"
    ]


def answer_given(flow_run_id: UUID, key: str, decision: ClarifyDecision) -> str | None:
    """The answer to ``decision`` that run ``flow_run_id`` received under ``key``, if any.

    ``None`` if the run was never answered (or no longer exists), or if what it
    received is not a valid answer to this question as now asked (its options changed).
    """
    with get_client(sync_client=True) as client:
        try:
            raw = client.read_flow_run_input(flow_run_id, key)
        except httpx.HTTPStatusError as exc:
            if exc.response.status_code == 404:
                return None
            raise
    try:
        return str(clarification_form(decision).model_validate(orjson.loads(raw)).answer)
    except (orjson.JSONDecodeError, ValidationError):
        return None


def ask(node_id: str, decision: ClarifyDecision, runtime: PersonaRuntime) -> str:
    """Show the question and wait for the answer; return it.

    Suspends the run when it belongs to a deployment (the worker is freed and the
    flow re-runs from the top on resume), pauses it otherwise, as ``pause_mode``
    says. Prefect's ``Pause`` signal passes through untouched.

    Raises:
        ClarificationTimeoutError: If nobody answers within ``pause_timeout``.
    """
    key = clarification_key(node_id, decision)
    markdown = question_markdown(node_id, decision)
    context = FlowRunContext.get()
    suspend = _suspends(runtime)
    fired = (
        context is not None
        and context.flow_run is not None
        and key in (context.flow_run.empirical_policy.pause_keys or set())
    )
    # Run to completion whatever the flow (see `blocking`): in an async run Prefect's
    # async implementation, awaited; this code itself is never a coroutine.
    if not fired:  # a resumed run passes here again; its question is already shown
        blocking(create_markdown_artifact)(
            markdown=markdown, key=key, description=decision.question
        )
    form = clarification_form(decision).with_initial_data(description=markdown)
    try:
        if suspend:
            answer = blocking(suspend_flow_run)(
                wait_for_input=form, timeout=runtime.pause_timeout, key=key
            )
        else:
            answer = blocking(pause_flow_run)(
                wait_for_input=form,
                timeout=runtime.pause_timeout,
                # Prefect types it int, but only sleeps for it: a float works.
                poll_interval=cast("int", runtime.poll_interval),
                key=key,
            )
    except FlowPauseTimeout:
        raise ClarificationTimeoutError(
            f"nobody answered {decision.question!r} (step {node_id!r}) within "
            f"{runtime.pause_timeout} s"
        ) from None
    return str(getattr(answer, "answer"))  # noqa: B009 - a field of the form built above
