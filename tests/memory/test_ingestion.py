"""Ingestion of completed tasks, the Persona2Web adapter, reindexing, and their commands."""

import inspect
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import pytest

from autopersona_flows import (
    JsonlMemoryStore,
    MemoryBank,
    PersonaMemory,
    RawTaskRecord,
    TrajectoryMemory,
    WorkspaceMemory,
)
from autopersona_flows.agent import NodeInfo, PersonaRequest, query_to_persona_request
from autopersona_flows.errors import EmbeddingMismatchError, IngestionError
from autopersona_flows.memory import (
    HashingEmbedder,
    MemoryRetriever,
    MemoryUpdater,
    SearchRequest,
    ingest_task_history,
)
from autopersona_flows.memory.chatlog import ChatMessage
from autopersona_flows.memory.encoders import shared_encoder
from autopersona_flows.memory.ingestion import (
    IngestionResult,
    read_task_records,
    refine_persona,
    refine_trajectory,
    refine_workspace,
)
from autopersona_flows.memory.persona2web import (
    Persona2WebCase,
    history_to_raw_tasks,
    load_persona2web,
)
from autopersona_flows.memory.records import LAYERS
from autopersona_flows.memory.reindex import reindex_user
from autopersona_flows.memory.text import memory_text

PRIVATE_TEXT = "my bank PIN is 4321"

REINDEX_BUG = (
    "reindex_user keys its re-embedded records by (layer, id) but looks them up by id, "
    "so nothing is written and it reports the same count forever"
)


def task(user: str = "ada", **fields: object) -> RawTaskRecord:
    """A task touching all three layers; ``fields`` override any of them."""
    data: dict[str, object] = {
        "user_id": user,
        "query": "book a table for two in Lisbon",
        "trace": ["search restaurants", {"click": "Taberna"}, "confirm"],
        "outcome": {"booked": True, "time": "20:00"},
        "insight": "the user books late dinners",
        "task": {"site": "opentable", "id": 17},
        "interaction": [{"type": "click", "target": "#book"}],
        "state": {"reservations": 1},
        "persona": [
            {"topic": "cuisine", "preference": "Portuguese seafood", "strategy": "filter first"},
            {"topic": "dinner time", "preference": "after eight", "strategy": ""},
        ],
    }
    data.update(fields)
    return RawTaskRecord.model_validate(data)


def contents(store: JsonlMemoryStore, user: str = "ada") -> dict[str, list[object]]:
    return {layer: [r.content for r in store.list(user, layer)] for layer in LAYERS}


def assert_embedded_by(store: JsonlMemoryStore, embedder: HashingEmbedder, user: str) -> None:
    for layer in LAYERS:
        for record in store.list(user, layer):
            assert record.embedding is not None, record
            assert (record.embedding.model, record.embedding.dim) == (embedder.name, embedder.dim)
            expected = embedder.embed([memory_text(record.content)])[0]
            assert record.embedding.array().tolist() == pytest.approx(expected.tolist())


# --- ingest_task_history ------------------------------------------------------------------------


def test_ingestion_fills_all_three_layers(store: JsonlMemoryStore) -> None:
    embedder = HashingEmbedder(dim=64)  # not the default: the updater's embedder must be used
    updater = MemoryUpdater(store, embedder)
    record = task()

    result = ingest_task_history(store, updater, record)

    assert isinstance(result, IngestionResult)
    assert result.user_id == "ada"
    assert [(d.operation, d.record and d.record.layer) for d in result.operations] == [
        ("add", "trajectory"),
        ("add", "workspace"),
        ("add", "persona"),
        ("add", "persona"),
    ]
    assert result.counts() == {"trajectory:add": 1, "workspace:add": 1, "persona:add": 2}
    assert contents(store) == {
        "trajectory": [
            TrajectoryMemory(
                query=record.query,
                trace=record.trace,
                outcome=record.outcome,
                insight=record.insight,
            )
        ],
        "workspace": [
            WorkspaceMemory(task=record.task, interaction=record.interaction, state=record.state)
        ],
        "persona": list(record.persona),
    }
    # Each decision's record is the memory as stored.
    stored = {r.id: r for layer in LAYERS for r in store.list("ada", layer)}
    assert {d.record.id: d.record for d in result.operations if d.record} == stored
    assert_embedded_by(store, embedder, "ada")
    assert store.users() == ["ada"]


