"""Commands that write memories in bulk: ingest, reindex, maintain."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from autopersona_flows.cli.root import (
    EMBEDDER_HELP,
    OldStore,
    Steps,
    StoreCommand,
    StoreOption,
    app,
    existing_store,
    shown,
    store_address,
    store_and,
)
from autopersona_flows.errors import IngestionError
from autopersona_flows.memory.chatlog import DEFAULT_GAP, ChatMessage, read_chat_log
from autopersona_flows.memory.consolidation import promote_choices
from autopersona_flows.memory.embedders import get_embedder
from autopersona_flows.memory.ingestion import ingest_task_history, read_task_records
from autopersona_flows.memory.maintenance import maintain_user
from autopersona_flows.memory.records import RawTaskRecord
from autopersona_flows.memory.reindex import reindex_user
from autopersona_flows.memory.stores import open_store
from autopersona_flows.memory.updates import MemoryUpdater

__all__: list[str] = []  # commands only: they register on the app

PANEL = "Writing memories"

Embedder = Annotated[str, typer.Option("--embedder", help=EMBEDDER_HELP)]


@app.command("ingest", rich_help_panel=PANEL, cls=StoreCommand)
def ingest_command(  # noqa: PLR0917 - a command's parameters are its command line
    file: Annotated[
        str,
        typer.Argument(
            metavar="FILE",
            help="JSONL: one task a line, or with --chat one message a line (see above).",
            show_default=False,
        ),
    ],
    old_store: OldStore = None,
    store: StoreOption = None,
    chat: Annotated[
        str | None,
        typer.Option(
            "--chat",
            metavar="USER",
            help="FILE is USER's chat log: one message a line, cut into sessions, each "
            "ingested as a task.",
            show_default=False,
        ),
    ] = None,
    gap_hours: Annotated[
        float | None,
        typer.Option(
            "--gap-hours",
            help="With --chat: a silence this long starts a new session "
            f"(default: {DEFAULT_GAP / timedelta(hours=1):g}).",
            show_default=False,
        ),
    ] = None,
    embedder: Embedder = "semantic",
    no_promote: Annotated[
        bool,
        typer.Option(
            "--no-promote",
            help="Do not turn choices repeated in 3 past tasks into persona memories afterwards.",
        ),
    ] = False,
) -> None:
    """Ingest a JSONL file of completed tasks, or with --chat USER a chat log.

    [bold]A task[/bold] a line, a JSON object; only user_id and query are required:

    {"user_id": "ada", "query": "Book a train to York", "trace": ["searched trains",
    {"role": "user", "text": "I prefer aisle seats"}], "outcome": "booked seat 14C",
    "at": "2025-01-10T09:00:00+00:00"}

    user_id, query, insight: text. trace (what was done), interaction (what happened in
    the environment): lists of steps, each text or JSON; a step {"role": "user", "text":
    ...} is something the person said, read for their preferences in either list.
    outcome, task, state: any JSON. persona: preferences the task revealed, a list of
    {"topic": ..., "preference": ..., "strategy": ...}. at: when it happened, ISO 8601
    with a zone (default: now).

    [bold]A chat message[/bold] a line, with --chat USER:

    {"role": "user", "text": "I prefer aisle seats", "at": "2025-01-10T09:00:00+00:00",
    "session": "trip-1"}

    role "user" is the person, any other role the assistant or a tool; session is
    optional. Sessions are cut at a change of session or a silence of --gap-hours.

    Every line is checked before anything is written: the bad ones are listed, by
    line and field, and nothing of the file is ingested. A JSONL store is created if
    missing. Prints counts only.
    """
    address, (file,) = store_and(store, [file], old_store)
    if gap_hours is not None and chat is None:
        raise typer.BadParameter("is for a chat log: add --chat USER", param_hint="--gap-hours")
    if gap_hours is not None and gap_hours <= 0:
        raise typer.BadParameter(f"must be more than 0, got {gap_hours}", param_hint="--gap-hours")
    path = Path(file)
    try:
        lines = path.read_bytes().splitlines()
    except OSError as exc:
        raise IngestionError(f"cannot read {path}: {exc.strerror}") from exc
    if chat is None:
        records = _tasks(lines, path)
    else:
        gap = DEFAULT_GAP if gap_hours is None else timedelta(hours=gap_hours)
        records = read_chat_log(lines, path, chat, gap=gap)
    bank = open_store(address)
    updater = MemoryUpdater(bank, get_embedder(embedder))
    totals: Counter[str] = Counter()
    what = "task" if chat is None else "chat session"
    with Steps("ingesting", len(records), f"{what}s") as steps:
        for record in steps.over(records):
            totals.update(ingest_task_history(bank, updater, record).counts())
    if not no_promote:
        for user_id in dict.fromkeys(record.user_id for record in records):
            totals.update(f"persona:{d.operation}" for d in promote_choices(updater, user_id))
    summary = ", ".join(f"{key} {count}" for key, count in sorted(totals.items())) or "nothing"
    plural = "" if len(records) == 1 else "s"
    print(f"ingested {len(records)} {what}{plural} into {shown(address)}: {summary}")


def _tasks(lines: list[bytes], path: Path) -> list[RawTaskRecord]:
    """The file's tasks; a chat log given without --chat is an error that says so."""
    try:
        return read_task_records(lines, path)
    except IngestionError as exc:
        first = next((line for line in lines if line.strip()), b"")
        try:
            ChatMessage.model_validate_json(first)
        except ValidationError:
            raise exc from None
        raise IngestionError(f"{exc}\n(the lines are chat messages: add --chat USER)") from None


