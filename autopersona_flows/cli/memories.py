"""Commands to look at one person's memories and correct them: memories, edit, forget, bury.

``memories`` is the one command that shows memory contents: a person asked for
them. The corrections print what they did to which id, not what it said.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from autopersona_flows import _json
from autopersona_flows.cli.root import (
    EMBEDDER_HELP,
    OldStore,
    StoreCommand,
    StoreOption,
    app,
    console,
    existing_store,
    shown,
    store_and,
)
from autopersona_flows.errors import CorrectionError
from autopersona_flows.memory.bank import MemoryBank
from autopersona_flows.memory.embedders import get_embedder
from autopersona_flows.memory.records import (
    LAYERS,
    LayerContent,
    MemoryLayer,
    MemoryRecord,
    PersonaMemory,
    TrajectoryMemory,
)
from autopersona_flows.memory.retrieval import SearchRequest
from autopersona_flows.memory.snapshots import MemoryChange

__all__: list[str] = []  # commands only: they register on the app

PANEL = "A person's memories"

User = Annotated[
    str, typer.Argument(metavar="USER", help="The user id, exactly as stored.", show_default=False)
]
MemoryId = Annotated[
    str,
    typer.Argument(
        metavar="ID",
        help="The memory's id, as `autopersona memories` lists it.",
        show_default=False,
    ),
]
Layer = Annotated[
    str | None,
    typer.Option(
        "--layer", metavar="LAYER", help="trajectory, workspace or persona (default: every layer)."
    ),
]
Reason = Annotated[str, typer.Option("--reason", help="Why, kept in the memory's history.")]
Embedder = Annotated[str, typer.Option("--embedder", help=EMBEDDER_HELP)]

_WIDE = 60  # characters of a value shown in a table cell before it is cut


def _layers(value: str | None) -> tuple[MemoryLayer, ...]:
    return LAYERS if value is None else (_one_layer(value),)


def _layer(value: str | None) -> MemoryLayer | None:
    return None if value is None else _one_layer(value)


def _one_layer(value: str) -> MemoryLayer:
    for layer in LAYERS:
        if value == layer:
            return layer
    raise typer.BadParameter(f"{value!r} is not one of {', '.join(LAYERS)}", param_hint="--layer")


def _bank(store: str, embedder: str) -> MemoryBank:
    return MemoryBank(existing_store(store), get_embedder(embedder))


@app.command("memories", rich_help_panel=PANEL, cls=StoreCommand)
def memories_command(  # noqa: PLR0917 - a command's parameters are its command line
    user: User,
    old_store: OldStore = None,
    store: StoreOption = None,
    layer: Layer = None,
    search: Annotated[
        str | None,
        typer.Option(
            "--search",
            metavar="TEXT",
            help="Only memories retrieval finds for TEXT, best matches first (what a "
            "decision would see: buried ones are not found).",
        ),
    ] = None,
    history: Annotated[
        bool,
        typer.Option(
            "--history",
            help="Also list superseded and deleted versions, memory by memory: each "
            "version's source and what changed it.",
        ),
    ] = False,
    json: Annotated[bool, typer.Option("--json", help="Print JSON, for scripts.")] = False,
    embedder: Embedder = "semantic",
) -> None:
    """Show a user's memories: id, layer, topic or task, value, when, where it came from.

    The one command that prints memory contents. Buried memories are listed (and
    marked) but never found by --search, as no decision finds them.
    """
    address, (user,) = store_and(store, [user], old_store)
    layers = _layers(layer)
    bank = _bank(address, embedder)
    records = {name: bank.store.list(user, name) for name in layers}
    scores: dict[str, float] = {}
    if search is None:
        shown = [
            record
            for name in layers
            for record in sorted(records[name], key=lambda r: (r.at, r.id), reverse=True)
        ]
    else:
        searches = [
            SearchRequest(layer=name, query=search, top_k=max(1, len(records[name])))
            for name in layers
        ]
        found = sorted(bank.retrieve(user, searches), key=lambda scored: -scored.score)
        scores = {scored.record.id: scored.score for scored in found}
        shown = [scored.record for scored in found]
    changes = [c for name in layers for c in bank.history(user, name)] if history else []
    # Memory by memory, oldest first: each memory's chain of versions reads top down.
    changes.sort(key=lambda change: (change.before.id, change.at))
    if json:
        print(_json.dumps(_as_json(user, shown, scores, changes if history else None)).decode())
        return
    out = console()
    if not shown:
        what = f"found for {search!r}" if search is not None else "stored"
        print(
            f"no {'/'.join(layers) if layer else ''}{' ' if layer else ''}memories {what} "
            f"for user {user!r}"
        )
    else:
        out.print(_table(f"memories of {user}", shown, scores))
    if history:
        if changes:
            out.print(_history_table(f"history of {user}", changes))
        else:
            print(f"no history for user {user!r}")


def _state(record: MemoryRecord, now: datetime) -> str:
    if record.buried_at is not None:
        return "buried"
    if record.valid_until is not None and record.valid_until <= now:
        return "expired"
    return ""


def _subject_and_value(content: LayerContent) -> tuple[str, str]:
    if isinstance(content, PersonaMemory):
        return content.topic, content.preference
    if isinstance(content, TrajectoryMemory):
        outcome = "" if content.outcome is None else _short(content.outcome)
        return content.query, " / ".join(part for part in (outcome, content.insight) if part)
    task = "" if content.task is None else _short(content.task)
    return task, "" if content.state is None else _short(content.state)


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else _json.dumps(value).decode()
    return text if len(text) <= _WIDE else text[: _WIDE - 1] + "…"


def _origin(record: MemoryRecord) -> str:
    if record.provenance is not None:
        return record.provenance.describe()
    content = record.content  # written before provenance: what the content itself tells
    if not isinstance(content, PersonaMemory):
        return ""
    learned = [f"at {context}" for context in content.contexts[:2]]
    drawn = [f"from {len(content.sources)} memories"] if content.sources else []
    return "; ".join(_short(part) for part in [*learned, *drawn])


def _when(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M")


def _table(title: str, records: list[MemoryRecord], scores: dict[str, float]) -> Table:
    now = datetime.now(UTC)
    table = Table(title=title, title_justify="left")
    table.add_column("id", no_wrap=True, style="cyan")
    table.add_column("layer")
    if scores:
        table.add_column("score", justify="right")
    table.add_column("topic / task")
    table.add_column("value")
    table.add_column("when (UTC)", no_wrap=True)
    table.add_column("from", overflow="fold")  # a run id is cut nowhere: it is looked up
    table.add_column("state", style="yellow")
    for record in records:
        subject, value = _subject_and_value(record.content)
        # Text cells: memory contents are shown as written, never read as Rich markup.
        cells = [Text(record.id), Text(record.layer)]
        if scores:
            cells.append(Text(f"{scores[record.id]:.2f}"))
        cells += [
            Text(_short(subject)),
            Text(_short(value)),
            Text(_when(record.at)),
            Text(_origin(record)),
            Text(_state(record, now)),
        ]
        table.add_row(*cells)
    return table


def _history_table(title: str, changes: list[MemoryChange]) -> Table:
    table = Table(title=title, title_justify="left")
    columns = ("when (UTC)", "change", "id", "layer", "before", "from", "after", "by", "reason")
    for column in columns:
        folded = column in ("from", "by")  # as in the memories table: ids are never cut
        table.add_column(
            column,
            no_wrap=column in ("when (UTC)", "id"),
            overflow="fold" if folded else "ellipsis",
        )
    for change in changes:
        before = _subject_and_value(change.before.content)[1]
        after = "" if change.after is None else _subject_and_value(change.after.content)[1]
        table.add_row(
            *(
                Text(cell)
                for cell in (
                    _when(change.at),
                    change.operation,
                    change.before.id,
                    change.before.layer,
                    _short(before),
                    _origin(change.before),
                    _short(after),
                    change.provenance.describe() if change.provenance else "",
                    change.reason,
                )
            )
        )
    return table


def _record_json(record: MemoryRecord) -> dict[str, Any]:
    # The vector is noise to a person or a script reading contents; its model is kept.
    data = record.model_dump(mode="json", exclude={"embedding"})
    data["embedder"] = record.embedding.model if record.embedding else None
    return data


def _as_json(
    user: str,
    records: list[MemoryRecord],
    scores: dict[str, float],
    changes: list[MemoryChange] | None,
) -> dict[str, Any]:
    memories = [
        {**_record_json(record), **({"score": scores[record.id]} if scores else {})}
        for record in records
    ]
    data: dict[str, Any] = {"user_id": user, "memories": memories}
    if changes is not None:
        data["history"] = [
            {
                "operation": change.operation,
                "at": change.at.isoformat(),
                "reason": change.reason,
                "provenance": None
                if change.provenance is None
                else change.provenance.model_dump(mode="json"),
                "before": _record_json(change.before),
                "after": None if change.after is None else _record_json(change.after),
            }
            for change in changes
        ]
    return data


def _assignments(record: MemoryRecord, pairs: list[str]) -> dict[str, Any]:
    """``FIELD=VALUE`` pairs as new values: text for text fields, JSON for the others."""
    changes: dict[str, Any] = {}
    for pair in pairs:
        name, equals, raw = pair.partition("=")
        name = name.strip()
        if not equals or not name:
            raise CorrectionError(f"--set takes FIELD=VALUE (e.g. preference=APA), got {pair!r}")
        current = getattr(record.content, name, None)
        if current is None or isinstance(current, str):
            changes[name] = raw
            continue
        try:
            changes[name] = _json.loads(raw)
        except _json.JSONDecodeError:
            kind = "a list" if isinstance(current, list) else "JSON"
            raise CorrectionError(
                f"--set {name}=...: the {record.layer} field {name!r} takes {kind}, "
                f"e.g. {name}='{_json.dumps(current).decode()}'; got {raw!r}"
            ) from None
    return changes


@app.command("edit", rich_help_panel=PANEL, cls=StoreCommand)
def edit_command(  # noqa: PLR0917 - a command's parameters are its command line
    user: User,
    memory_id: MemoryId,
    assignments: Annotated[
        list[str],
        typer.Option(
            "--set",
            metavar="FIELD=VALUE",
            help="A new value of a content field (repeat for several); JSON for fields "
            "that are not text, e.g. aliases='[\"tone\"]'.",
            show_default=False,
        ),
    ],
    old_store: OldStore = None,
    store: StoreOption = None,
    layer: Layer = None,
    reason: Reason = "",
    embedder: Embedder = "semantic",
) -> None:
    """Correct a memory: a revision, the old version kept in its history.

    The next retrieval, and so the next decision, uses the new value.
    """
    address, (user, memory_id) = store_and(store, [user, memory_id], old_store)
    bank = _bank(address, embedder)
    record = bank.find(user, memory_id, _layer(layer))
    changes = _assignments(record, assignments)
    edited = bank.edit(
        user, memory_id, changes, layer=record.layer, reason=reason, command="autopersona edit"
    )
    fields = ", ".join(changes)
    if edited == record:
        print(f"{record.layer} memory {memory_id} already says that: unchanged")
    else:
        print(f"edited {record.layer} memory {memory_id} ({fields}); the old version is in history")


@app.command("forget", rich_help_panel=PANEL, cls=StoreCommand)
def forget_command(  # noqa: PLR0917 - a command's parameters are its command line
    user: User,
    memory_id: MemoryId,
    old_store: OldStore = None,
    store: StoreOption = None,
    layer: Layer = None,
    reason: Reason = "",
) -> None:
    """Delete a memory: never retrieved again, kept only in the change history."""
    address, (user, memory_id) = store_and(store, [user, memory_id], old_store)
    bank = MemoryBank(existing_store(address))
    gone = bank.forget(
        user, memory_id, layer=_layer(layer), reason=reason, command="autopersona forget"
    )
    print(f"forgot {gone.layer} memory {memory_id}; it is no longer retrieved")


@app.command("bury", rich_help_panel=PANEL, cls=StoreCommand)
def bury_command(  # noqa: PLR0917 - a command's parameters are its command line
    user: User,
    memory_id: MemoryId,
    old_store: OldStore = None,
    store: StoreOption = None,
    layer: Layer = None,
    reason: Reason = "",
) -> None:
    """Keep a memory but leave it out of retrieval and decisions until unburied."""
    address, (user, memory_id) = store_and(store, [user, memory_id], old_store)
    _burial(address, user, memory_id, layer, reason, bury=True)


@app.command("unbury", rich_help_panel=PANEL, cls=StoreCommand)
def unbury_command(  # noqa: PLR0917 - a command's parameters are its command line
    user: User,
    memory_id: MemoryId,
    old_store: OldStore = None,
    store: StoreOption = None,
    layer: Layer = None,
    reason: Reason = "",
) -> None:
    """Let a buried memory be retrieved and used again."""
    address, (user, memory_id) = store_and(store, [user, memory_id], old_store)
    _burial(address, user, memory_id, layer, reason, bury=False)


def _burial(
    store: str, user: str, memory_id: str, layer: str | None, reason: str, *, bury: bool
) -> None:
    bank = MemoryBank(existing_store(store))
    before = bank.find(user, memory_id, _layer(layer))
    change = bank.bury if bury else bank.unbury
    command = "autopersona bury" if bury else "autopersona unbury"
    after = change(user, memory_id, layer=before.layer, reason=reason, command=command)
    if (before.buried_at is not None) == bury:
        print(f"{after.layer} memory {memory_id} was {'already' if bury else 'not'} buried")
    elif bury:
        print(f"buried {after.layer} memory {memory_id}: kept, never retrieved until unburied")
    else:
        print(f"unburied {after.layer} memory {memory_id}: retrieved again")


@app.command("erase", rich_help_panel=PANEL, cls=StoreCommand)
def erase_command(
    user: User,
    old_store: OldStore = None,
    store: StoreOption = None,
    snapshots: Annotated[
        str | None,
        typer.Option(
            "--snapshots",
            metavar="FOLDER",
            help="The maintenance flow's snapshot folder (default: the `snapshots` setting).",
            show_default=False,
        ),
    ] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
) -> None:
    """Erase a person: their memories, history and maintenance snapshots, for good.

    What erasure cannot reach (Prefect's own result storage and server, exports,
    backups) is listed in docs/erasure.md. Erasing someone of whom nothing is stored
    is not an error (a request is retried until it succeeds): it says so and exits 0.
    """
    # Imported here: the settings bring Prefect, which the other commands do without.
    from autopersona_flows.flows.settings import load_settings  # noqa: PLC0415
    from autopersona_flows.memory.erasure import erase_user  # noqa: PLC0415

    address, (user,) = store_and(store, [user], old_store)
    target = existing_store(address)
    folder = snapshots if snapshots is not None else load_settings().snapshots_path()
    if not yes and not typer.confirm(
        f"Erase everything stored of {user!r} in {shown(address)} and {folder}? "
        "This cannot be undone"
    ):
        raise typer.Exit(1)
    report = erase_user(target, user, snapshots=folder)
    if not report.found:
        # Not an error: an erasure request is retried until it succeeds.
        print(f"nothing is stored of {user!r}: nothing to erase")
        return
    print(
        f"erased {user!r}: {report.memories} memories, {report.changes} history entries, "
        f"{len(report.snapshots)} snapshots"
    )