def test_a_task_without_workspace_fields_stores_no_workspace_memory(
    store: JsonlMemoryStore,
) -> None:
    updater = MemoryUpdater(store)
    result = ingest_task_history(
        store, updater, task(task=None, interaction=[], state=None, persona=[])
    )
    assert result.counts() == {"trajectory:add": 1}
    assert store.list("ada", "workspace") == []
    assert store.list("ada", "persona") == []
    assert len(store.list("ada", "trajectory")) == 1


@pytest.mark.parametrize(
    "fields",
    [{"state": 0}, {"state": False}, {"state": {}}, {"task": ""}, {"interaction": [None]}],
)
def test_falsy_but_present_workspace_values_are_kept(
    store: JsonlMemoryStore, fields: dict[str, object]
) -> None:
    expected = {"task": None, "interaction": [], "state": None, **fields}
    ingest_task_history(store, MemoryUpdater(store), task(persona=[], **expected))
    (workspace,) = store.list("ada", "workspace")
    assert workspace.content.model_dump() == expected


def test_ingesting_the_same_task_twice_keeps_both_trajectories_only(
    store: JsonlMemoryStore,
) -> None:
    updater = MemoryUpdater(store)
    first = ingest_task_history(store, updater, task())
    second = ingest_task_history(store, updater, task())

    assert second.counts() == {"trajectory:add": 1, "workspace:noop": 1, "persona:noop": 2}
    # A noop points at the memory already holding the information.
    assert [d.record.id for d in second.operations[1:] if d.record] == [
        d.record.id for d in first.operations[1:] if d.record
    ]
    trajectories = store.list("ada", "trajectory")
    assert len(trajectories) == 2
    assert trajectories[0].id != trajectories[1].id
    assert trajectories[0].content == trajectories[1].content
    assert len(store.list("ada", "workspace")) == 1
    assert len(store.list("ada", "persona")) == 2


def test_a_changed_preference_updates_the_memory_and_keeps_the_old_one(
    store: JsonlMemoryStore,
) -> None:
    embedder = HashingEmbedder(dim=64)
    updater = MemoryUpdater(store, embedder)
    ingest_task_history(store, updater, task())
    (old,) = [r for r in store.list("ada", "persona") if r.content.topic == "dinner time"]

    changed = PersonaMemory(topic="Dinner  Time", preference="before seven", strategy="early")
    lunch = task(
        query="book lunch", task=None, interaction=[], state=None, persona=[changed.model_dump()]
    )
    result = ingest_task_history(store, updater, lunch)

    assert result.counts() == {"trajectory:add": 1, "persona:update": 1}
    decision = result.operations[1]
    assert (decision.target_id, decision.record.id) == (old.id, old.id)
    current = store.get("ada", "persona", old.id)
    assert current.content == changed
    assert current.created_at == old.created_at
    assert current.updated_at >= old.updated_at
    (change,) = store.history("ada", "persona", old.id)
    assert change.operation == "update"
    assert change.before == old
    assert change.after == current
    assert len(store.list("ada", "persona")) == 2
    assert_embedded_by(store, embedder, "ada")  # the new content was re-embedded


def test_ingestion_refuses_an_updater_of_another_store(
    store: JsonlMemoryStore, tmp_path: Path
) -> None:
    other = JsonlMemoryStore(tmp_path / "other")
    with pytest.raises(ValueError, match="another store"):
        ingest_task_history(store, MemoryUpdater(other), task())
    assert store.users() == []
    assert other.users() == []


def test_users_are_kept_apart(store: JsonlMemoryStore) -> None:
    updater = MemoryUpdater(store)
    ingest_task_history(store, updater, task("ada"))
    result = ingest_task_history(store, updater, task("bob"))
    # bob's identical preferences are new to bob, whatever ada's bank holds
    assert result.counts() == {"trajectory:add": 1, "workspace:add": 1, "persona:add": 2}
    assert store.users() == ["ada", "bob"]
    assert contents(store, "ada") == contents(store, "bob")


# --- refine_* ------------------------------------------------------------------------------------


def test_refine_functions_map_fields_exactly() -> None:
    record = task()
    assert refine_trajectory(record) == TrajectoryMemory(
        query="book a table for two in Lisbon",
        trace=["search restaurants", {"click": "Taberna"}, "confirm"],
        outcome={"booked": True, "time": "20:00"},
        insight="the user books late dinners",
    )
    assert refine_workspace(record) == WorkspaceMemory(
        task={"site": "opentable", "id": 17},
        interaction=[{"type": "click", "target": "#book"}],
        state={"reservations": 1},
    )
    assert refine_persona(record) == [
        PersonaMemory(topic="cuisine", preference="Portuguese seafood", strategy="filter first"),
        PersonaMemory(topic="dinner time", preference="after eight", strategy=""),
    ]


