"""The maintenance flow on a real Prefect server: reports, snapshots, the artifact, privacy."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    ArtifactFilterKey,
    LogFilter,
    LogFilterFlowRunId,
)
from prefect.exceptions import ParameterTypeError

from autopersona_flows.errors import InvalidUserIdError
from autopersona_flows.flows import memory_maintenance, persona_runtime
from autopersona_flows.memory import (
    HashingEmbedder,
    JsonlMemoryStore,
    MemoryRecord,
    PersonaMemory,
    TrajectoryMemory,
    WorkspaceMemory,
)
from autopersona_flows.memory.records import LayerContent
from autopersona_flows.memory.snapshots import read_snapshot
from autopersona_flows.memory.updates import embed_records
from autopersona_flows.memory.users import user_key

pytestmark = pytest.mark.usefixtures("prefect_harness")

MARKER = "OKAPI-SECRET-7731"  # memory content that must reach no artifact and no log
NOW = datetime.now(UTC)


def put(
    store: JsonlMemoryStore, user: str, content: LayerContent, *, days_ago: float
) -> MemoryRecord:
    """Store ``content`` embedded, as written ``days_ago`` days ago."""
    at = NOW - timedelta(days=days_ago)
    (record,) = embed_records(HashingEmbedder(), [content], created_at=at, updated_at=at)
    return store.add(user, record)


def seed(store: JsonlMemoryStore) -> dict[str, MemoryRecord]:
    """Ada has a stale workspace memory and a near-duplicate pair; Bob has neither."""
    return {
        "stale": put(store, "ada", WorkspaceMemory(state={"draft": MARKER}), days_ago=200),
        "fresh": put(store, "ada", WorkspaceMemory(state={"draft": "v2"}), days_ago=1),
        "older": put(
            store,
            "ada",
            PersonaMemory(topic="citation style", preference="APA 7th edition"),
            days_ago=3,
        ),
        "newer": put(
            store,
            "ada",
            PersonaMemory(topic="Citation style", preference="APA, 7th edition"),
            days_ago=1,
        ),
        "secret": put(store, "ada", PersonaMemory(topic="colour", preference=MARKER), days_ago=2),
        "seat": put(store, "bob", PersonaMemory(topic="seat", preference="aisle"), days_ago=5),
        "trip": put(store, "bob", TrajectoryMemory(query="find a flight to Oslo"), days_ago=5),
    }


def maintain(kit, **parameters: Any):
    """Run the flow against the kit's store; return its final state."""
    with persona_runtime(kit.agent):
        return memory_maintenance(**parameters, return_state=True)


def table_rows(flow_run_id: UUID) -> tuple[list[dict[str, Any]], str]:
    """The maintenance artifact's rows, and its raw data as the server holds it."""
    with get_client(sync_client=True) as client:
        [artifact] = client.read_artifacts(
            artifact_filter=ArtifactFilter(
                key=ArtifactFilterKey(any_=["autopersona-maintenance"]),
                flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]),
            )
        )
    raw = artifact.data if isinstance(artifact.data, str) else json.dumps(artifact.data)
    return json.loads(raw), raw + (artifact.description or "")


def run_logs(flow_run_id: UUID, expected: int, timeout: float = 20.0) -> list[str]:
    """The run's log messages (its tasks' included), once ``expected`` per-user lines arrived.

    Logs reach the server from a background worker, a moment after the flow returns.
    """
    log_filter = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id]))
    until = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        while True:
            messages = [log.message for log in client.read_logs(log_filter=log_filter)]
            if sum("fingerprint sha256:" in m for m in messages) >= expected:
                return messages
            if time.monotonic() > until:
                pytest.fail(f"the per-user log lines did not arrive: {messages}")
            time.sleep(0.25)


