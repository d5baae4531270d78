"""Asking the person: a typed resume form in the Prefect UI, and waiting for the answer."""

from __future__ import annotations

import re
from collections.abc import Sequence
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
from prefect.states import Paused, Running, Suspended
from pydantic import Field, ValidationError, create_model
from pydantic.config import JsonDict

from autopersona_flows import _json
from autopersona_flows.agent.decisions import ClarifyDecision, Requirement
from autopersona_flows.agent.questions import names_options
from autopersona_flows.errors import ClarificationTimeoutError
from autopersona_flows.flows._sync import blocking
from autopersona_flows.flows.events import (
    AskedQuestion,
    emit_clarification_answered,
    emit_clarification_requested,
    flow_run_url,
)
from autopersona_flows.flows.runtime import PersonaRuntime
from autopersona_flows.flows.waiting import WaitingNote, answer_command, waiting_for_answer
from autopersona_flows.memory.records import PersonaMemory
from autopersona_flows.memory.retrieval import ScoredMemory
from autopersona_flows.memory.text import memory_text

__all__ = [
    "ClarificationForm",
    "allows_other",
    "answer_given",
    "artifact_markdown",
    "ask_all",
    "asked_question",
    "choices_unsaid",
    "clarification_form",
    "clarification_key",
    "field_names",
    "field_title",
    "form_key",
    "question_markdown",
    "question_of",
    "questions_form",
    "record_answered",
    "record_defaults",
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
    unsaid = choices_unsaid(decision)
    if unsaid:
        lines += ["", unsaid]
    lines += ["", "Waiting for an answer in this run's Resume dialog."]
    return "\n".join(lines)


class ClarificationForm(RunInput):
    """The base of every clarification form: what the type checker knows of ``answer``.

    `clarification_form` redefines the field for each question (a choice or text); the
    form Prefect renders and validates is the same as with `RunInput` as the base.
    """

    answer: Any


def _asked(decision: ClarifyDecision) -> Requirement | None:
    """The requirement ``decision`` asks about, as its request declares it."""
    request, wanted = decision.request, (decision.requirement or "").casefold()
    return next(
        (
            r
            for r in (request.requirements if request is not None else [])
            if r.name.casefold() == wanted
        ),
        None,
    )


def allows_other(decision: ClarifyDecision) -> bool:
    """Whether the requirement asked about takes other words than its options."""
    asked = _asked(decision)
    return asked is not None and asked.allow_other


def choices_unsaid(decision: ClarifyDecision) -> str:
    """``"Choices: a, b."`` for a log line or text, unless the question names its options.

    A composed question says them already ("Window or aisle?"); a question a
    requirement declares may not.
    """
    if not decision.options or names_options(decision.question, decision.options):
        return ""
    return f"Choices: {', '.join(decision.options)}."


def _answer_field(decision: ClarifyDecision, title: str) -> tuple[Any, Any]:
    """The form field of ``decision``'s answer: its type, titled, with its default preselected.

    The default is in the JSON schema only, as the dialog's initial value: the field
    stays required, so an empty resume through the API is refused, never taken as
    the default (which is not the person's answer until they submit it).
    """
    asked = _asked(decision)
    default = asked.default if asked is not None else None
    if default is not None and decision.options and not allows_other(decision):
        default = default if default in decision.options else None
    extra: JsonDict | None = {"default": default} if default is not None else None
    return _answer_type(decision), Field(title=title, json_schema_extra=extra)


def _answer_type(decision: ClarifyDecision) -> Any:
    """A choice of the options (an enum in the form), or text that is not blank."""
    if decision.options and not allows_other(decision):
        return Literal[tuple(decision.options)]
    # Prefect's server validates the answer against the JSON schema: `\S` (a search,
    # as JSON-schema patterns are) refuses blank text, which `min_length=1` lets through.
    return Annotated[str, Field(min_length=1, pattern=NON_BLANK)]


def clarification_form(decision: ClarifyDecision) -> type[ClarificationForm]:
    """The typed input the resume dialog renders: a required ``answer`` field.

    With options it is a choice (an enum in the form); without, text with something
    other than whitespace in it. The field never has a default of its own (if every
    field had one, Prefect would accept an empty resume): a requirement's declared
    default is only what the dialog starts with (see `_answer_field`).
    """
    # No description: the dialog prints it under the field, repeating the question.
    title = "Your answer"
    if (
        decision.options
        and allows_other(decision)
        and not names_options(decision.question, decision.options)
    ):
        title += f" ({', '.join(decision.options)}, or your own words)"
    return create_model(
        "Clarification", __base__=ClarificationForm, answer=_answer_field(decision, title)
    )


def field_names(decisions: Sequence[ClarifyDecision]) -> list[str]:
    """The field of each question in its form: ``answer`` alone, else one per requirement.

    ``citation style`` becomes ``citation_style``; a question about no requirement,
    or a name taken already, gets its position (``answer_2``).
    """
    if len(decisions) == 1:
        return ["answer"]
    names: list[str] = []
    for position, decision in enumerate(decisions, 1):
        name = _FIELD.sub("_", (decision.requirement or "").lower()).strip("_")
        if not name or not name[0].isalpha() or name in names:
            name = f"answer_{position}"
        names.append(name)
    return names


_FIELD = re.compile(r"[^a-z0-9]+")


def field_title(decision: ClarifyDecision) -> str:
    """A field's label in a form of several questions: its question, options left out.

    A question written for text (the CLI, a notification) may end by listing its
    options; above a select of those same options the list only repeats them.
    """
    listed = f" Options: {', '.join(decision.options)}."
    question = decision.question.removesuffix(listed) if decision.options else decision.question
    if (
        decision.options
        and allows_other(decision)
        and not names_options(question, decision.options)
    ):
        # A text field: say what it suggests.
        return f"{question} ({', '.join(decision.options)}, or your own words)"
    return question


def questions_form(decisions: Sequence[ClarifyDecision]) -> type[RunInput]:
    """The form of several questions asked at once: one required field each, titled by it."""
    if len(decisions) == 1:
        return clarification_form(decisions[0])
    fields: dict[str, Any] = {
        name: _answer_field(decision, field_title(decision))
        for name, decision in zip(field_names(decisions), decisions, strict=True)
    }
    return create_model("Clarifications", __base__=RunInput, **fields)


def form_key(questions: Sequence[tuple[str, ClarifyDecision]]) -> str:
    """The pause key of a form: `clarification_key` of its one question, or of them all."""
    if len(questions) == 1:
        return clarification_key(*questions[0])
    together = " / ".join(f"{node_id}: {d.question}" for node_id, d in questions)
    # "start": the name forms of several questions have always had (a stable pause key).
    return clarification_key("start", ClarifyDecision(question=together))


def _suspends(runtime: PersonaRuntime) -> bool:
    context = FlowRunContext.get()
    deployed = (
        context is not None
        and context.flow_run is not None
        and bool(context.flow_run.deployment_id)
    )
    return runtime.pause_mode == "suspend" or (runtime.pause_mode == "auto" and deployed)


def response_key(pause_key: str, runtime: PersonaRuntime) -> str:
    """The flow-run input under which Prefect keeps the answers to the form of ``pause_key``.

    Prefect names it after the waiting state (``paused-<key>-response`` or
    ``suspended-<key>-response``); the server stores the answer there in the same
    transaction that resumes the run.
    """
    waiting = Suspended if _suspends(runtime) else Paused
    return keyset_from_paused_state(waiting(pause_key=pause_key))["response"]


def answer_given(
    flow_run_id: UUID, key: str, decision: ClarifyDecision, field: str = "answer"
) -> str | None:
    """The answer to ``decision`` that run ``flow_run_id`` received under ``key``, if any.

    ``field`` is the question's field in its form (see `field_names`). ``None`` if
    the run was never answered (or no longer exists), or if what it received is not
    a valid answer to this question as now asked (its options changed).
    """
    with get_client(sync_client=True) as client:
        try:
            raw = client.read_flow_run_input(flow_run_id, key)
        except httpx.HTTPStatusError as exc:
            if exc.response.status_code == 404:
                return None
            raise
    try:
        given = orjson.loads(raw)
        answer = {"answer": given[field]} if isinstance(given, dict) and field in given else {}
        return str(clarification_form(decision).model_validate(answer).answer)
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


def ask_all(
    questions: Sequence[tuple[str, ClarifyDecision]],
    runtime: PersonaRuntime,
) -> list[str]:
    """Show the questions (each of a node) in one form and wait for the answers.

    Suspends the run when it belongs to a deployment (the worker is freed and the
    flow re-runs from the top on resume), pauses it otherwise, as ``pause_mode``
    says. Prefect's ``Pause`` signal passes through untouched. When it starts
    waiting it logs the questions, emits ``autopersona.clarification.requested`` and
    saves them as the ``clarify-*`` artifact; with the answers it logs them, emits
    ``autopersona.clarification.answered`` and saves the answered artifact as a new
    version under the same key.

    Args:
        questions: The questions, each with the node asking it.
        runtime: How to wait.

    Returns:
        The answers, in the order of ``questions``.

    Raises:
        ClarificationTimeoutError: If nobody answers within ``pause_timeout``.
    """
    key = form_key(questions)
    context = FlowRunContext.get()
    asked = [asked_question(node_id, decision) for node_id, decision in questions]
    user_id = _user_of(questions[0][1], context)
    decisions = [decision for _, decision in questions]
    fired = (
        context is not None
        and context.flow_run is not None
        and key in (context.flow_run.empirical_policy.pause_keys or set())
    )
    if not fired:  # a resumed run passes here again; its question is already shown
        _show(questions, asked, key, context, user_id)
    form = questions_form(decisions).with_initial_data(description=_dialog(questions))
    run_id = context.flow_run.id if context is not None and context.flow_run else None
    note = WaitingNote(
        user_id=user_id, nodes=[q.node for q in asked], steps=[q.step for q in asked]
    )
    try:
        # Those who answer see whom it asks, and whether its process still waits.
        with waiting_for_answer(run_id, key, note, paused=not _suspends(runtime)):
            answer = _wait(form, runtime, key)
    except FlowPauseTimeout:
        raise ClarificationTimeoutError(
            f"nobody answered {_listed(decisions)!r} (before "
            f"{', '.join(dict.fromkeys(q.step for q in asked))}) within {runtime.pause_timeout} s"
        ) from None
    # Never blank: the server refused a blank answer, and loading it through the form
    # would too.
    given = [str(getattr(answer, name)) for name in field_names(decisions)]
    record_answered(questions, given)
    return given


def record_answered(questions: Sequence[tuple[str, ClarifyDecision]], given: Sequence[str]) -> None:
    """Leave the answered trail: a log line each, the answered event, the artifact's new version.

    Called by `ask_all` once the answers are in, and for a suspended run resumed with
    them, which runs again from the top and reads them back instead (`EpisodeAnswers`).
    """
    context = FlowRunContext.get()
    decisions = [decision for _, decision in questions]
    for decision, one_answer in zip(decisions, given, strict=True):
        _logger(context).info("Answered %r: %r", decision.question, one_answer)
    blocking(create_markdown_artifact)(
        markdown=_artifact(questions, list(given)),
        key=form_key(questions),
        description="Answered: " + " / ".join(given),
    )
    asked = [asked_question(node_id, decision) for node_id, decision in questions]
    emit_clarification_answered(asked, list(given), _user_of(decisions[0], context))


def _show(
    questions: Sequence[tuple[str, ClarifyDecision]],
    asked: list[AskedQuestion],
    key: str,
    context: FlowRunContext | None,
    user_id: str | None,
) -> None:
    """Show the questions: the ``clarify-*`` artifact, a log line each, the event."""
    decisions = [decision for _, decision in questions]
    # Run to completion whatever the flow (see `blocking`): in an async run Prefect's
    # async implementation, awaited; this code itself is never a coroutine.
    blocking(create_markdown_artifact)(
        markdown=_artifact(questions), key=key, description=_listed(decisions)
    )
    where_url = flow_run_url(context.flow_run.id) if context and context.flow_run else None
    for one, decision in zip(asked, decisions, strict=True):
        _logger(context).info(
            "Waiting for an answer before %s: %s%s%s",
            one.step,
            decision.question,
            f" {choices_unsaid(decision)}" if choices_unsaid(decision) else "",
            f" Answer it in the Resume dialog: {where_url}" if where_url else "",
        )
    if context is not None and context.flow_run is not None:
        fields = zip(field_names(decisions), decisions, strict=True)
        _logger(context).info(
            "Or answer from a shell: %s",
            answer_command(
                context.flow_run.id,
                [(name, [] if allows_other(d) else d.options) for name, d in fields],
            ),
        )
    emit_clarification_requested(asked, user_id)


def _wait(form: Any, runtime: PersonaRuntime, key: str) -> Any:
    """Suspend or pause the run until the form is answered; return the answer.

    Raises:
        FlowPauseTimeout: If nobody answers within ``pause_timeout``.
    """
    if _suspends(runtime):
        return blocking(suspend_flow_run)(
            wait_for_input=form, timeout=runtime.pause_timeout, key=key
        )
    return blocking(pause_flow_run)(
        wait_for_input=form,
        timeout=runtime.pause_timeout,
        # Prefect types it int, but only sleeps for it: a float works.
        poll_interval=cast("int", runtime.poll_interval),
        key=key,
    )


def running_again(flow_run_id: UUID) -> None:
    """Set a run whose pause timed out back to Running, to go on without an answer."""
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(flow_run_id, Running(), force=True)


def record_defaults(questions: Sequence[tuple[str, ClarifyDecision]], defaults: list[str]) -> None:
    """Say, in the log and the form's artifact, that nobody answered and defaults were used."""
    context = FlowRunContext.get()
    lines = ["### Nobody answered in time", ""]
    for (node_id, decision), default in zip(questions, defaults, strict=True):
        _logger(context).warning(
            "Nobody answered %r in time: running with its declared default %r (not learned)",
            decision.question,
            default,
        )
        lines += [
            f"**{decision.question}** ({step_words(node_id, decision)})",
            "",
            f"Ran with the declared default: **{default}** (not remembered as a preference)",
            "",
        ]
    blocking(create_markdown_artifact)(
        markdown="\n".join(lines),
        key=form_key(questions),
        description="Unanswered: ran with defaults " + " / ".join(defaults),
    )


def _listed(decisions: Sequence[ClarifyDecision]) -> str:
    return " / ".join(decision.question for decision in decisions)


def _dialog(questions: Sequence[tuple[str, ClarifyDecision]]) -> str:
    """The resume dialog's text: the one question with its evidence, or the form's intro."""
    if len(questions) == 1:
        return question_markdown(*questions[0])
    steps = dict.fromkeys(step_words(node_id, d) for node_id, d in questions)
    lines = [f"### {len(questions)} questions before the work starts", ""]
    lines += [f"They are for: {'; '.join(steps)}.", ""]
    lines.append("Your answers are remembered, so you will not be asked these again.")
    return "\n".join(lines)


def _artifact(
    questions: Sequence[tuple[str, ClarifyDecision]], given: list[str] | None = None
) -> str:
    """The run's ``clarify-*`` artifact: the questions while waiting, then their answers."""
    if len(questions) == 1:
        return artifact_markdown(*questions[0], answer=given[0] if given else None)
    parts = [
        artifact_markdown(node_id, decision, given[n] if given else None)
        for n, (node_id, decision) in enumerate(questions)
    ]
    return "\n\n---\n\n".join(parts)