def test_refine_functions_do_not_coerce() -> None:
    record = RawTaskRecord(user_id="ada", query="q", outcome=None, state=None, task={"x": None})
    trajectory = refine_trajectory(record)
    assert trajectory.outcome is None
    assert trajectory.trace == []
    assert trajectory.insight == ""
    workspace = refine_workspace(record)
    assert workspace is not None
    assert workspace.state is None
    assert workspace.task == {"x": None}
    assert workspace.interaction == []
    assert refine_persona(record) == []

    typed = RawTaskRecord(user_id="ada", query="q", outcome=0, trace=[1, "1", None, 1.5])
    assert refine_trajectory(typed).outcome == 0
    assert type(refine_trajectory(typed).outcome) is int
    assert refine_trajectory(typed).trace == [1, "1", None, 1.5]
    assert refine_workspace(RawTaskRecord(user_id="ada", query="q")) is None


# --- Persona2Web ---------------------------------------------------------------------------------


def case(user: str = "ada", **fields: object) -> dict[str, object]:
    data: dict[str, object] = {
        "user_id": user,
        "query": "find me a flight to Porto",
        "task": {"site": "skyscanner"},
        "history": [
            {
                "query": "book a hotel in Porto",
                "events": ["open booking.com", "filter: 4 stars"],
                "result": "booked",
                "insight": "likes 4-star hotels",
                "task": {"site": "booking.com"},
                "state": {"cart": []},
                "persona": [{"topic": "hotel class", "preference": "4 stars"}],
                "rating": 5,  # unknown to the adapter
            },
            {
                "query": "rent a car",
                "trace": ["open sixt"],
                "outcome": {"rented": "compact"},
                "interaction": [{"click": "rent"}],
                "events": ["ignored: trace and interaction are explicit"],
                "result": "ignored: outcome is explicit",
            },
        ],
        "source": "persona2web-v1",  # unknown to the adapter
    }
    data.update(fields)
    return data


def write(path: Path, data: object) -> Path:
    path.write_bytes(orjson.dumps(data))
    return path


def write_jsonl(path: Path, cases: list[object]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(c) + b"\n" for c in cases))
    return path


def check_case(loaded: Persona2WebCase, user: str = "ada") -> None:
    assert loaded.user_id == user
    assert loaded.query == "find me a flight to Porto"
    assert loaded.task == {"site": "skyscanner"}
    hotel, car = loaded.history
    assert hotel == RawTaskRecord(
        user_id=user,
        query="book a hotel in Porto",
        trace=["open booking.com", "filter: 4 stars"],
        outcome="booked",
        insight="likes 4-star hotels",
        task={"site": "booking.com"},
        interaction=["open booking.com", "filter: 4 stars"],
        state={"cart": []},
        persona=[PersonaMemory(topic="hotel class", preference="4 stars")],
    )
    assert car == RawTaskRecord(
        user_id=user,
        query="rent a car",
        trace=["open sixt"],
        outcome={"rented": "compact"},
        interaction=[{"click": "rent"}],
    )


def test_load_a_json_list_of_cases(tmp_path: Path) -> None:
    loaded = load_persona2web(write(tmp_path / "cases.json", [case("ada"), case("bob")]))
    assert [c.user_id for c in loaded] == ["ada", "bob"]
    check_case(loaded[0], "ada")
    check_case(loaded[1], "bob")


def test_load_a_single_json_case(tmp_path: Path) -> None:
    (loaded,) = load_persona2web(str(write(tmp_path / "case.json", case())))
    check_case(loaded)


def test_load_jsonl_cases_skipping_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "cases.jsonl"
    path.write_bytes(orjson.dumps(case("ada")) + b"\n\n  \n" + orjson.dumps(case("bob")))
    loaded = load_persona2web(path)
    assert [c.user_id for c in loaded] == ["ada", "bob"]
    check_case(loaded[1], "bob")


def test_explicit_null_fields_win_over_fallbacks(tmp_path: Path) -> None:
    item = {"query": "q", "outcome": None, "result": "r", "trace": [], "events": ["e"]}
    (loaded,) = load_persona2web(write(tmp_path / "c.json", case(history=[item])))
    (record,) = loaded.history
    assert record.outcome is None
    assert record.trace == []
    assert record.interaction == ["e"]


def test_a_case_without_history_or_task(tmp_path: Path) -> None:
    (loaded,) = load_persona2web(write(tmp_path / "c.json", {"user_id": "ada", "query": "q"}))
    assert loaded.history == []
    assert loaded.task is None
    assert history_to_raw_tasks(loaded) == []


