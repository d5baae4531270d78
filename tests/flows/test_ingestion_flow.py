"""The ingestion flow on a real Prefect server: batches, progress, validation, caching per run."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any
from uuid import UUID

import orjson
import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    ArtifactFilterKey,
)

from autopersona_flows.agent import PersonaAgent
from autopersona_flows.errors import IngestionError
from autopersona_flows.flows import ingest_history, persona_runtime
from autopersona_flows.memory import (
    FunctionResolver,
    HeuristicResolver,
    JsonlMemoryStore,
    MemoryRetriever,
    MemoryUpdater,
)

pytestmark = pytest.mark.usefixtures("prefect_harness")

TASKS: list[dict[str, Any]] = [
    {
        "user_id": "ada",
        "query": "book a table in Lisbon",
        "state": {"reservations": 1},
        "persona": [{"topic": "cuisine", "preference": "Portuguese seafood"}],
    },
    {
        "user_id": "bob",
        "query": "find a flight to Oslo",
        "persona": [{"topic": "seat", "preference": "aisle"}],
    },
    {
        "user_id": "ada",
        "query": "book a table in Porto",
        "persona": [{"topic": "cuisine", "preference": "Portuguese seafood"}],  # known: noop
    },
    {
        "user_id": "bob",
        "query": "find a hotel in Bergen",
        "persona": [{"topic": "seat", "preference": "window"}],  # changed: update
    },
    {
        "user_id": "ada",
        "query": "book a table in Faro",
        "persona": [{"topic": "dinner time", "preference": "after eight"}],
    },
]


def write_jsonl(path: Path, lines: list[dict[str, Any] | str]) -> Path:
    path.write_bytes(
        b"".join(
            (line.encode() if isinstance(line, str) else orjson.dumps(line)) + b"\n"
            for line in lines
        )
    )
    return path


def ingest(kit, path: Path, agent: PersonaAgent | None = None, **options: Any):
    """Run the flow against the kit's store; return its final state."""
    flow = ingest_history.with_options(**options) if options else ingest_history
    with persona_runtime(agent or kit.agent, result_storage=kit.results):
        return flow(path=str(path), batch_size=2, return_state=True)


def queries(store: JsonlMemoryStore, user: str) -> Counter[str]:
    return Counter(record.content.query for record in store.list(user, "trajectory"))


def preferences(store: JsonlMemoryStore, user: str) -> dict[str, str]:
    return {r.content.topic: r.content.preference for r in store.list(user, "persona")}


def batch_results(kit) -> list[str]:
    return sorted(p.name for p in kit.results.iterdir() if p.name.startswith("autopersona-ingest-"))


def test_a_file_for_two_users_is_ingested_in_batches_with_progress(kit, tmp_path: Path) -> None:
    history = write_jsonl(tmp_path / "history.jsonl", TASKS)

    state = ingest(kit, history)

    assert state.is_completed()
    assert state.result() == {
        "tasks": 5,
        "users": ["ada", "bob"],
        "operations": {
            "persona:add": 3,
            "persona:noop": 1,
            "persona:update": 1,
            "trajectory:add": 5,
            "workspace:add": 1,
        },
    }
    assert kit.store.users() == ["ada", "bob"]
    assert queries(kit.store, "ada") == Counter(
        ["book a table in Lisbon", "book a table in Porto", "book a table in Faro"]
    )
    assert queries(kit.store, "bob") == Counter(["find a flight to Oslo", "find a hotel in Bergen"])
    assert preferences(kit.store, "ada") == {
        "cuisine": "Portuguese seafood",
        "dinner time": "after eight",
    }
    assert preferences(kit.store, "bob") == {"seat": "window"}
    assert [r.content.state for r in kit.store.list("ada", "workspace")] == [{"reservations": 1}]
    assert kit.store.list("bob", "workspace") == []
    assert len(batch_results(kit)) == 3  # 5 tasks in batches of 2

    flow_run_id = state.state_details.flow_run_id
    with get_client(sync_client=True) as client:
        [progress] = client.read_artifacts(
            artifact_filter=ArtifactFilter(
                key=ArtifactFilterKey(any_=["autopersona-ingestion"]),
                flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]),
            )
        )
    assert (progress.type, progress.data) == ("progress", 100.0)
    assert progress.description == "Ingesting 5 tasks from history.jsonl"


