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
from prefect.logging import get_logger, get_run_logger
from prefect.states import Paused, Suspended
from pydantic import Field, ValidationError, create_model

from autopersona_flows import _json
from autopersona_flows.agent.decisions import ClarifyDecision
from autopersona_flows.errors import ClarificationTimeoutError
from autopersona_flows.flows._sync import blocking
from autopersona_flows.flows.events import (
    AskedQuestion,
    emit_clarification_answered,
    emit_clarification_requested,
    flow_run_url,
)
from autopersona_flows.flows.runtime import PersonaRuntime
from autopersona_flows.memory.records import PersonaMemory
from autopersona_flows.memory.retrieval import ScoredMemory
from autopersona_flows.memory.text import memory_text

__all__ = [
    "ClarificationForm",
    "answer_given",
    "artifact_markdown",
    "ask",
    "asked_question",
    "clarification_form",
    "clarification_key",
    "question_markdown",
    "question_of",
    "response_key",
    "step_words",
]

_UNSAFE = re.compile(r"[^a-z0-9-]+")
NON_BLANK = r"\S"
"""The JSON-schema pattern of a text answer: anything but only whitespace."""


def clarification_key(node_id: str, decision: ClarifyDecision) -> str:
    """A deterministic pause key for this question at this node.

    Prefect accepts only lowercase letters, digits and dashes (an underscore breaks
    the run *after* it paused), and a key that already fired returns its stored
    answer instead of pausing, which is what makes a resumed run skip the question.
    """
    slug = _UNSAFE.sub("-", node_id.lower()).strip("-")[:40] or "node"
    digest = _json.digest({"node": node_id, "question": decision.question})[:10]
    return f"clarify-{slug}-{digest}"


_CLOSE_ENOUGH = 0.1
"""Memories scoring less came close to nothing: showing them would only add noise."""


def step_words(node_id: str, decision: ClarifyDecision) -> str:
    """The node in a person's terms: its instruction, else its id made readable."""
    node = decision.request.node if decision.request is not None else None
    instruction = (node.instruction if node is not None else "").strip().rstrip(".")
    return instruction or re.sub(r"[-_\s]+", " ", node_id).strip() or node_id


def _said(memory: ScoredMemory) -> str:
    content = memory.record.content
    if isinstance(content, PersonaMemory):
        text = f"{content.topic}: {content.preference or content.strategy or ''}".rstrip(": ")
    else:
        text = memory_text(content)
    return text if len(text) <= _SAID else text[: _SAID - 1].rstrip() + "…"


_SAID = 100


def _evidence(decision: ClarifyDecision) -> list[str]:
    """What memory holds that came close, closest first, each memory once."""
    best: dict[str, ScoredMemory] = {}
    # A memory may be found by several searches (and layers' lookups, score 0): keep
    # its best score, and drop what came close to nothing.
    for memory in decision.memories:
        kept = best.get(memory.record.id)
        if memory.score >= _CLOSE_ENOUGH and (kept is None or memory.score > kept.score):
            best[memory.record.id] = memory
    closest = sorted(best.values(), key=lambda m: -m.score)[:5]
    return [f"- “{_said(m)}” ({m.record.layer} memory, similarity {m.score:.2f})" for m in closest]


def question_markdown(node_id: str, decision: ClarifyDecision) -> str:
    """The question with its evidence, as the resume dialog shows it.

    The question appears once, in bold on a line of its own (`question_of` reads it
    back); the form below it is a choice of the options, or a text field, with no
    label of its own that would repeat it.
    """
    lines = [f"### One question before: {step_words(node_id, decision)}", ""]
    lines += [f"**{decision.question}**", ""]
    evidence = _evidence(decision)
    if evidence:
        lines += ["Closest to it in memory (none of it answers the question):", "", *evidence, ""]
    lines.append("Your answer is remembered, so you will not be asked this again.")
    return "\n".join(lines)


def question_of(markdown: str) -> str | None:
    """The question in a `question_markdown`: its first line in bold."""
    return next(
        (
            line[2:-2]
            for line in markdown.splitlines()
            if len(line) > 4 and line.startswith("**") and line.endswith("**")
        ),
        None,
    )


