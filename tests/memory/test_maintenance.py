"""Maintenance on real files: compaction, consolidation of near duplicates, expiry, the report."""

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pydantic import ValidationError

from autopersona_flows import (
    InvalidUserIdError,
    JsonlMemoryStore,
    MemoryStore,
    PersonaMemory,
    TrajectoryMemory,
    WorkspaceMemory,
)
from autopersona_flows.memory import HashingEmbedder, MemoryRecord, maintain_user
from autopersona_flows.memory.maintenance import (
    Compactable,
    MaintenanceReport,
    MemoryMerge,
    consolidate_duplicates,
    expire_workspace,
)
from autopersona_flows.memory.records import LayerContent
from autopersona_flows.memory.updates import embed_records
from autopersona_flows.memory.users import user_key

NOW = datetime(2025, 1, 31, 12, 0, tzinfo=UTC)
MARKER = "ZEBRA-MARKER-42"  # content that must never appear in a report


def put(
    store: JsonlMemoryStore,
    user: str,
    content: LayerContent,
    *,
    days_ago: float,
    created_days_ago: float | None = None,
) -> MemoryRecord:
    """Store ``content`` embedded, as last written ``days_ago`` before NOW."""
    created = NOW - timedelta(days=days_ago if created_days_ago is None else created_days_ago)
    (record,) = embed_records(
        HashingEmbedder(), [content], created_at=created, updated_at=NOW - timedelta(days=days_ago)
    )
    return store.add(user, record)


def bank_file(store: JsonlMemoryStore, user: str, layer: str) -> Path:
    return store.root / "users" / user_key(user) / f"{layer}.jsonl"


def flight(text: str = "book a flight to Paris") -> TrajectoryMemory:
    return TrajectoryMemory(query=text, insight=f"aisle seat {MARKER}")


# -- compaction ------------------------------------------------------------------------------


def test_compact_drops_dead_entries_and_keeps_every_record(store: JsonlMemoryStore) -> None:
    assert isinstance(store, Compactable)
    records = store.add_many(
        "ada", "persona", [PersonaMemory(topic=f"t{i}", preference="p") for i in range(5)]
    )  # one batch marker: 1 dead entry
    for i in range(3):  # 3 superseded versions
        store.update("ada", "persona", records[0].id, PersonaMemory(topic="t0", preference=str(i)))
    store.delete("ada", "persona", records[1].id)  # the record and its tombstone: 2 more
    path = bank_file(store, "ada", "persona")
    size, live = path.stat().st_size, store.list("ada", "persona")
    fingerprint = store.snapshot_fingerprint("ada")

    assert store.compact("ada") == 6
    assert path.stat().st_size < size
    assert path.read_bytes().count(b"\n") == 1 + len(live)  # the header and the live records
    assert store.list("ada", "persona") == live
    assert JsonlMemoryStore(store.root).list("ada", "persona") == live  # as read from disk
    assert store.snapshot_fingerprint("ada") == fingerprint
    assert len(store.history("ada", "persona", records[0].id)) == 3  # history is untouched
    assert store.compact("ada") == 0


def test_compact_with_nothing_dead_leaves_the_file_byte_identical(
    store: JsonlMemoryStore,
) -> None:
    for i in range(3):
        store.add("ada", PersonaMemory(topic=f"t{i}", preference="p"))
    path = bank_file(store, "ada", "persona")
    data, stat = path.read_bytes(), path.stat()
    assert store.compact("ada") == 0
    assert path.read_bytes() == data
    assert (path.stat().st_ino, path.stat().st_mtime_ns) == (stat.st_ino, stat.st_mtime_ns)


def test_compact_one_layer_and_unknown_users(store: JsonlMemoryStore) -> None:
    for layer_content in (TrajectoryMemory(query="q"), PersonaMemory(topic="t", preference="p")):
        record = store.add("ada", layer_content)
        store.delete("ada", record.layer, record.id)
    trajectory = bank_file(store, "ada", "trajectory").read_bytes()
    assert store.compact("ada", "persona") == 2
    assert bank_file(store, "ada", "trajectory").read_bytes() == trajectory
    assert store.compact("nobody") == 0
    assert store.users() == ["ada"]
    assert not (store.root / "users" / user_key("nobody")).exists()  # nothing created
    with pytest.raises(ValueError, match="unknown memory layer"):
        store.compact("ada", "personas")  # type: ignore[arg-type]
    with pytest.raises(InvalidUserIdError):
        store.compact("")


# -- consolidation ---------------------------------------------------------------------------