def test_history_to_raw_tasks_and_query_to_persona_request(tmp_path: Path) -> None:
    (loaded,) = load_persona2web(write(tmp_path / "c.json", case("bob")))
    records = history_to_raw_tasks(loaded)
    assert all(isinstance(r, RawTaskRecord) for r in records)
    assert [r.user_id for r in records] == ["bob", "bob"]
    assert [r.query for r in records] == ["book a hotel in Porto", "rent a car"]
    request = query_to_persona_request(loaded)
    assert request == PersonaRequest(
        user_id="bob",
        query="find me a flight to Porto",
        node=NodeInfo(id="task", instruction="site skyscanner"),
    )


def bad_history(**item: object) -> dict[str, object]:
    return case(history=[{"query": "ok"}, {"query": "q", **item}])


@pytest.mark.parametrize(
    ("data", "where", "fragments"),
    [
        (
            case(history=[{"query": "q", "persona": [{"topic": "tone"}]}]),
            "case 0",
            ["history.0.persona.0.preference"],
        ),
        (bad_history(trace="click, type"), "case 0", ["history.1.trace", "valid list"]),
        (bad_history(events="click"), "case 0", ["history.1.trace", "history.1.interaction"]),
        (bad_history(query=None), "case 0", ["history.1.query"]),
        (case(history={"query": "q"}), "case 0", ["history must be a list"]),
        (case(history=["q"]), "case 0", ["history.0 must be an object"]),
        (case(user_id=None), "case 0", ["user_id"]),
        (case(query=7), "case 0", ["query"]),
        ([case(), case(), 3], "case 2", ["a case must be an object"]),
        ([case(), case(query=None)], "case 1", ["query"]),
    ],
)
def test_malformed_json_cases_name_file_case_and_field(
    tmp_path: Path, data: object, where: str, fragments: list[str]
) -> None:
    path = write(tmp_path / "bad.json", data)
    with pytest.raises(IngestionError) as caught:
        load_persona2web(path)
    message = str(caught.value)
    assert f"{path} ({where})" in message
    for fragment in fragments:
        assert fragment in message


def test_a_string_trace_is_never_split_into_characters(tmp_path: Path) -> None:
    with pytest.raises(IngestionError, match=r"history\.0\.trace"):
        load_persona2web(write(tmp_path / "c.json", case(history=[{"query": "q", "trace": "ab"}])))
    with pytest.raises(IngestionError, match=r"history\.0\.interaction"):
        load_persona2web(
            write(tmp_path / "c.json", case(history=[{"query": "q", "interaction": "ab"}]))
        )