@app.command("reindex", rich_help_panel=PANEL, cls=StoreCommand)
def reindex_command(
    old_store: OldStore = None,
    store: StoreOption = None,
    embedder: Embedder = "semantic",
    user: Annotated[
        str | None, typer.Option("--user", help="Only this user (default: every user).")
    ] = None,
) -> None:
    """Re-embed memories made by another embedder (or stored without an embedding)."""
    opened = existing_store(store_address(store, old_store))
    chosen = get_embedder(embedder)
    users = [user] if user is not None else opened.users()
    changed = 0
    with Steps("re-embedding", len(users), "users") as steps:
        for user_id in steps.over(users):
            changed += reindex_user(opened, user_id, chosen)
    print(f"re-embedded {changed} memories of {len(users)} users with {chosen.name}")


@app.command("maintain", rich_help_panel=PANEL, cls=StoreCommand)
def maintain_command(  # noqa: PLR0917 - a command's parameters are its command line
    old_store: OldStore = None,
    store: StoreOption = None,
    embedder: Embedder = "semantic",
    user: Annotated[
        str | None, typer.Option("--user", help="Only this user (default: every user).")
    ] = None,
    workspace_max_age_days: Annotated[
        float | None,
        typer.Option(
            "--workspace-max-age-days",
            min=0,
            help="Expire workspace memories older than this (default: none expire).",
        ),
    ] = None,
    duplicate_threshold: Annotated[
        float,
        typer.Option("--duplicate-threshold", min=0, max=1, help="Merge memories this similar."),
    ] = 0.9,
) -> None:
    """The nightly upkeep, now: expire, retire, merge duplicates, promote choices, compact.

    The `memory-maintenance` flow does the same on a schedule, and exports snapshots.
    Prints counts per user, never contents.
    """
    opened = existing_store(store_address(store, old_store))
    chosen = get_embedder(embedder)
    users = [user] if user is not None else opened.users()
    max_age = timedelta(days=workspace_max_age_days) if workspace_max_age_days else None
    reports = []
    with Steps("maintaining", len(users), "users") as steps:
        for user_id in steps.over(users):
            reports.append(
                maintain_user(
                    opened,
                    user_id,
                    embedder=chosen,
                    duplicate_threshold=duplicate_threshold,
                    workspace_max_age=max_age,
                )
            )
    for report in reports:
        print(
            f"{report.user_id}: {len(report.expired)} expired, {len(report.retired)} retired, "
            f"{len(report.merged)} merged, {len(report.promoted)} promoted, "
            f"{report.compacted} compacted, fingerprint sha256:{report.fingerprint}"
        )
    print(f"maintained {len(reports)} users")