def test_consolidation_keeps_the_newer_of_a_near_duplicate_pair(store: JsonlMemoryStore) -> None:
    # Stored first (the smaller id) but written last: "newer" means the later updated_at.
    newer = put(store, "ada", flight("Book a flight to Paris!"), days_ago=1)
    older = put(store, "ada", flight(), days_ago=5)
    car = put(store, "ada", TrajectoryMemory(query="rent a car in Lyon"), days_ago=4)
    hotel = put(store, "ada", TrajectoryMemory(query="book a hotel in Paris"), days_ago=3)
    bob = [put(store, "bob", flight(), days_ago=d) for d in (2, 1)]  # same pair, another user
    bob_fingerprint = store.snapshot_fingerprint("bob")

    merges = consolidate_duplicates(store, "ada", "trajectory")

    assert merges == [MemoryMerge(layer="trajectory", kept=newer.id, removed=older.id)]
    assert store.list("ada", "trajectory") == [newer, car, hotel]  # the kept one is unchanged
    (change,) = store.history("ada", "trajectory", older.id)
    assert (change.operation, change.before) == ("delete", older)
    assert store.list("bob", "trajectory") == bob
    assert store.snapshot_fingerprint("bob") == bob_fingerprint
    assert consolidate_duplicates(store, "ada", "trajectory") == []  # idempotent


def test_equal_content_is_a_duplicate_whatever_its_score(store: JsonlMemoryStore) -> None:
    state = {"open": ["a.md", "b.md"], "cursor": 12}
    copies = [put(store, "ada", WorkspaceMemory(state=state), days_ago=d) for d in (3, 2, 1)]
    near = put(store, "ada", WorkspaceMemory(state={**state, "cursor": 13}), days_ago=0)
    # No two memories score 1.0 apart from equal ones, which merge into the newest copy.
    merges = consolidate_duplicates(store, "ada", "workspace", duplicate_threshold=1.0)
    assert [(m.kept, m.removed) for m in merges] == [
        (copies[1].id, copies[0].id),
        (copies[2].id, copies[1].id),
    ]
    assert store.list("ada", "workspace") == [copies[2], near]
    assert consolidate_duplicates(store, "ada", "workspace", duplicate_threshold=1.0) == []


def test_distinct_memories_are_left_alone(store: JsonlMemoryStore) -> None:
    memories = [
        put(store, "ada", PersonaMemory(topic="tone", preference="formal"), days_ago=2),
        put(store, "ada", PersonaMemory(topic="citation style", preference="APA"), days_ago=1),
    ]
    data = bank_file(store, "ada", "persona").read_bytes()
    assert consolidate_duplicates(store, "ada", "persona") == []
    assert store.list("ada", "persona") == memories
    assert bank_file(store, "ada", "persona").read_bytes() == data


# -- expiry ----------------------------------------------------------------------------------


def test_expiry_removes_only_stale_workspace_memories(store: JsonlMemoryStore) -> None:
    stale = put(store, "ada", WorkspaceMemory(state="stale"), days_ago=45)
    boundary = put(store, "ada", WorkspaceMemory(state="boundary"), days_ago=30)
    revived = put(store, "ada", WorkspaceMemory(state="revived"), days_ago=1, created_days_ago=90)
    others = [
        put(store, "ada", TrajectoryMemory(query="an old request"), days_ago=400),
        put(store, "ada", PersonaMemory(topic="tone", preference="formal"), days_ago=400),
    ]
    old_bob = put(store, "bob", WorkspaceMemory(state="stale"), days_ago=45)

    assert expire_workspace(store, "ada", timedelta(days=30), now=NOW) == [stale.id]
    assert store.list("ada", "workspace") == [boundary, revived]  # exactly max_age old stays
    assert [*store.list("ada", "trajectory"), *store.list("ada", "persona")] == others
    assert store.list("bob", "workspace") == [old_bob]
    assert store.history("ada", "workspace", stale.id)[0].operation == "delete"
    assert expire_workspace(store, "ada", timedelta(days=30), now=NOW) == []


# -- maintain_user ---------------------------------------------------------------------------