def test_malformed_jsonl_names_the_line(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", [case(), case(), case(history=[{"query": ""}])])
    with pytest.raises(IngestionError, match=r"\(line 3\): history\.0\.query"):
        load_persona2web(path)

    path.write_bytes(orjson.dumps(case()) + b"\n\n" + b'{"user_id": "ada",\n')
    with pytest.raises(IngestionError) as caught:
        load_persona2web(path)
    assert f"{path} (line 3): not valid JSON" in str(caught.value)


def test_invalid_json_and_missing_files(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text('[{"user_id": "ada"')
    with pytest.raises(IngestionError, match="not valid JSON") as caught:
        load_persona2web(path)
    assert str(path) in str(caught.value)

    missing = tmp_path / "missing.json"
    with pytest.raises(IngestionError, match="cannot read") as caught:
        load_persona2web(missing)
    assert str(missing) in str(caught.value)


def test_persona2web_cases_ingest_end_to_end(store: JsonlMemoryStore, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "cases.jsonl", [case("ada"), case("bob", history=[])])
    updater = MemoryUpdater(store)
    totals: dict[str, int] = {}
    for loaded in load_persona2web(path):
        for record in history_to_raw_tasks(loaded):
            for key, count in ingest_task_history(store, updater, record).counts().items():
                totals[key] = totals.get(key, 0) + count

    assert totals == {"trajectory:add": 2, "workspace:add": 2, "persona:add": 1}
    assert store.users() == ["ada"]
    assert [r.content.query for r in store.list("ada", "trajectory")] == [
        "book a hotel in Porto",
        "rent a car",
    ]
    (persona,) = store.list("ada", "persona")
    assert persona.content == PersonaMemory(topic="hotel class", preference="4 stars")
    # what was ingested is retrievable for the new query
    request = query_to_persona_request(load_persona2web(path)[0])
    bundle = updater.retriever.retrieve(
        request.user_id, [SearchRequest(layer="trajectory", query="hotel Porto")], top_k=1
    )
    assert [m.record.content.query for m in bundle.trajectory] == ["book a hotel in Porto"]


# --- autopersona ingest --------------------------------------------------------------------------


def task_line(user: str = "ada", **fields: object) -> bytes:
    return orjson.dumps(task(user, **fields).model_dump(mode="json")) + b"\n"


def test_cli_ingest_prints_counts_only(run_cli, store_root: Path, tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_bytes(
        task_line("ada", query=PRIVATE_TEXT)
        + b"\n"  # blank lines are skipped
        + task_line("ada")
        + task_line("bob", persona=[{"topic": "secret", "preference": PRIVATE_TEXT}])
    )
    result = run_cli("ingest", str(store_root), str(path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        f"ingested 3 tasks into {store_root}: "
        "persona:add 3, persona:noop 2, trajectory:add 3, workspace:add 2, workspace:noop 1"
    )
    assert result.stderr == ""  # no progress lines under 100 tasks
    assert PRIVATE_TEXT not in result.stdout + result.stderr
    assert "Portuguese" not in result.stdout + result.stderr

    store = JsonlMemoryStore(store_root)
    assert store.users() == ["ada", "bob"]
    assert [r.content.query for r in store.list("ada", "trajectory")] == [
        PRIVATE_TEXT,
        "book a table for two in Lisbon",
    ]
    assert_embedded_by(store, shared_encoder(), "bob")


def test_cli_ingest_of_one_task_says_one_task(run_cli, store_root: Path, tmp_path: Path) -> None:
    path = tmp_path / "one.jsonl"
    path.write_bytes(task_line("ada"))
    result = run_cli("ingest", str(store_root), str(path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"ingested 1 task into {store_root}: ")


def test_cli_ingest_validates_the_whole_file_before_writing(
    run_cli, store_root: Path, tmp_path: Path
) -> None:
    path = tmp_path / "tasks.jsonl"
    lines = [task_line(f"user-{i}") for i in range(5)]
    bad = orjson.dumps({"user_id": "ada", "query": "q", "trace": "not a list"}) + b"\n"
    path.write_bytes(b"".join(lines) + bad)

    result = run_cli("ingest", str(store_root), str(path))
    assert result.returncode == 1
    assert result.stdout == ""
    assert f"{path}:6: trace:" in result.stderr
    assert "error:" in result.stderr
    assert list(store_root.rglob("*.jsonl")) == []
    assert JsonlMemoryStore(store_root).users() == []


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (b"{not json\n", ":2: line:"),
        (b'{"user_id": "ada"}\n', ":2: query: Field required"),
        (b'{"user_id": "ada", "query": "q", "persona": [{"topic": "t"}]}\n', ":2: persona.0.pref"),
        (b'{"user_id": "ada", "query": "q", "colour": 1}\n', ":2: colour: Extra inputs"),
    ],
)
def test_cli_ingest_errors_name_line_and_field(
    run_cli, store_root: Path, tmp_path: Path, line: bytes, expected: str
) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_bytes(task_line() + line)
    result = run_cli("ingest", str(store_root), str(path))
    assert result.returncode == 1
    assert f"{path}{expected}" in result.stderr
    assert list(store_root.rglob("*.jsonl")) == []


def test_cli_ingest_of_a_missing_file(run_cli, store_root: Path, tmp_path: Path) -> None:
    result = run_cli("ingest", str(store_root), str(tmp_path / "nope.jsonl"))
    assert result.returncode == 1
    assert "cannot read" in result.stderr
    assert str(tmp_path / "nope.jsonl") in result.stderr


def test_cli_ingest_reports_progress_on_stderr_for_large_inputs(
    run_cli, store_root: Path, tmp_path: Path
) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_bytes(
        b"".join(
            task_line(
                f"user-{i % 4}",
                query=f"task number {i}",
                state={"step": i},
                persona=[{"topic": "seat", "preference": "aisle"}],
            )
            for i in range(120)
        )
    )
    result = run_cli("ingest", str(store_root), str(path))
    assert result.returncode == 0, result.stderr
    progress = result.stderr.splitlines()
    assert progress, "no progress lines for 120 tasks"
    assert progress[-1].strip() == "120/120 tasks (100%)"
    done = [int(line.split()[0].split("/")[0]) for line in progress]
    assert done == sorted(done)
    assert len(progress) <= 21
    assert all(line.strip().endswith("%)") and "/120 tasks" in line for line in progress)
    assert "120/120" not in result.stdout
    assert result.stdout.startswith("ingested 120 tasks")
    assert "persona:add 4, persona:noop 116, trajectory:add 120" in result.stdout
    store = JsonlMemoryStore(store_root)
    assert store.users() == [f"user-{i}" for i in range(4)]
    assert sum(len(store.list(u, "trajectory")) for u in store.users()) == 120


# --- reindex -------------------------------------------------------------------------------------


def seed_with(store: JsonlMemoryStore, embedder: HashingEmbedder, user: str = "ada") -> None:
    updater = MemoryUpdater(store, embedder)
    ingest_task_history(store, updater, task(user))
    ingest_task_history(
        store,
        updater,
        task(user, query="order sushi", persona=[{"topic": "fish", "preference": "salmon"}]),
    )


def test_retrieving_with_another_embedder_asks_for_a_reindex(store: JsonlMemoryStore) -> None:
    seed_with(store, HashingEmbedder(dim=64))
    retriever = MemoryRetriever(store, HashingEmbedder())
    search = SearchRequest(layer="persona", query="dinner")
    with pytest.raises(EmbeddingMismatchError, match="autopersona reindex") as caught:
        retriever.retrieve("ada", [search])
    assert "hashing-v1-64" in str(caught.value)
    assert "hashing-v1-256" in str(caught.value)
    with pytest.raises(EmbeddingMismatchError):  # and again: nothing half-applied
        retriever.retrieve("ada", [search])


def test_reindex_is_a_noop_when_everything_matches(store: JsonlMemoryStore) -> None:
    embedder = HashingEmbedder(dim=64)
    seed_with(store, embedder)
    before = store.snapshot("ada")
    assert reindex_user(store, "ada", embedder) == 0
    assert reindex_user(store, "nobody", embedder) == 0
    assert store.snapshot("ada") == before
    assert store.users() == ["ada"]


def test_reindex_user_re_embeds_and_keeps_everything_else(store: JsonlMemoryStore) -> None:
    seed_with(store, HashingEmbedder(dim=64))
    seed_with(store, HashingEmbedder(dim=64), user="bob")
    plain = store.add("ada", PersonaMemory(topic="music", preference="jazz"))  # no embedding
    assert plain.embedding is None
    new = HashingEmbedder()
    retriever = MemoryRetriever(store, new)
    search = SearchRequest(layer="persona", query="jazz music")
    with pytest.raises(EmbeddingMismatchError):
        retriever.retrieve("ada", [search])
    before = store.snapshot("ada")
    bob_before = store.snapshot("bob")

    assert reindex_user(store, "ada", new) == sum(before.counts.values())

    after = store.snapshot("ada")
    assert after.counts == before.counts
    for layer in LAYERS:
        old, fresh = before.memories[layer], after.memories[layer]
        assert [(r.id, r.content, r.created_at, r.updated_at) for r in fresh] == [
            (r.id, r.content, r.created_at, r.updated_at) for r in old
        ]
    assert_embedded_by(store, new, "ada")
    assert store.snapshot("bob") == bob_before  # other users untouched
    # the retriever that refused before now works, and finds the un-embedded memory too
    found = retriever.retrieve("ada", [search], top_k=1).persona
    assert [m.record.id for m in found] == [plain.id]
    assert reindex_user(store, "ada", new) == 0
    assert store.snapshot("ada") == after


def test_cli_reindex(run_cli, store: JsonlMemoryStore, store_root: Path) -> None:
    seed_with(store, HashingEmbedder(dim=64), "ada")
    seed_with(store, HashingEmbedder(dim=64), "bob")
    total = sum(sum(store.snapshot(u).counts.values()) for u in ("ada", "bob"))
    ada = store.snapshot("ada")

    result = run_cli("reindex", str(store_root), "--embedder", "hashing", "--user", "ada")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        f"re-embedded {sum(ada.counts.values())} memories of 1 users with hashing-v1-256"
    )
    fresh = JsonlMemoryStore(store_root)
    assert_embedded_by(fresh, HashingEmbedder(), "ada")
    assert_embedded_by(fresh, HashingEmbedder(dim=64), "bob")

    result = run_cli("reindex", str(store_root), "--embedder", "hashing")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        f"re-embedded {total - sum(ada.counts.values())} memories of 2 users with hashing-v1-256"
    )
    assert PRIVATE_TEXT not in result.stdout
    again = run_cli("reindex", str(store_root), "--embedder", "hashing")
    assert again.stdout.strip() == "re-embedded 0 memories of 2 users with hashing-v1-256"
    retriever = MemoryRetriever(JsonlMemoryStore(store_root), HashingEmbedder())
    found = retriever.retrieve("bob", [SearchRequest(layer="persona", query="salmon")], top_k=1)
    assert [m.record.content.preference for m in found.persona] == ["salmon"]


def test_cli_reindex_of_a_missing_store(run_cli, tmp_path: Path) -> None:
    result = run_cli("reindex", str(tmp_path / "nowhere"))
    assert result.returncode == 1
    assert "no memory store at" in result.stderr


def test_unknown_keys_of_persona_items_are_ignored_too(tmp_path: Path) -> None:
    path = tmp_path / "cases.json"
    path.write_bytes(
        orjson.dumps(
            {
                "user_id": "ada",
                "query": "q",
                "history": [
                    {
                        "query": "earlier",
                        "persona": [{"topic": "tone", "preference": "warm", "confidence": 0.8}],
                    }
                ],
            }
        )
    )
    (case,) = load_persona2web(path)
    assert case.history[0].persona == [PersonaMemory(topic="tone", preference="warm")]


def test_a_user_id_the_store_refuses_is_caught_while_reading(tmp_path: Path) -> None:
    # Validated with the records, so a bad line near the end fails before any write.
    lines = [
        orjson.dumps({"user_id": "ada", "query": "fine"}),
        orjson.dumps({"user_id": "a" * 1025, "query": "too long a name"}),
    ]
    with pytest.raises(IngestionError, match=r"tasks\.jsonl:2: user_id: .*at most 1024"):
        list(read_task_records(lines, tmp_path / "tasks.jsonl"))


# --- every bad line at once; a person's words wherever the task keeps them; chat logs ---------


def test_cli_ingest_lists_every_bad_line_and_ingests_nothing(
    run_cli, store_root: Path, tmp_path: Path
) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_bytes(
        task_line("ada")
        + b'{"user_id": "ada"}\n'  # 2: no query
        + task_line("bob")
        + b"{not json\n"  # 4
        + b"\n"  # blank: skipped, not counted
        + orjson.dumps({"user_id": "ada", "query": "q", "trace": "not a list"})  # 6
        + b"\n"
    )
    result = run_cli("ingest", str(store_root), str(path))
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"error: {path}: 3 of 5 lines are not valid tasks, so nothing is ingested:",
        f"  {path}:2: query: Field required",
        f"  {path}:4: line: Invalid JSON: key must be a string at line 1 column 2",
        f"  {path}:6: trace: Input should be a valid array",
    ]
    assert list(store_root.rglob("*.jsonl")) == []


