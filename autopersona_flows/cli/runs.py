"""Commands for persona runs waiting on a person: pending, answer."""

from __future__ import annotations

from typing import Annotated

import typer

from autopersona_flows.cli.root import app

__all__: list[str] = []  # commands only: they register on the app

PANEL = "Runs"


@app.command("pending", rich_help_panel=PANEL)
def pending_command() -> None:
    """List runs waiting for an answer (from the Prefect API in use)."""
    # Imported here: the other commands must not pay for importing Prefect.
    from autopersona_flows.flows.answers import pending_clarifications  # noqa: PLC0415

    pending = pending_clarifications()
    for waiting in pending:
        options = f"  [{' | '.join(waiting.options)}]" if waiting.options else ""
        print(f"{waiting.flow_run_id}  {waiting.state}  {waiting.question}{options}")
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
    answer: Annotated[
        str,
        typer.Argument(
            metavar="ANSWER",
            help="The answer (one of the options, if it lists any).",
            show_default=False,
        ),
    ],
) -> None:
    """Answer a waiting run and resume it."""
    from autopersona_flows.flows.answers import answer_clarification  # noqa: PLC0415

    answer_clarification(flow_run_id, answer)
    print(f"resumed {flow_run_id}")
