"""What only the PostgreSQL store has to prove: processes, its change feed, its addresses.

The shared contract runs in tests/memory/test_conformance.py. These need the
``AUTOPERSONA_TEST_POSTGRES_DSN`` database (`.ci/postgres` starts one); each test
works in a schema of its own.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import uuid
from pathlib import Path

import numpy as np
import pytest

from autopersona_flows.cli import main
from autopersona_flows.errors import (
    MemoryStoreCorruptionError,
    MemoryStoreError,
    StoreUnavailableError,
)
from autopersona_flows.memory import (
    FunctionEmbedder,
    HashingEmbedder,
    JsonlMemoryStore,
    MemoryChange,
    MemoryRecord,
    MemoryRetriever,
    MemoryUpdater,
    PersonaMemory,
    SearchRequest,
    WorkspaceMemory,
    open_store,
)

psycopg = pytest.importorskip("psycopg", reason="the postgres extra is not installed")

from autopersona_flows.memory.postgres import PostgresMemoryStore  # noqa: E402

USER = "ada"


def run_python(code: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
    )


def test_user_ids_and_contents_postgres_text_cannot_hold_round_trip(pg_store) -> None:
    user = "ada\x00admin"  # NUL: PostgreSQL text refuses it, so ids are stored as bytes
    record = pg_store.add(user, PersonaMemory(topic="nul\x00topic", preference="a\u2028b"))

    assert pg_store.get(user, "persona", record.id) == record
    assert pg_store.list("ada", "persona") == []  # a prefix of the id is another user
    assert user in pg_store.users()


def test_writer_processes_lose_nothing_and_locked_serialises_them(postgres_schema) -> None:
    code = """
        import sys
        from autopersona_flows.memory import PersonaMemory, WorkspaceMemory
        from autopersona_flows.memory.postgres import PostgresMemoryStore

        dsn, worker = sys.argv[1], sys.argv[2]
        store = PostgresMemoryStore(dsn)
        for i in range(40):
            store.add("ada", PersonaMemory(topic=f"{worker}-{i}", preference="x"))
            with store.locked("ada", "workspace"):  # read, decide, write: one step
                (counter,) = store.list("ada", "workspace")
                count = counter.content.state["count"]
                new = WorkspaceMemory(state={"count": count + 1})
                store.update("ada", "workspace", counter.id, new)
    """
    store = PostgresMemoryStore(postgres_schema)
    store.add(USER, WorkspaceMemory(state={"count": 0}))
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code), postgres_schema, str(w)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for w in range(4)
    ]
    for worker in workers:
        _, err = worker.communicate(timeout=180)
        assert worker.returncode == 0, err

    persona = store.list(USER, "persona")
    assert len({r.id for r in persona}) == len(persona) == 160
    (counter,) = store.list(USER, "workspace")
    assert counter.content.state == {"count": 160}  # no update was lost
    assert len(store.history(USER, "workspace", counter.id)) == 160
    store.close()


def test_first_use_by_many_processes_at_once_creates_the_schema_once(postgres_schema) -> None:
    code = """
        import sys
        from autopersona_flows.memory.postgres import PostgresMemoryStore
        print(len(PostgresMemoryStore(sys.argv[1]).users()))
    """
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code), postgres_schema],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outputs = [worker.communicate(timeout=120) for worker in workers]
    assert [worker.returncode for worker in workers] == [0] * 4, outputs
    assert [out.strip() for out, _ in outputs] == ["0"] * 4


def test_the_change_feed_follows_writes_and_restarts_after_a_restore(pg_store) -> None:
    first = pg_store.add(USER, PersonaMemory(topic="tone", preference="terse"))
    start = pg_store.changes(USER, "persona")
    assert (start.full, [r.id for r in start.records]) == (True, [first.id])

    second = pg_store.add(USER, PersonaMemory(topic="length", preference="short"))
    pg_store.update(USER, "persona", first.id, PersonaMemory(topic="tone", preference="warm"))
    pg_store.delete(USER, "persona", second.id)
    step = pg_store.changes(USER, "persona", start.cursor)
    assert not step.full
    assert [r.content.preference for r in step.records] == ["warm"]
    assert step.deleted == [second.id]
    assert pg_store.changes(USER, "persona", step.cursor).records == []

    pg_store.restore(pg_store.snapshot(USER), replace=True)
    again = pg_store.changes(USER, "persona", step.cursor)
    assert again.full  # a restored bank is a new generation: indexes start over
    assert [r.id for r in again.records] == [first.id]


def test_retrieval_follows_another_workers_writes_without_re_embedding_the_bank(
    postgres_schema,
) -> None:
    hashing = HashingEmbedder()
    embedded: list[str] = []

    def counting(texts):
        embedded.extend(texts)
        return hashing.embed(texts)

    embedder = FunctionEmbedder(counting, name=hashing.name, dim=hashing.dim)
    mine, theirs = PostgresMemoryStore(postgres_schema), PostgresMemoryStore(postgres_schema)
    writer = MemoryUpdater(theirs, hashing)
    for i in range(30):
        writer.add(USER, PersonaMemory(topic=f"topic {i}", preference=f"preference {i}"))
    retriever = MemoryRetriever(mine, embedder)
    search = [SearchRequest(layer="persona", query="citation style")]
    before = retriever.retrieve(USER, search).persona
    assert "APA" not in [m.record.content.preference for m in before]

    writer.add(USER, PersonaMemory(topic="citation style", preference="APA"))
    found = retriever.retrieve(USER, search).persona

    assert [m.record.content.preference for m in found][:1] == ["APA"]  # the next call sees it
    assert embedded == ["citation style"]  # the query, once; never the bank
    mine.close()
    theirs.close()


def test_migrate_copies_jsonl_to_postgres_and_back_with_equal_fingerprints(
    tmp_path: Path, postgres_schema, run_cli
) -> None:
    source = JsonlMemoryStore(tmp_path / "jsonl")
    updater = MemoryUpdater(source, HashingEmbedder())
    for user in ("ada", "bob"):
        updater.add(user, PersonaMemory(topic="tone", preference=f"{user}'s tone"))
        updater.add(user, WorkspaceMemory(state={"open": [user, 1.5, None]}))
    fingerprints = {user: source.snapshot_fingerprint(user) for user in ("ada", "bob")}

    there = run_cli("migrate", "--from", f"jsonl:{tmp_path / 'jsonl'}", "--to", postgres_schema)
    back = run_cli("migrate", "--from", postgres_schema, "--to", str(tmp_path / "back"))

    assert there.returncode == 0, there.stderr
    assert back.returncode == 0, back.stderr
    for user, fingerprint in fingerprints.items():
        assert f"{user}: 2 memories" in there.stdout
        assert f"sha256:{fingerprint}" in there.stdout
        assert PostgresMemoryStore(postgres_schema).snapshot_fingerprint(user) == fingerprint
        assert JsonlMemoryStore(tmp_path / "back").snapshot_fingerprint(user) == fingerprint
    again = run_cli("migrate", "--from", f"jsonl:{tmp_path / 'jsonl'}", "--to", postgres_schema)
    assert again.returncode == 1
    assert "already has 2 memories" in again.stderr  # nothing overwritten without --replace


def test_addresses_open_the_right_store_and_never_show_a_password(postgres_schema) -> None:
    store = open_store(postgres_schema)
    assert isinstance(store, PostgresMemoryStore)
    store.add(USER, PersonaMemory(topic="tone", preference="terse"))  # it really connects
    assert "autopersona@" not in repr(store)
    assert "password" not in repr(store).lower()
    assert isinstance(open_store("jsonl:/tmp/somewhere"), JsonlMemoryStore)


def test_an_unreachable_database_is_a_store_error_naming_it() -> None:
    store = PostgresMemoryStore("postgresql://nobody:secret@127.0.0.1:1/none?connect_timeout=2")
    with pytest.raises(StoreUnavailableError, match=r"cannot use PostgresMemoryStore") as caught:
        store.list(USER, "persona")
    assert "secret" not in str(caught.value)


def _drop_connections(dsn: str, application: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        (dropped,) = conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE application_name = %s",
            (application,),
        ).fetchone()
    return int(dropped)


def test_a_dropped_connection_is_transient_and_the_next_call_reconnects(postgres_schema) -> None:
    name = f"autopersona-drop-{uuid.uuid4().hex[:8]}"
    store = PostgresMemoryStore(f"{postgres_schema}&application_name={name}")
    kept = store.add(USER, PersonaMemory(topic="tone", preference="terse"))
    try:
        for call in (
            lambda: store.list(USER, "persona"),
            lambda: store.add(USER, PersonaMemory(topic="seat", preference="aisle")),
            lambda: store.update(
                USER, "persona", kept.id, PersonaMemory(topic="tone", preference="brief")
            ),
        ):
            assert store.list(USER, "persona") == [kept]  # connected again
            assert _drop_connections(postgres_schema, name) == 1  # the server drops it
            with pytest.raises(StoreUnavailableError, match="is unavailable"):
                call()
        with store.locked(USER, "persona"):  # leaving a lock that died with its connection
            assert _drop_connections(postgres_schema, name) == 1
            with pytest.raises(StoreUnavailableError, match="is unavailable"):
                store.list(USER, "persona")
            # No new session inside the block: it would not hold the block's lock.
            with pytest.raises(StoreUnavailableError, match="lost the connection holding"):
                store.add(USER, PersonaMemory(topic="seat", preference="aisle"))
        # Nothing half-written: the interrupted add and update never landed.
        assert store.list(USER, "persona") == [kept]
        store.add(USER, PersonaMemory(topic="seat", preference="aisle"))
        assert len(store.list(USER, "persona")) == 2
    finally:
        store.close()


def test_embeddings_are_stored_with_the_record(pg_store) -> None:
    updater = MemoryUpdater(pg_store, HashingEmbedder())
    record = updater.add(USER, PersonaMemory(topic="tone", preference="terse"))

    stored = pg_store.get(USER, "persona", record.id)

    assert stored.embedding is not None
    np.testing.assert_array_equal(stored.embedding.array(), record.embedding.array())


def test_connections_of_ended_threads_are_closed(postgres_schema) -> None:
    name = f"autopersona-test-{uuid.uuid4().hex[:8]}"
    store = PostgresMemoryStore(f"{postgres_schema}&application_name={name}")

    def work() -> None:
        store.list(USER, "persona")

    for _ in range(3):  # as Prefect starts new task threads for each run
        threads = [threading.Thread(target=work) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    store.list(USER, "persona")  # a new connection sweeps those of ended threads

    with psycopg.connect(postgres_schema) as conn:
        (open_now,) = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (name,)
        ).fetchone()
    assert open_now <= 5  # this thread's, and at most the last round's four
    store.close()


def test_a_failed_first_setup_is_retried_on_the_next_call(postgres_dsn) -> None:
    schema = f"autopersona_late_{uuid.uuid4().hex[:8]}"
    store = PostgresMemoryStore(f"{postgres_dsn}?options=-csearch_path%3D{schema}")
    with pytest.raises(MemoryStoreError, match="cannot use PostgresMemoryStore"):
        store.list(USER, "persona")  # the schema does not exist yet
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        assert store.list(USER, "persona") == []  # same thread, set up now
    finally:
        store.close()
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


def test_bad_addresses_are_store_errors_that_never_quote_a_password() -> None:
    with pytest.raises(MemoryStoreError) as caught:
        PostgresMemoryStore("postgresql://ap:s3cr%zzet@db/memory")
    assert "s3cr" not in str(caught.value)
    assert isinstance(open_store("postgresql+psycopg://ap:s3cret@db/memory"), PostgresMemoryStore)
    assert "s3cret" not in repr(open_store("POSTGRESQL://ap:s3cret@db/memory"))
    for address in ("host=db password=s3cret dbname=memory", "s3://bucket/memory"):
        with pytest.raises(MemoryStoreError, match="unsupported store address"):
            open_store(address)
    with pytest.raises(MemoryStoreError, match="search must be 'memory'"):
        open_store("postgresql://ap:s3cret@db/memory?search=fulltext")


def test_an_address_turns_on_searching_inside_postgresql_and_keeps_libpq_parameters() -> None:
    # Settings and the CLI give a store by its address: search=database must be sayable there.
    store = open_store("postgresql://ap:s3cret@db/memory?sslmode=disable&search=database")
    assert isinstance(store, PostgresMemoryStore)
    assert store.search == "database"
    assert store._dsn == "postgresql://ap:s3cret@db/memory?sslmode=disable"  # libpq's own
    assert open_store("postgresql://ap:s3cret@db/memory").search == "memory"


def test_rows_of_another_layer_and_bad_rows_are_corruption_not_validation_errors(
    pg_store, postgres_schema, capsys
) -> None:
    tone = pg_store.add(USER, PersonaMemory(topic="tone", preference="terse"))
    pg_store.update(USER, "persona", tone.id, PersonaMemory(topic="tone", preference="warm"))
    stray = MemoryRecord.of(WorkspaceMemory(state={"file": "notes.md"}))
    with psycopg.connect(postgres_schema, autocommit=True) as conn:
        conn.execute(  # a workspace record filed under persona
            "UPDATE autopersona_memories SET record = %s WHERE id = %s",
            (stray.model_dump_json().encode(), tone.id),
        )
    for call in (
        lambda: pg_store.list(USER, "persona"),
        lambda: pg_store.get(USER, "persona", tone.id),
        lambda: pg_store.snapshot(USER),
    ):
        with pytest.raises(MemoryStoreCorruptionError, match="a workspace record in the persona"):
            call()
    assert main(["verify", postgres_schema]) == 1
    err = capsys.readouterr().err
    assert "a workspace record in the persona bank" in err
    assert "fix or delete the row" in err

    change = MemoryChange(operation="delete", at=stray.updated_at, before=stray)
    with psycopg.connect(postgres_schema, autocommit=True) as conn:
        conn.execute("DELETE FROM autopersona_memories")
        conn.execute(
            "UPDATE autopersona_history SET change = %s", (change.model_dump_json().encode(),)
        )
    with pytest.raises(MemoryStoreCorruptionError, match="a change of a workspace record"):
        pg_store.history(USER, "persona")

    with psycopg.connect(postgres_schema, autocommit=True) as conn:
        conn.execute("UPDATE autopersona_banks SET user_id = %s", (b"\xffada",))
    with pytest.raises(MemoryStoreCorruptionError, match="is not UTF-8"):
        pg_store.users()
    assert main(["users", postgres_schema]) == 1
    assert capsys.readouterr().err.startswith("error: ")


def _rows(dsn: str) -> list[tuple[object, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        memories = conn.execute(
            "SELECT layer, id, record FROM autopersona_memories ORDER BY layer, id"
        ).fetchall()
        history = conn.execute("SELECT layer, seq, change FROM autopersona_history").fetchall()
    return [*memories, *history]


@pytest.mark.parametrize(
    "damage",
    [b"{not json", b'{"layer": "persona"}'],
    ids=["torn bytes", "a record missing its fields"],
)
def test_a_bank_with_a_row_written_elsewhere_and_corrupt_refuses_every_write(
    pg_store, postgres_schema, damage: bytes
) -> None:
    tone = pg_store.add(USER, PersonaMemory(topic="tone", preference="terse"))
    diet = pg_store.add(USER, PersonaMemory(topic="diet", preference="vegan"))
    with psycopg.connect(postgres_schema, autocommit=True) as conn:  # not through the store
        conn.execute("UPDATE autopersona_memories SET record = %s WHERE id = %s", (damage, tone.id))
    before = _rows(postgres_schema)

    for write in (
        lambda: pg_store.add(USER, PersonaMemory(topic="seat", preference="aisle")),
        lambda: pg_store.add_many(USER, "persona", [PersonaMemory(topic="a", preference="b")]),
        lambda: pg_store.update(USER, "persona", diet.id, PersonaMemory(topic="d", preference="x")),
        lambda: pg_store.delete(USER, "persona", diet.id),
    ):
        with pytest.raises(MemoryStoreCorruptionError, match=f"persona memory {tone.id!r}") as info:
            write()
        assert "fix or delete the row" in str(info.value)
    assert _rows(postgres_schema) == before  # nothing written

    # Other banks and users are unaffected; once the row is repaired, writes go on.
    pg_store.add(USER, WorkspaceMemory(state={"file": "notes.md"}))
    pg_store.add("bob", PersonaMemory(topic="tone", preference="warm"))
    with psycopg.connect(postgres_schema, autocommit=True) as conn:
        conn.execute("DELETE FROM autopersona_memories WHERE id = %s", (tone.id,))
    pg_store.add(USER, PersonaMemory(topic="seat", preference="aisle"))
    assert [r.content.topic for r in pg_store.list(USER, "persona")] == ["diet", "seat"]


def test_a_sound_row_written_elsewhere_is_checked_once_and_kept(pg_store, postgres_schema) -> None:
    pg_store.add(USER, PersonaMemory(topic="tone", preference="terse"))
    outside = MemoryRecord.of(PersonaMemory(topic="diet", preference="vegan"))
    with psycopg.connect(postgres_schema, autocommit=True) as conn:  # e.g. a migration script
        conn.execute(
            "INSERT INTO autopersona_memories (user_id, layer, id, position, seq, record)"
            " VALUES (%s, 'persona', %s, 99, 99, %s)",
            (USER.encode(), outside.id, outside.model_dump_json().encode()),
        )
    pg_store.add(USER, PersonaMemory(topic="seat", preference="aisle"))
    topics = sorted(r.content.topic for r in pg_store.list(USER, "persona"))
    assert topics == ["diet", "seat", "tone"]
