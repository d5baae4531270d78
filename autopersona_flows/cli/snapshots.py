"""Commands that move and check whole stores: export, import, migrate, users, verify."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from autopersona_flows.cli.root import (
    STORE_HELP,
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
from autopersona_flows.errors import MemoriesExistError, MemoryStoreError, SnapshotError
from autopersona_flows.memory.jsonl import JsonlMemoryStore
from autopersona_flows.memory.records import LAYERS
from autopersona_flows.memory.snapshots import MemorySnapshot, read_snapshot, write_snapshot
from autopersona_flows.memory.stores import migrate, open_store

__all__ = ["export_snapshot", "import_snapshot"]

PANEL = "Stores"

User = Annotated[
    str, typer.Argument(metavar="USER", help="The user id, exactly as stored.", show_default=False)
]


def counts(snapshot: MemorySnapshot) -> str:
    """``"N memories (trajectory a, workspace b, persona c)"``."""
    total = sum(snapshot.counts.values())
    layers = ", ".join(f"{layer} {count}" for layer, count in snapshot.counts.items())
    return f"{total} memories ({layers})"


def export_snapshot(store_root: str | Path, user_id: str, dest: str | Path) -> MemorySnapshot:
    """Write one user's snapshot from a store to ``dest``, atomically.

    Nothing is written if the user's bank is corrupt, so an earlier export at
    ``dest`` stays as it was. A user without memories gives an explicitly empty
    snapshot.

    Raises:
        SnapshotError: If ``dest`` lies inside the store.
        MemoryStoreCorruptionError: If a bank of the user is malformed.
    """
    store = existing_store(store_root)
    dest = Path(dest)
    if isinstance(store, JsonlMemoryStore) and dest.resolve().is_relative_to(store.root.resolve()):
        raise SnapshotError(
            f"refusing to export into the store itself ({dest}); choose a path outside {store.root}"
        )
    snapshot = store.snapshot(user_id)
    write_snapshot(snapshot, dest)
    return snapshot


def import_snapshot(
    snapshot_path: str | Path, store_root: str | Path, *, replace: bool = False
) -> MemorySnapshot:
    """Restore a snapshot file into a store (a JSONL folder is created if missing).

    Raises:
        SnapshotError: If the file is not a valid snapshot, or the user already has
            memories and ``replace`` is false.
    """
    snapshot = read_snapshot(snapshot_path)
    store = open_store(store_root)
    store.restore(snapshot, replace=replace)
    restored = store.snapshot_fingerprint(snapshot.user_id)
    if restored != snapshot.fingerprint:
        raise SnapshotError(
            f"restored data has fingerprint {restored}, expected {snapshot.fingerprint}"
        )
    return snapshot


@app.command("export", rich_help_panel=PANEL, cls=StoreCommand)
def export_command(
    user: User,
    dest: Annotated[
        str,
        typer.Argument(
            metavar="DEST",
            help="The snapshot file to write (outside the store).",
            show_default=False,
        ),
    ],
    old_store: OldStore = None,
    store: StoreOption = None,
) -> None:
    """Write one user's memories to a snapshot file.

    The file is written atomically and checked by fingerprint; a corrupt bank writes
    nothing.
    """
    address, (user, dest) = store_and(store, [user, dest], old_store)
    snapshot = export_snapshot(address, user, dest)
    note = " (the user has no memories: the snapshot is empty)" if snapshot.is_empty else ""
    print(f"exported {counts(snapshot)} to {dest}{note}")
    print(f"fingerprint sha256:{snapshot.fingerprint}")


@app.command("import", rich_help_panel=PANEL, cls=StoreCommand)
def import_command(
    snapshot: Annotated[
        str,
        typer.Argument(
            metavar="SNAPSHOT", help="A file written by `autopersona export`.", show_default=False
        ),
    ],
    old_store: OldStore = None,  # here the store came last: `import SNAPSHOT STORE`
    store: StoreOption = None,
    replace: Annotated[
        bool, typer.Option("--replace", help="Overwrite the user's existing memories.")
    ] = False,
) -> None:
    """Restore a snapshot file into a store (a JSONL folder is created if missing)."""
    address = store_address(store, old_store)
    try:
        restored = import_snapshot(snapshot, address, replace=replace)
    except MemoriesExistError as exc:
        raise SnapshotError(
            f"user {exc.user_id!r} already has {exc.count} memories in {shown(address)}: pass "
            "--replace to overwrite them"
        ) from None
    print(f"imported {counts(restored)} into {shown(address)}")
    print(f"fingerprint sha256:{restored.fingerprint}")


@app.command("migrate", rich_help_panel=PANEL)
def migrate_command(
    source: Annotated[str, typer.Option("--from", help=STORE_HELP, show_default=False)],
    dest: Annotated[str, typer.Option("--to", help=STORE_HELP + " (created)", show_default=False)],
    user: Annotated[
        str | None, typer.Option("--user", help="Only this user (default: every user).")
    ] = None,
    replace: Annotated[
        bool,
        typer.Option("--replace", help="Overwrite users who already have memories there."),
    ] = False,
) -> None:
    """Copy every user's memories to another store, checked by fingerprint."""
    origin = existing_store(source)
    target = open_store(dest)
    users = [user] if user is not None else origin.users()
    done: list[str] = []
    try:
        with Steps("migrating", len(users), "users") as steps:
            for user_id in steps.over(users):
                (copied,) = migrate(origin, target, users=[user_id], replace=replace)
                done.append(f"{user_id}: {counts(copied)}, fingerprint sha256:{copied.fingerprint}")
    finally:  # after the bar, which holds the terminal; a failure still lists what was copied
        for line in done:
            print(line)


@app.command("users", rich_help_panel=PANEL, cls=StoreCommand)
def users_command(old_store: OldStore = None, store: StoreOption = None) -> None:
    """List the users of a store, one a line."""
    for user_id in existing_store(store_address(store, old_store)).users():
        print(user_id)


@app.command("verify", rich_help_panel=PANEL, cls=StoreCommand)
def verify_command(old_store: OldStore = None, store: StoreOption = None) -> None:
    """Read every bank and history; fail on the first corrupt one."""
    opened = existing_store(store_address(store, old_store))
    # Only JSONL stores have folders that other programs can leave things in.
    strays = opened.strays() if isinstance(opened, JsonlMemoryStore) else []
    for stray in strays:
        print(
            f"{'damage' if stray.damage else 'warning'}: {stray.path}: {stray.reason}",
            file=sys.stderr,
        )
    damaged = [stray.path for stray in strays if stray.damage]
    users = opened.users()
    with Steps("reading banks", len(users), "users") as steps:
        for user_id in steps.over(users):
            opened.snapshot(user_id)  # parses every line of every bank
            for layer in LAYERS:
                opened.history(user_id, layer, "")  # and of every change history
    if damaged:
        names = ", ".join(path.name for path in damaged)
        raise MemoryStoreError(f"damage in {damaged[0].parent}: {names} (see above)")
    print(f"ok: {len(users)} users, every bank and history readable")
