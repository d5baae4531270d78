"""Commands for runs waiting on a person: pending, answer, cancel, notify create/ls/delete."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated

import typer

from autopersona_flows.cli.root import app
from autopersona_flows.errors import AnswerRejectedError

if TYPE_CHECKING:
    from autopersona_flows.flows.answers import PendingClarification

__all__: list[str] = []  # commands only: they register on the app

PANEL = "Runs"


@app.command("pending", rich_help_panel=PANEL)
def pending_command(
    user: Annotated[
        str | None, typer.Option("--user", metavar="USER", help="Only the runs asking USER.")
    ] = None,
) -> None:
    """List runs waiting for an answer (from the Prefect API in use), oldest first.

    Each run's first line: its id, state, whom it asks, flow/run name, how long it has
    waited and whether anything will run it once answered; then its questions.
    """
    # Imported here: the other commands must not pay for importing Prefect.
    from autopersona_flows.flows.answers import pending_clarifications  # noqa: PLC0415

    pending = pending_clarifications(user)
    now = datetime.now(UTC)
    for waiting in pending:
        print(_heading(waiting, now))
        for question in waiting.questions:
            field = f"{question.field}=  " if len(waiting.questions) > 1 else ""
            options = f"  [{' | '.join(question.options)}]" if question.options else ""
            before = f"  (before: {question.step})" if question.step else ""
            print(f"    {field}{question.question}{options}{before}")
    if not pending:
        print("no run is waiting for an answer" + (f" from {user}" if user else ""))


def _heading(waiting: PendingClarification, now: datetime) -> str:
    """A waiting run's first line: id, state, person, flow/run, wait, and its process."""
    from autopersona_flows.flows.waiting import span_words  # noqa: PLC0415

    parts = [str(waiting.flow_run_id), waiting.state, f"for {waiting.user_id or '(unknown)'}"]
    parts.append(f"{waiting.flow_name}/{waiting.flow_run_name}")
    if waiting.waiting_since is not None:
        parts.append(f"waiting {span_words(now - waiting.waiting_since)}")
    if waiting.process == "alive":
        parts.append(f"process {waiting.pid} on {waiting.host} waits")
    elif waiting.process == "suspended":
        parts.append("suspended: a worker runs it once answered")
    elif waiting.process == "unknown":
        parts.append("process unknown (no heartbeat)")
    else:
        seen = (
            f" (last seen {span_words(now - waiting.last_seen)} ago)" if waiting.last_seen else ""
        )
        parts.append(
            f"PROCESS GONE{seen}: an answer would resume nothing; "
            f"`autopersona cancel {waiting.flow_run_id}`"
        )
    if len(waiting.questions) > 1:
        parts.append(f"{len(waiting.questions)} questions:")
    return "  ".join(parts)


@app.command("answer", rich_help_panel=PANEL)
def answer_command(
    flow_run_id: Annotated[
        str,
        typer.Argument(
            metavar="FLOW_RUN_ID",
            help="The run's id, as `autopersona pending` lists it.",
            show_default=False,
        ),
    ],
    answers: Annotated[
        list[str],
        typer.Argument(
            metavar="ANSWER...",
            help="The answer (one of the options, if it lists any); for a run that asks "
            "several questions, one FIELD=ANSWER each, FIELD as `autopersona pending` lists it.",
            show_default=False,
        ),
    ],
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Answer even a run whose process seems gone (it only stalled, say).",
        ),
    ] = False,
) -> None:
    """Answer a waiting run and resume it.

    A run paused in a process that is gone is refused (exit 1): nothing would run it
    after the answer. `autopersona cancel` ends it.
    """
    from autopersona_flows.flows.answers import answer_clarification  # noqa: PLC0415

    if len(answers) == 1 and not _is_field_answer(answers[0]):
        answer_clarification(flow_run_id, answers[0], force=force)
    else:
        given = {}
        for item in answers:
            field, equals, answer = item.partition("=")
            if not equals or not field.strip():
                raise AnswerRejectedError(
                    f"{item!r}: give one FIELD=ANSWER for each question of the run"
                )
            given[field.strip()] = answer
        answer_clarification(flow_run_id, given, force=force)
    print(f"resumed {flow_run_id}")