def test_every_user_is_maintained_snapshotted_and_reported_without_contents(
    kit, tmp_path: Path
) -> None:
    memories = seed(kit.store)
    snapshots = tmp_path / "snapshots"

    state = maintain(kit, workspace_max_age_days=30, snapshot_dir=str(snapshots))

    assert state.is_completed()
    ada, bob = state.result()
    assert (ada["user_id"], bob["user_id"]) == ("ada", "bob")
    assert ada["expired"] == [memories["stale"].id]
    assert ada["merged"] == [
        {"layer": "persona", "kept": memories["newer"].id, "removed": memories["older"].id}
    ]
    assert ada["memories"] == {"trajectory": 0, "workspace": 1, "persona": 2}
    assert ada["compacted"] == 4  # each removal left its record line and a tombstone
    assert (bob["expired"], bob["merged"], bob["compacted"]) == ([], [], 0)
    assert bob["memories"] == {"trajectory": 1, "workspace": 0, "persona": 1}
    assert kit.store.list("ada", "workspace") == [memories["fresh"]]
    assert kit.store.list("ada", "persona") == [memories["newer"], memories["secret"]]
    assert kit.store.list("bob", "persona") == [memories["seat"]]

    for report in (ada, bob):
        user = report["user_id"]
        fingerprint = kit.store.snapshot_fingerprint(user)
        assert report["fingerprint"] == fingerprint
        [path] = (snapshots / user_key(user)).iterdir()
        assert report["snapshot"] == str(path)
        assert read_snapshot(path).fingerprint == fingerprint
    assert sorted(p.name for p in snapshots.iterdir()) == sorted(map(user_key, ["ada", "bob"]))

    flow_run_id = state.state_details.flow_run_id
    rows, raw = table_rows(flow_run_id)
    assert [(r["user"], r["expired"], r["merged"]) for r in rows] == [("ada", 1, 1), ("bob", 0, 0)]
    assert [r["fingerprint"] for r in rows] == [
        f"sha256:{kit.store.snapshot_fingerprint(user)}" for user in ("ada", "bob")
    ]
    assert [r["snapshot"] for r in rows] == [ada["snapshot"], bob["snapshot"]]
    assert rows[0]["memories"] == "trajectory 0, workspace 1, persona 2"
    assert MARKER not in raw
    assert MARKER not in json.dumps(state.result())

    messages = run_logs(flow_run_id, expected=2)
    assert any(
        m.startswith("user ada: 1 expired, 0 retired, 1 merged, 0 promoted")
        and ada["fingerprint"] in m
        for m in messages
    )
    assert not [m for m in messages if MARKER in m]


def test_one_user_is_maintained_alone_into_the_snapshots_setting(
    kit, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed(kit.store)
    ada_before = kit.store.snapshot_fingerprint("ada")
    snapshots = tmp_path / "from-settings"
    monkeypatch.setenv("PREFECT_INTEGRATIONS_AUTOPERSONA_SNAPSHOTS", str(snapshots))

    state = maintain(kit, user_id="bob", workspace_max_age_days=30)

    [bob] = state.result()
    assert bob["user_id"] == "bob"
    assert kit.store.snapshot_fingerprint("ada") == ada_before
    assert [p.name for p in snapshots.iterdir()] == [user_key("bob")]
    [path] = (snapshots / user_key("bob")).iterdir()
    assert read_snapshot(path).fingerprint == kit.store.snapshot_fingerprint("bob")
    rows, _ = table_rows(state.state_details.flow_run_id)
    assert [r["user"] for r in rows] == ["bob"]


def test_an_empty_user_id_fails_the_run(kit, tmp_path: Path) -> None:
    seed(kit.store)
    fingerprints = {user: kit.store.snapshot_fingerprint(user) for user in ("ada", "bob")}

    state = maintain(kit, user_id="", snapshot_dir=str(tmp_path / "snapshots"))

    assert state.is_failed()
    with pytest.raises(InvalidUserIdError, match="must not be empty"):
        state.result()
    assert {user: kit.store.snapshot_fingerprint(user) for user in fingerprints} == fingerprints
    assert not (tmp_path / "snapshots").exists()


def test_a_path_like_user_id_stays_inside_the_snapshot_folder(kit, tmp_path: Path) -> None:
    # "../x" is a valid user id (any non-empty text is); it maps to a safe folder name.
    snapshots = tmp_path / "snapshots"

    kit.store.add("../x", PersonaMemory(topic="tone", preference="terse"))

    [report] = maintain(kit, user_id="../x", snapshot_dir=str(snapshots)).result()

    assert report["memories"] == {"trajectory": 0, "workspace": 0, "persona": 1}
    assert Path(report["snapshot"]).resolve().parent == (snapshots / user_key("../x")).resolve()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["snapshots", "store"]


def test_a_user_without_memories_gets_no_snapshot(kit, tmp_path: Path) -> None:
    # An erased user, maintained by name or listed before the erase, must get no file.
    snapshots = tmp_path / "snapshots"

    [report] = maintain(kit, user_id="nobody", snapshot_dir=str(snapshots)).result()

    assert report["memories"] == {"trajectory": 0, "workspace": 0, "persona": 0}
    assert report["snapshot"] is None
    assert not snapshots.exists()
    assert kit.store.users() == []


@pytest.mark.parametrize(
    "parameters",
    [
        {"workspace_max_age_days": 0},
        {"workspace_max_age_days": -5},
        {"duplicate_threshold": 1.5},
    ],
)
def test_out_of_range_parameters_are_rejected_before_the_flow_body_runs(
    kit, tmp_path: Path, parameters: dict[str, Any]
) -> None:
    seed(kit.store)
    fingerprint = kit.store.snapshot_fingerprint("ada")
    state = maintain(kit, snapshot_dir=str(tmp_path / "snapshots"), **parameters)

    assert state.is_failed()
    with pytest.raises(ParameterTypeError, match=next(iter(parameters))):
        state.result()
    assert kit.store.snapshot_fingerprint("ada") == fingerprint
    assert not (tmp_path / "snapshots").exists()