def artifact_markdown(node_id: str, decision: ClarifyDecision, answer: str | None = None) -> str:
    """The run's ``clarify-*`` artifact: the question while waiting, then its answer."""
    step = step_words(node_id, decision)
    if answer is not None:
        return "\n".join(
            [
                f"### Answered before: {step}",
                "",
                f"**{decision.question}**",
                "",
                f"Answer: **{answer}** (remembered for next time)",
            ]
        )
    lines = [question_markdown(node_id, decision)]
    if decision.options:
        lines += ["", "Choices: " + ", ".join(decision.options)]
    lines += ["", "Waiting for an answer in this run's Resume dialog."]
    return "\n".join(lines)


class ClarificationForm(RunInput):
    """The base of every clarification form: what the type checker knows of ``answer``.

    `clarification_form` redefines the field for each question (a choice or text); the
    form Prefect renders and validates is the same as with `RunInput` as the base.
    """

    answer: Any


def clarification_form(decision: ClarifyDecision) -> type[ClarificationForm]:
    """The typed input the resume dialog renders: a required ``answer`` field.

    With options it is a choice (an enum in the form); without, text with something
    other than whitespace in it. No default is given on purpose: if every field had
    one, Prefect would accept an empty resume.
    """
    answer_type: Any = (
        Literal[tuple(decision.options)]
        if decision.options
        # Prefect's server validates the answer against the JSON schema: `\S` (a
        # search, as JSON-schema patterns are) refuses blank text, which
        # `min_length=1` alone lets through.
        else Annotated[str, Field(min_length=1, pattern=NON_BLANK)]
    )
    # No description: the dialog prints it under the field, repeating the question.
    return create_model(
        "Clarification",
        __base__=ClarificationForm,
        answer=(answer_type, Field(title="Your answer")),
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


def asked_question(node_id: str, decision: ClarifyDecision) -> AskedQuestion:
    """``decision`` at ``node_id`` as the clarification events describe it."""
    return AskedQuestion(
        node=node_id,
        step=step_words(node_id, decision),
        question=decision.question,
        options=list(decision.options),
        requirement=decision.requirement,
        key=clarification_key(node_id, decision),
    )


def _user_of(decision: ClarifyDecision, context: FlowRunContext | None) -> str | None:
    if decision.request is not None:
        return decision.request.user_id
    user = (context.parameters or {}).get("user_id") if context is not None else None
    return user if isinstance(user, str) else None


def _logger(context: FlowRunContext | None) -> Any:
    return get_run_logger() if context is not None else get_logger(__name__)


def ask(node_id: str, decision: ClarifyDecision, runtime: PersonaRuntime) -> str:
    """Show the question and wait for the answer; return it.

    Suspends the run when it belongs to a deployment (the worker is freed and the
    flow re-runs from the top on resume), pauses it otherwise, as ``pause_mode``
    says. Prefect's ``Pause`` signal passes through untouched. When it starts
    waiting it logs the question, emits ``autopersona.clarification.requested`` and
    saves the question as the ``clarify-*`` artifact; with the answer it logs it,
    emits ``autopersona.clarification.answered`` and saves the answered artifact as
    a new version under the same key.

    Raises:
        ClarificationTimeoutError: If nobody answers within ``pause_timeout``.
    """
    key = clarification_key(node_id, decision)
    context = FlowRunContext.get()
    logger = _logger(context)
    asked = asked_question(node_id, decision)
    user_id = _user_of(decision, context)
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
            markdown=artifact_markdown(node_id, decision), key=key, description=decision.question
        )
        where = flow_run_url(context.flow_run.id) if context and context.flow_run else None
        logger.info(
            "Waiting for an answer before %s: %s%s%s",
            asked.step,
            decision.question,
            f" Choices: {', '.join(decision.options)}." if decision.options else "",
            f" Answer it in the Resume dialog: {where}" if where else "",
        )
        emit_clarification_requested([asked], user_id)
    form = clarification_form(decision).with_initial_data(
        description=question_markdown(node_id, decision)
    )
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
            f"nobody answered {decision.question!r} (before {asked.step}) within "
            f"{runtime.pause_timeout} s"
        ) from None
    # Never blank: the server refused a blank answer, and loading it through the form
    # would too.
    given = str(getattr(answer, "answer"))  # noqa: B009 - a field of the form built above
    logger.info("Answered %r: %r", decision.question, given)
    blocking(create_markdown_artifact)(
        markdown=artifact_markdown(node_id, decision, given),
        key=key,
        description=f"Answered: {given}",
    )
    emit_clarification_answered([asked], [given], user_id)
    return given
