"""Erasing a person leaves no byte of them where the store or the maintenance flow wrote.

Distinctive strings go into every layer of one user, through several updates and a
delete (so the history holds them), a kept ``.corrupt`` file and a nightly snapshot;
after `erase_user`, every file (content and name) under the store and snapshot folders
and every PostgreSQL table row is scanned for them.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from autopersona_flows.agent import PersonaAgent
from autopersona_flows.flows import memory_maintenance, persona_runtime
from autopersona_flows.memory import (
    JsonlMemoryStore,
    MemoryRetriever,
    MemorySnapshot,
    MemoryStore,
    PersonaMemory,
    SearchRequest,
    TrajectoryMemory,
    WorkspaceMemory,
    erase_user,
)
from autopersona_flows.memory.snapshots import read_snapshot
from autopersona_flows.memory.users import user_key

pytestmark = pytest.mark.usefixtures("prefect_harness")

ADA, BOB = "ada-qx7erase", "bob-kw3keep"  # the ids are distinctive too: folder names hold them


def marks(user: str) -> list[str]:
    return [user, *(f"{user}-{what}" for what in ("tone", "warm", "terse", "query", "draft"))]


def fill(store: MemoryStore, user: str) -> None:
    """Every layer, several updates and a delete, each with the user's distinctive strings."""
    tone = store.add(user, PersonaMemory(topic=f"{user}-tone", preference=f"{user}-terse"))
    for i in range(3):
        store.update(
            user, "persona", tone.id, PersonaMemory(topic=f"{user}-tone", preference=f"v{i}")
        )
    store.update(user, "persona", tone.id, PersonaMemory(topic="tone", preference=f"{user}-warm"))
    store.add(user, TrajectoryMemory(query=f"{user}-query", trace=[f"{user}-query"]))
    draft = store.add(user, WorkspaceMemory(task="paper", state={"draft": f"{user}-draft"}))
    store.delete(user, "workspace", draft.id, reason=f"{user}-draft")
    store.add(user, WorkspaceMemory(task="paper", state={"draft": f"{user}-draft v2"}))


def file_hits(folder: Path, strings: list[str]) -> list[str]:
    """Every file or folder under ``folder`` whose name or bytes hold one of ``strings``."""
    hits = []
    for path in [folder, *folder.rglob("*")]:
        data = path.name.encode()
        if path.is_file() and not path.is_symlink():
            data += path.read_bytes()
        hits += [f"{path}: {s}" for s in strings if s.encode() in data]
    return hits


def row_hits(dsn: str, strings: list[str]) -> list[str]:
    """Every row of every table of the schema holding one of ``strings``, bytes or text."""
    import psycopg

    hits = []
    with psycopg.connect(dsn) as conn:
        tables = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
        ).fetchall()
        assert {t for (t,) in tables} >= {"autopersona_memories", "autopersona_history"}
        for (table,) in tables:
            # The names come from the catalogue, not from input.
            for row in conn.execute(f'SELECT * FROM "{table}"'):  # noqa: S608
                data = b"".join(
                    bytes(v) if isinstance(v, bytes | memoryview) else str(v).encode() for v in row
                )
                hits += [f"{table}: {s}" for s in strings if s.encode() in data]
    return hits