def test_a_long_list_of_bad_lines_is_cut_and_says_how_many_more(tmp_path: Path) -> None:
    lines = [b'{"user_id": "ada"}'] * 120
    with pytest.raises(IngestionError) as caught:
        read_task_records(lines, tmp_path / "tasks.jsonl")
    message = str(caught.value).splitlines()
    assert message[0].endswith("120 of 120 lines are not valid tasks, so nothing is ingested:")
    assert message[1].endswith("tasks.jsonl:1: query: Field required")
    assert message[50].endswith("tasks.jsonl:50: query: Field required")
    assert message[51:] == ["  ... and 70 more"]


SAID = {"role": "user", "text": "I always prefer aisle seats on trains."}


@pytest.mark.parametrize("where", ["trace", "interaction"])
def test_what_the_person_said_becomes_a_persona_memory_wherever_the_task_keeps_it(
    tmp_path: Path, where: str
) -> None:
    store = JsonlMemoryStore(tmp_path / where)
    record = RawTaskRecord(user_id="ada", query="Book a train to York", **{where: [SAID]})
    result = MemoryBank(store, HashingEmbedder()).ingest(record)
    assert [p.content for p in store.list("ada", "persona")] == [
        PersonaMemory(topic="seats", preference="I always prefer aisle seats on trains")
    ]
    assert "persona:add" in result.counts()


