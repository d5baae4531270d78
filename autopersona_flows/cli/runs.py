"""Commands for persona runs waiting on a person: pending, answer, notify create/ls/delete."""

from __future__ import annotations

from typing import Annotated

import typer

from autopersona_flows.cli.root import app
from autopersona_flows.errors import AnswerRejectedError

__all__: list[str] = []  # commands only: they register on the app

PANEL = "Runs"


@app.command("pending", rich_help_panel=PANEL)
def pending_command() -> None:
    """List runs waiting for an answer (from the Prefect API in use)."""
    # Imported here: the other commands must not pay for importing Prefect.
    from autopersona_flows.flows.answers import pending_clarifications  # noqa: PLC0415

    pending = pending_clarifications()
    for waiting in pending:
        if len(waiting.questions) == 1:
            options = f"  [{' | '.join(waiting.options)}]" if waiting.options else ""
            print(f"{waiting.flow_run_id}  {waiting.state}  {waiting.question}{options}")
            continue
        print(f"{waiting.flow_run_id}  {waiting.state}  {len(waiting.questions)} questions:")
        for question in waiting.questions:
            options = f"  [{' | '.join(question.options)}]" if question.options else ""
            print(f"    {question.field}=  {question.question}{options}")
    if not pending:
        print("no run is waiting for an answer")


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
) -> None:
    """Answer a waiting run and resume it."""
    from autopersona_flows.flows.answers import answer_clarification  # noqa: PLC0415

    if len(answers) == 1 and not _is_field_answer(answers[0]):
        answer_clarification(flow_run_id, answers[0])
    else:
        given = {}
        for item in answers:
            field, equals, answer = item.partition("=")
            if not equals or not field.strip():
                raise AnswerRejectedError(
                    f"{item!r}: give one FIELD=ANSWER for each question of the run"
                )
            given[field.strip()] = answer
        answer_clarification(flow_run_id, given)
    print(f"resumed {flow_run_id}")


def _is_field_answer(text: str) -> bool:
    """Whether ``text`` reads ``field=answer`` (a field is a lowercase identifier)."""
    field, equals, _ = text.partition("=")
    return bool(equals) and field.isidentifier() and field == field.lower()


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