def _is_field_answer(text: str) -> bool:
    """Whether ``text`` reads ``field=answer`` (a field is a lowercase identifier)."""
    field, equals, _ = text.partition("=")
    return bool(equals) and field.isidentifier() and field == field.lower()


@app.command("cancel", rich_help_panel=PANEL)
def cancel_command(
    flow_run_ids: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="[FLOW_RUN_ID...]",
            help="Runs waiting for an answer, as `autopersona pending` lists them.",
            show_default=False,
        ),
    ] = None,
    gone: Annotated[
        bool,
        typer.Option("--gone", help="Every waiting run whose process is gone."),
    ] = False,
) -> None:
    """Cancel runs waiting for an answer that nothing waits in (process gone, or suspended).

    A run whose process still waits is refused: stop that process, or answer the run.
    """
    from autopersona_flows.flows.answers import (  # noqa: PLC0415
        cancel_clarification,
        pending_clarifications,
    )

    runs = list(flow_run_ids or [])
    if gone:
        runs += [str(p.flow_run_id) for p in pending_clarifications() if p.process == "gone"]
    if not runs:
        if not gone:
            raise typer.BadParameter("name the runs to cancel, or give --gone")
        print("no waiting run's process is gone")
    for run in dict.fromkeys(runs):
        cancel_clarification(run)
        print(f"cancelled {run}")


notify = typer.Typer(
    name="notify",
    help="Be told when a run waits for an answer: Prefect automations on our events.",
    no_args_is_help=True,
)
app.add_typer(notify, rich_help_panel=PANEL)


@notify.command("create")
def notify_create_command(
    webhook: Annotated[
        str | None,
        typer.Option(
            "--webhook", metavar="URL", help="POST the question and the run's link here (JSON)."
        ),
    ] = None,
    block: Annotated[
        str | None,
        typer.Option(
            "--block",
            metavar="SLUG",
            help="Send through this Prefect notification block, e.g. slack-webhook/team.",
        ),
    ] = None,
    name: Annotated[
        str | None,
        typer.Option("--name", help="The automation's name (one of that name is replaced)."),
    ] = None,
) -> None:
    """Create the automation that sends each question and its link when a run waits."""
    from autopersona_flows.flows.notifications import (  # noqa: PLC0415
        DEFAULT_AUTOMATION_NAME,
        create_clarification_automation,
    )

    automation = create_clarification_automation(
        webhook_url=webhook, block_slug=block, name=name or DEFAULT_AUTOMATION_NAME
    )
    print(f"automation {automation.name!r} ({automation.id}) notifies on every question")


@notify.command("ls")
def notify_ls_command() -> None:
    """List the automations that send our questions: name, id, enabled, where to."""
    from autopersona_flows.flows.notifications import (  # noqa: PLC0415
        list_clarification_automations,
    )

    automations = list_clarification_automations()
    for automation in automations:
        state = "enabled" if automation.enabled else "disabled"
        line = f"{automation.id}  {state}  {automation.name!r}  sends to {automation.sends_to}"
        if automation.outdated:
            line += "  (outdated call-webhook: `notify create` it again)"
        print(line)
    if not automations:
        print("no automation sends our questions: `autopersona notify create` makes one")


@notify.command("delete")
def notify_delete_command(
    name_or_id: Annotated[
        str | None,
        typer.Argument(
            metavar="[NAME|ID]",
            help="The automation's name or id, as `autopersona notify ls` lists them "
            "(default: the name `notify create` gives).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Delete an automation that sends our questions (and the webhook block saved for it)."""
    from autopersona_flows.flows.notifications import (  # noqa: PLC0415
        DEFAULT_AUTOMATION_NAME,
        delete_clarification_automation,
    )

    for automation in delete_clarification_automation(name_or_id or DEFAULT_AUTOMATION_NAME):
        print(f"deleted automation {automation.name!r} ({automation.id})")