def test_maintain_user_reports_ids_and_counts_but_no_contents(store: JsonlMemoryStore) -> None:
    stale = put(store, "ada", WorkspaceMemory(state=MARKER), days_ago=60)
    older = put(store, "ada", flight(), days_ago=5)
    newer = put(store, "ada", flight("Book a flight to Paris!"), days_ago=1)
    put(store, "ada", PersonaMemory(topic="tone", preference=MARKER), days_ago=1)

    report = maintain_user(store, "ada", workspace_max_age=timedelta(days=30), now=NOW)

    assert report == MaintenanceReport(
        user_id="ada",
        expired=[stale.id],
        merged=[MemoryMerge(layer="trajectory", kept=newer.id, removed=older.id)],
        compacted=4,  # each removal left its record line and a tombstone
        memories={"trajectory": 1, "workspace": 0, "persona": 1},
        fingerprint=store.snapshot_fingerprint("ada"),
    )
    assert MARKER not in report.model_dump_json()
    with pytest.raises(ValidationError):
        report.compacted = 0  # type: ignore[misc]
    with pytest.raises(ValidationError):
        MaintenanceReport.model_validate({**report.model_dump(), "contents": MARKER})

    again = maintain_user(store, "ada", workspace_max_age=timedelta(days=30), now=NOW)
    assert (again.expired, again.merged, again.compacted) == ([], [], 0)
    assert again.fingerprint == report.fingerprint


def test_an_unknown_user_gets_an_empty_report_and_no_bank(store: JsonlMemoryStore) -> None:
    put(store, "ada", PersonaMemory(topic="tone", preference="formal"), days_ago=1)
    folders = sorted((store.root / "users").iterdir())
    report = maintain_user(store, "nobody", workspace_max_age=timedelta(days=1))
    assert (report.expired, report.merged, report.compacted) == ([], [], 0)
    assert report.memories == {"trajectory": 0, "workspace": 0, "persona": 0}
    assert report.fingerprint == store.snapshot_fingerprint("nobody")
    assert sorted((store.root / "users").iterdir()) == folders


class WithoutCompaction:
    """A store that cannot compact: everything else goes to a `JsonlMemoryStore`."""

    def __init__(self, inner: JsonlMemoryStore) -> None:
        self._inner = inner

    def __getattr__(self, name: str):
        if name == "compact":
            raise AttributeError(name)
        return getattr(self._inner, name)


def test_a_store_without_compaction_is_maintained_without_it(store: JsonlMemoryStore) -> None:
    older = put(store, "ada", flight(), days_ago=5)
    newer = put(store, "ada", flight("Book a flight to Paris!"), days_ago=1)
    other = WithoutCompaction(store)
    assert isinstance(other, MemoryStore)
    assert not isinstance(other, Compactable)
    report = maintain_user(other, "ada")  # type: ignore[arg-type]
    assert report.merged == [MemoryMerge(layer="trajectory", kept=newer.id, removed=older.id)]
    assert report.compacted == 0
    assert store.compact("ada") == 2  # the dead entries are still there


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"user_id": ""}, InvalidUserIdError, "empty"),
        ({"user_id": 42}, InvalidUserIdError, "must be a str"),
        ({"workspace_max_age": timedelta(0)}, ValueError, "positive datetime"),
        ({"workspace_max_age": timedelta(days=-1)}, ValueError, "positive datetime"),
        ({"workspace_max_age": 3600}, ValueError, "positive datetime"),
        ({"duplicate_threshold": 0}, ValueError, r"in \(0, 1\]"),
        ({"duplicate_threshold": 1.5}, ValueError, r"in \(0, 1\]"),
        ({"duplicate_threshold": float("nan")}, ValueError, r"in \(0, 1\]"),
        ({"duplicate_threshold": True}, ValueError, r"in \(0, 1\]"),
        ({"now": datetime(2025, 1, 31)}, ValueError, "timezone-aware"),
    ],
)
def test_invalid_arguments_are_refused_before_anything_changes(
    store: JsonlMemoryStore, options: dict, error: type[Exception], match: str
) -> None:
    put(store, "ada", WorkspaceMemory(state="stale"), days_ago=60)
    put(store, "ada", flight(), days_ago=5)
    put(store, "ada", flight("Book a flight to Paris!"), days_ago=1)
    fingerprint = store.snapshot_fingerprint("ada")
    arguments = {"user_id": "ada", "workspace_max_age": timedelta(days=30), "now": NOW} | options
    with pytest.raises(error, match=match):
        maintain_user(store, arguments.pop("user_id"), **arguments)
    assert store.snapshot_fingerprint("ada") == fingerprint


def test_the_single_steps_check_their_arguments(store: JsonlMemoryStore) -> None:
    with pytest.raises(ValueError, match="unknown memory layer"):
        consolidate_duplicates(store, "ada", "memories")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="positive datetime"):
        expire_workspace(store, "ada", 30)  # type: ignore[arg-type]
    with pytest.raises(InvalidUserIdError):
        expire_workspace(store, "\ud800", timedelta(days=1))