def chat_line(text: str, minutes: int, role: str = "user", **fields: str) -> bytes:
    at = datetime(2025, 1, 10, 9, tzinfo=UTC) + timedelta(minutes=minutes)
    return orjson.dumps({"role": role, "text": text, "at": at.isoformat(), **fields}) + b"\n"


def test_cli_ingests_a_chat_log_session_by_session(
    run_cli, store_root: Path, tmp_path: Path
) -> None:
    path = tmp_path / "chat.jsonl"
    path.write_bytes(
        chat_line("Book me a train to York. I prefer window seats.", 0)
        + chat_line("Booked 14A, a window seat.", 1, role="assistant")
        + b"\n"
        + chat_line("Trains again. I like aisle seats these days.", 60 * 24 * 30)  # line 4
        + chat_line("Booked 22C.", 60 * 24 * 30 + 1, role="assistant")
    )
    result = run_cli("ingest", "--chat", "ada", str(path), "--store", str(store_root))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"ingested 2 chat sessions into {store_root}: ")
    assert result.stderr == ""

    store = JsonlMemoryStore(store_root)
    sessions = sorted(store.list("ada", "trajectory"), key=lambda r: r.at)
    assert [s.content.query for s in sessions] == [
        "Book me a train to York. I prefer window seats.",
        "Trains again. I like aisle seats these days.",
    ]
    assert [(s.provenance.file, s.provenance.line) for s in sessions if s.provenance] == [
        (str(path), 1),
        (str(path), 4),
    ]
    (seats,) = store.list("ada", "persona")  # the later statement replaced the earlier
    assert seats.content.preference == "I like aisle seats these days"