@pytest.fixture(params=["jsonl", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[MemoryStore, Any]]:
    """A store, and what scans it: its folder, or its database address."""
    if request.param == "jsonl":
        yield JsonlMemoryStore(tmp_path / "store"), tmp_path / "store"
        return
    from autopersona_flows.memory.postgres import PostgresMemoryStore

    dsn = request.getfixturevalue("postgres_schema")
    with PostgresMemoryStore(dsn) as store:
        yield store, dsn


def scan(where: Any, snapshots: Path, strings: list[str]) -> list[str]:
    found = file_hits(snapshots, strings)
    return found + (
        file_hits(where, strings) if isinstance(where, Path) else row_hits(where, strings)
    )


def test_no_byte_of_an_erased_user_is_left_and_others_stay(backend, tmp_path: Path) -> None:
    store, where = backend
    snapshots = tmp_path / "snapshots"
    for user in (ADA, BOB):
        fill(store, user)
    with persona_runtime(PersonaAgent(MemoryRetriever(store))):
        memory_maintenance(snapshot_dir=str(snapshots))
    assert scan(where, snapshots, marks(ADA))  # the strings are there to be found
    bob = store.snapshot(BOB)
    bob_history = store.history(BOB, "persona")

    report = erase_user(store, ADA, snapshots=snapshots)

    assert (report.found, report.memories, report.changes) == (True, 3, 5)
    [snapshot] = report.snapshots
    assert Path(snapshot).parent.name == user_key(ADA)
    assert scan(where, snapshots, marks(ADA)) == []
    assert len(scan(where, snapshots, marks(BOB))) >= len(marks(BOB))
    assert (store.users(), store.snapshot(BOB)) == ([BOB], bob)
    assert store.history(BOB, "persona") == bob_history
    [bob_file] = (snapshots / user_key(BOB)).iterdir()
    assert read_snapshot(bob_file) == bob
    again = erase_user(store, ADA, snapshots=snapshots)
    assert (again.found, again.snapshots) == (False, [])


def test_jsonl_leaves_nothing_in_kept_files_or_views(tmp_path: Path) -> None:
    """A corrupt bank set aside, a temporary file, warm views and an index: all gone."""
    root = tmp_path / "store"
    store, other = JsonlMemoryStore(root), JsonlMemoryStore(root)
    fill(store, ADA)
    fill(store, BOB)
    folder = root / "users" / user_key(ADA)
    with (folder / "persona.jsonl").open("ab") as bank:
        bank.write(f'{{"{ADA}-tone": "not a record"}}\n'.encode())
    store.restore(MemorySnapshot.of(ADA, {}), replace=True)  # keeps the corrupt bank
    assert [p for p in folder.iterdir() if p.suffix == ".corrupt"]
    (folder / ".persona.jsonl.x.tmp").write_text(f"{ADA}-draft")  # a writer killed mid-rewrite
    fill(store, ADA)
    retriever = MemoryRetriever(store)
    search = [SearchRequest(layer="persona", query="tone")]
    assert retriever.retrieve(ADA, search).persona  # an index of ada, warm
    assert other.list(ADA, "persona")  # a second object's warm view

    assert store.erase(ADA).found

    assert file_hits(root, marks(ADA)) == []
    assert not retriever.retrieve(ADA, search).persona
    assert other.list(ADA, "persona") == other.history(ADA, "persona") == []
    assert other.users() == [BOB]


def test_an_erase_cut_short_is_finished_by_the_next(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = JsonlMemoryStore(root)
    fill(store, ADA)
    users = root / "users"
    # Where a crash after the first step leaves it: renamed away, not yet removed.
    (users / user_key(ADA)).rename(users / f".{user_key(ADA)}.erasing")
    assert store.users() == []
    assert file_hits(root, marks(ADA))

    assert store.erase(ADA).found

    assert file_hits(root, marks(ADA)) == []


def test_links_are_removed_never_followed(tmp_path: Path) -> None:
    root, outside = tmp_path / "store", tmp_path / "outside"
    store = JsonlMemoryStore(root)
    fill(store, ADA)
    outside.mkdir()
    (outside / "keep.txt").write_text("not the store's")
    folder = root / "users" / user_key(ADA)
    (folder / "elsewhere").symlink_to(outside)
    (folder / "persona.lock").unlink()
    (folder / "persona.lock").symlink_to(outside / "keep.txt")  # a lock leading out

    assert store.erase(ADA).found

    assert not os.path.lexists(folder)
    assert (outside / "keep.txt").read_text() == "not the store's"


def test_a_writer_waiting_through_an_erase_locks_the_new_bank(tmp_path: Path) -> None:
    """A writer that waited on an erased bank's lock still excludes the writers after it."""
    root = tmp_path / "store"
    store, waiting, later = (JsonlMemoryStore(root) for _ in range(3))
    fill(store, ADA)
    inside, release = threading.Event(), threading.Event()

    def wait_then_hold() -> None:
        with waiting.locked(ADA, "persona"):  # waits for the erase below
            inside.set()
            release.wait(60)

    with store.locked(ADA, "persona"):
        holder = threading.Thread(target=wait_then_hold, daemon=True)
        holder.start()
        time.sleep(0.3)  # the holder now waits on the old lock file
        store.erase(ADA)
    assert inside.wait(60)
    writer = threading.Thread(
        target=lambda: later.add(ADA, PersonaMemory(topic="t", preference="p"))
    )
    writer.start()
    writer.join(0.5)
    try:
        assert writer.is_alive(), "a writer went ahead while another held the bank"
    finally:
        release.set()
        holder.join(60)
        writer.join(60)
    assert len(later.list(ADA, "persona")) == 1
