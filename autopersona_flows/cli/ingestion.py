"""Commands that write memories in bulk: ingest, reindex, maintain."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Annotated

import typer

from autopersona_flows.cli.root import EMBEDDER_HELP, STORE_HELP, Steps, app, existing_store
from autopersona_flows.errors import IngestionError
from autopersona_flows.memory.consolidation import promote_choices
from autopersona_flows.memory.embedders import get_embedder
from autopersona_flows.memory.ingestion import ingest_task_history, read_task_records
from autopersona_flows.memory.maintenance import maintain_user
from autopersona_flows.memory.reindex import reindex_user
from autopersona_flows.memory.stores import open_store
from autopersona_flows.memory.updates import MemoryUpdater

__all__: list[str] = []  # commands only: they register on the app

PANEL = "Writing memories"

Embedder = Annotated[str, typer.Option("--embedder", help=EMBEDDER_HELP)]


@app.command("ingest", rich_help_panel=PANEL)
def ingest_command(
    store: Annotated[
        str,
        typer.Argument(
            metavar="STORE", help=STORE_HELP + " (created if missing)", show_default=False
        ),
    ],
    file: Annotated[
        str,
        typer.Argument(
            metavar="FILE", help="One RawTaskRecord JSON object a line.", show_default=False
        ),
    ],
    embedder: Embedder = "semantic",
    no_promote: Annotated[
        bool,
        typer.Option(
            "--no-promote",
            help="Do not turn choices repeated in 3 past tasks into persona memories afterwards.",
        ),
    ] = False,
) -> None:
    """Ingest a JSONL file of completed tasks.

    The whole file is validated before anything is written: a bad line names its
    file and line, and nothing of the file is ingested. Prints counts only.
    """
    path = Path(file)
    try:
        with path.open("rb") as opened:
            # Validate the whole file first: a bad line near the end must not leave
            # half of the file ingested.
            records = list(read_task_records(opened, path))
    except OSError as exc:
        raise IngestionError(f"cannot read {path}: {exc.strerror}") from exc
    bank = open_store(store)
    updater = MemoryUpdater(bank, get_embedder(embedder))
    totals: Counter[str] = Counter()
    with Steps("ingesting", len(records), "tasks") as steps:
        for record in steps.over(records):
            totals.update(ingest_task_history(bank, updater, record).counts())
    if not no_promote:
        for user_id in dict.fromkeys(record.user_id for record in records):
            totals.update(f"persona:{d.operation}" for d in promote_choices(updater, user_id))
    summary = ", ".join(f"{key} {count}" for key, count in sorted(totals.items())) or "nothing"
    print(f"ingested {len(records)} task{'' if len(records) == 1 else 's'} into {store}: {summary}")


@app.command("reindex", rich_help_panel=PANEL)
def reindex_command(
    store: Annotated[str, typer.Argument(metavar="STORE", help=STORE_HELP, show_default=False)],
    embedder: Embedder = "semantic",
    user: Annotated[
        str | None, typer.Option("--user", help="Only this user (default: every user).")
    ] = None,
) -> None:
    """Re-embed memories made by another embedder (or stored without an embedding)."""
    opened = existing_store(store)
    chosen = get_embedder(embedder)
    users = [user] if user is not None else opened.users()
    changed = 0
    with Steps("re-embedding", len(users), "users") as steps:
        for user_id in steps.over(users):
            changed += reindex_user(opened, user_id, chosen)
    print(f"re-embedded {changed} memories of {len(users)} users with {chosen.name}")


@app.command("maintain", rich_help_panel=PANEL)
def maintain_command(
    store: Annotated[str, typer.Argument(metavar="STORE", help=STORE_HELP, show_default=False)],
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
    opened = existing_store(store)
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