def test_cli_chat_log_lists_every_bad_message_and_ingests_nothing(
    run_cli, store_root: Path, tmp_path: Path
) -> None:
    path = tmp_path / "chat.jsonl"
    path.write_bytes(
        chat_line("I prefer window seats.", 0)
        + b'{"role": "user", "text": "no time"}\n'
        + b'{"role": "user", "text": "naive", "at": "2025-01-10T09:00:00"}\n'
    )
    result = run_cli("ingest", "--chat", "ada", str(path), "--store", str(store_root))
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"error: {path}: 2 of 3 lines are not valid chat messages, so nothing is ingested:",
        f"  {path}:2: at: Field required",
        f"  {path}:3: at: Value error, timestamps must be timezone-aware",
    ]
    assert list(store_root.rglob("*.jsonl")) == []


def test_a_chat_log_given_as_tasks_is_refused_with_the_way_to_ingest_it(
    run_cli, store_root: Path, tmp_path: Path
) -> None:
    path = tmp_path / "chat.jsonl"
    path.write_bytes(chat_line("I prefer window seats.", 0))
    result = run_cli("ingest", str(path), "--store", str(store_root))
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == "(the lines are chat messages: add --chat USER)"
    assert list(store_root.rglob("*.jsonl")) == []


def test_gap_hours_is_for_chat_logs_only(run_cli, store_root: Path, tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_bytes(task_line())
    result = run_cli("ingest", str(path), "--store", str(store_root), "--gap-hours", "1")
    assert result.returncode == 2
    assert "--gap-hours" in result.stderr
    assert "--chat" in result.stderr


def _json_examples(text: str) -> list[str]:
    """The JSON objects ``text`` shows, one a paragraph, each possibly wrapped over lines."""
    return [
        " ".join(line.strip() for line in paragraph.splitlines())
        for paragraph in text.split("\n\n")
        if paragraph.strip().startswith("{")
    ]


def test_the_line_formats_that_help_and_docs_show_are_what_ingest_reads(
    run_cli, tmp_path: Path
) -> None:
    from autopersona_flows.cli.ingestion import ingest_command

    # --help renders the docstring; its examples must be lines ingest accepts.
    task_example, chat_example = _json_examples(inspect.getdoc(ingest_command) or "")
    RawTaskRecord.model_validate_json(task_example)
    ChatMessage.model_validate_json(chat_example)
    shown = run_cli("ingest", "--help")
    assert shown.returncode == 0
    for name in RawTaskRecord.model_fields.keys() - {"provenance"}:
        assert name in shown.stdout, f"--help does not name the field {name}"

    # The docs' two blocks, as a user copies them into files and ingests them.
    cli_page = Path(__file__).parents[2] / "docs" / "cli.md"
    tasks, chat = re.findall(r"```json\n(.*?)```", cli_page.read_text(encoding="utf-8"), re.S)
    (tmp_path / "tasks.jsonl").write_text(tasks, encoding="utf-8")
    (tmp_path / "chat.jsonl").write_text(chat, encoding="utf-8")
    store = tmp_path / "store"
    for args, ingested in (
        (["tasks.jsonl"], "ingested 2 tasks"),
        (["--chat", "ada", "chat.jsonl"], "ingested 1 chat session"),
    ):
        result = run_cli("ingest", *args, "--store", str(store), cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(ingested)
    persona = {
        r.content.topic: r.content.preference
        for r in JsonlMemoryStore(store).list("ada", "persona")
    }
    assert persona["citation style"] == "APA"
    assert persona["seats"] == "I prefer aisle seats"  # said in the trace
    assert persona["rooms"] == "I always book quiet rooms"  # said in the chat