def test_a_bad_line_near_the_end_writes_nothing(kit, tmp_path: Path) -> None:
    # Line 4 is blank and skipped, line 7 has no query; line numbers are the file's.
    lines: list[dict[str, Any] | str] = [*TASKS[:3], "", *TASKS[3:], {"user_id": "ada"}, TASKS[0]]
    history = write_jsonl(tmp_path / "history.jsonl", lines)

    with pytest.raises(
        IngestionError, match=rf"(?m)^  {re.escape(str(history))}:7: query: Field required$"
    ):
        ingest(kit, history).result()

    assert kit.store.users() == []
    assert not (kit.store.root / "users").exists()
    assert not kit.results.exists()  # no batch ran


def test_a_missing_file_is_an_ingestion_error(kit, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.jsonl"
    state = ingest(kit, missing)
    assert state.is_failed()
    with pytest.raises(
        IngestionError, match=rf"cannot read {re.escape(str(missing))}: No such file"
    ):
        state.result()
    assert kit.store.users() == []


def test_a_separate_run_of_the_same_file_ingests_it_again(kit, tmp_path: Path) -> None:
    # Batches are cached per flow run, not per file: a new run has new keys. (Bob's
    # preferences do not change here: a replayed change would be updated twice.)
    tasks = [dict(task) for task in TASKS]
    tasks[3]["persona"] = [{"topic": "seat", "preference": "aisle"}]
    history = write_jsonl(tmp_path / "history.jsonl", tasks)
    first = ingest(kit, history)
    personas = {user: kit.store.list(user, "persona") for user in ("ada", "bob")}
    assert len(batch_results(kit)) == 3

    second = ingest(kit, history)

    assert second.state_details.flow_run_id != first.state_details.flow_run_id
    assert second.result()["operations"] == {
        "persona:noop": 5,
        "trajectory:add": 5,
        "workspace:noop": 1,
    }
    assert queries(kit.store, "ada") == Counter(
        {"book a table in Lisbon": 2, "book a table in Porto": 2, "book a table in Faro": 2}
    )
    assert sum(queries(kit.store, "bob").values()) == 4
    assert {user: kit.store.list(user, "persona") for user in ("ada", "bob")} == personas
    assert len(batch_results(kit)) == 6  # three new cache records


FLAKY_TOPIC = "flaky"
RESOLVER_CALLS: Counter[str] = Counter()


def resolve_flaky_once(layer, content, candidates):
    """The default resolver, except that it fails the first time it sees FLAKY_TOPIC."""
    topic = getattr(content, "topic", None)
    RESOLVER_CALLS[topic] += 1
    if topic == FLAKY_TOPIC and RESOLVER_CALLS[topic] == 1:
        raise RuntimeError("resolver unavailable")
    return HeuristicResolver()(layer, content, candidates)


def test_a_retry_of_the_same_run_skips_the_batches_it_already_wrote(kit, tmp_path: Path) -> None:
    RESOLVER_CALLS.clear()
    tasks = [dict(task) for task in TASKS]
    tasks[3]["persona"] = [{"topic": FLAKY_TOPIC, "preference": "fails once"}]  # in batch 1
    history = write_jsonl(tmp_path / "history.jsonl", tasks)
    retriever = MemoryRetriever(kit.store)
    updater = MemoryUpdater(
        kit.store, resolver=FunctionResolver(resolve_flaky_once), retriever=retriever
    )
    agent = PersonaAgent(retriever, updater=updater)

    state = ingest(kit, history, agent, retries=1, retry_delay_seconds=0)

    assert state.is_completed()
    assert RESOLVER_CALLS[FLAKY_TOPIC] == 2
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(UUID(str(state.state_details.flow_run_id)))
    assert run.run_count == 2
    # Batch 0 (tasks 0 and 1) came back from the cache; batch 1 (tasks 2 and 3) failed
    # half-way, after task 2 was written: its retry stored task 2 no second time.
    assert queries(kit.store, "ada") == Counter(
        {"book a table in Lisbon": 1, "book a table in Porto": 1, "book a table in Faro": 1}
    )
    assert queries(kit.store, "bob") == Counter(
        {"find a flight to Oslo": 1, "find a hotel in Bergen": 1}
    )
    # Untimed tasks are stated in the file's order.
    trajectories = sorted(
        (r for user in ("ada", "bob") for r in kit.store.list(user, "trajectory")),
        key=lambda r: r.at,
    )
    assert [r.content.query for r in trajectories] == [task["query"] for task in TASKS]
    assert preferences(kit.store, "bob") == {"seat": "aisle", FLAKY_TOPIC: "fails once"}
    assert len(batch_results(kit)) == 3
