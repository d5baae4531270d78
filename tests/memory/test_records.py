"""Strict validation of the record models: nothing is coerced, bad values are named."""

import base64
from datetime import UTC, datetime, timedelta, timezone

import numpy as np
import orjson
import pytest
from pydantic import ValidationError

from autopersona_flows import (
    MemoryRecord,
    PersonaMemory,
    RawTaskRecord,
    TrajectoryMemory,
    WorkspaceMemory,
)
from autopersona_flows.memory.ids import new_memory_id
from autopersona_flows.memory.records import Embedding, content_type


def test_of_takes_the_layer_from_the_content() -> None:
    record = MemoryRecord.of(PersonaMemory(topic="tone", preference="terse"))
    assert record.layer == "persona"
    assert record.updated_at == record.created_at
    assert record.created_at.tzinfo is UTC


def test_record_of_the_wrong_layer_is_rejected() -> None:
    with pytest.raises(ValidationError, match="expected TrajectoryMemory"):
        MemoryRecord(layer="trajectory", content=PersonaMemory(topic="t", preference="p"))
    with pytest.raises(ValidationError, match="query"):
        MemoryRecord(layer="trajectory", content={"topic": "t", "preference": "p"})


def test_dict_content_is_validated_as_the_layer_says() -> None:
    record = MemoryRecord(layer="workspace", content={"state": {"open": ["a.md"]}})
    assert record.content == WorkspaceMemory(state={"open": ["a.md"]})


@pytest.mark.parametrize(
    ("model", "fields", "message"),
    [
        (TrajectoryMemory, {"query": None}, "query"),
        (TrajectoryMemory, {"query": "q", "trace": "abc"}, "trace"),  # never a list of chars
        (TrajectoryMemory, {"query": "q", "insight": None}, "insight"),  # never "None"
        (TrajectoryMemory, {"query": "q", "insight": 3}, "insight"),
        (TrajectoryMemory, {"query": "  "}, "must not be empty"),
        (TrajectoryMemory, {}, "query"),
        (TrajectoryMemory, {"query": "q", "extra": 1}, "extra"),
        (PersonaMemory, {"topic": "t"}, "preference"),
        (PersonaMemory, {"topic": "t", "preference": 5}, "preference"),
        (PersonaMemory, {"topic": "", "preference": "p"}, "must not be empty"),
        (WorkspaceMemory, {}, "needs a task, an interaction or a state"),
        (WorkspaceMemory, {"interaction": ("a", "b")}, "interaction"),
    ],
)
def test_wrong_types_and_missing_fields_are_rejected(
    model: type, fields: dict, message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        model(**fields)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (float("nan"), "not a JSON number"),
        (float("inf"), "not a JSON number"),
        ({"a": [1, float("-inf")]}, r"\['a'\]\[1\]"),
        ("\ud800", "lone surrogate"),
        ({"\udfff": 1}, "lone surrogate"),
        ({1: "a"}, "key 1"),
        ({1, 2}, "set"),
        (b"bytes", "bytes"),
        ((1, 2), "tuple"),
        (datetime.now(UTC), "datetime"),
        (2**64, "64 bits"),
        (-(2**63) - 1, "64 bits"),
    ],
)
def test_values_json_cannot_hold_are_rejected(value: object, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        TrajectoryMemory(query="q", outcome=value)


def test_deep_nesting_is_rejected() -> None:
    deep: object = 1
    for _ in range(200):
        deep = [deep]
    with pytest.raises(ValidationError, match="nested deeper"):
        WorkspaceMemory(state=deep)


def test_lone_surrogate_in_text_field_is_rejected() -> None:
    with pytest.raises(ValidationError, match="lone surrogate"):
        PersonaMemory(topic="tone", preference="x\udc80")


def test_json_values_round_trip_exactly() -> None:
    outcome = {"ints": [0, -(2**63), 2**64 - 1], "float": 0.1, "nested": {"t": [True, None]}}
    memory = TrajectoryMemory(query="q", trace=[outcome], outcome=outcome)
    assert TrajectoryMemory.model_validate_json(memory.model_dump_json()) == memory


def test_timestamps_must_be_aware_and_are_normalised_to_utc() -> None:
    content = PersonaMemory(topic="t", preference="p")
    with pytest.raises(ValidationError, match="timezone-aware"):
        MemoryRecord.of(content, created_at=datetime(2026, 1, 1))
    with pytest.raises(ValidationError, match="ISO 8601"):
        MemoryRecord.of(content, created_at=1_700_000_000)
    plus_two = timezone(timedelta(hours=2))
    record = MemoryRecord.of(content, created_at=datetime(2026, 1, 1, 2, tzinfo=plus_two))
    assert record.created_at == datetime(2026, 1, 1, tzinfo=UTC)
    assert record.created_at.utcoffset() == timedelta(0)


def test_updated_before_created_is_rejected() -> None:
    now = datetime.now(UTC)
    with pytest.raises(ValidationError, match="earlier than created_at"):
        MemoryRecord.of(
            content=PersonaMemory(topic="t", preference="p"),
            created_at=now,
            updated_at=now - timedelta(seconds=1),
        )


def test_ids_are_unique_sortable_and_validated() -> None:
    ids = [new_memory_id() for _ in range(10_000)]
    assert len(set(ids)) == len(ids)
    assert ids == sorted(ids)
    with pytest.raises(ValidationError, match="not a memory id"):
        MemoryRecord.of(PersonaMemory(topic="t", preference="p"), id="../../etc")


def test_records_are_immutable() -> None:
    record = MemoryRecord.of(PersonaMemory(topic="t", preference="p"))
    with pytest.raises(ValidationError, match="frozen"):
        record.layer = "trajectory"  # type: ignore[misc]


def test_embedding_must_match_its_dimension_and_be_finite() -> None:
    embedding = Embedding.of("hash", [0.5, -1.0])
    assert (embedding.dim, embedding.array().tolist()) == (2, [0.5, -1.0])
    with pytest.raises(ValidationError, match="3 values, dim says 2"):
        Embedding(model="hash", dim=2, vector=np.ones(3, "<f4").tobytes())
    with pytest.raises(ValidationError, match="finite"):
        Embedding.of("hash", [float("nan")])
    with pytest.raises(ValidationError, match="model"):
        Embedding.of("", [1.0])
    with pytest.raises(ValueError, match="one vector"):
        Embedding.of("hash", [[1.0]])


def test_embedding_is_base64_float32_in_json() -> None:
    embedding = Embedding.of("hash", [0.1, 2.0, -3.5])
    data = orjson.loads(embedding.model_dump_json())
    assert data == {
        "model": "hash",
        "dim": 3,
        "vector": base64.b64encode(np.array([0.1, 2.0, -3.5], "<f4").tobytes()).decode(),
    }
    assert Embedding.model_validate_json(embedding.model_dump_json()) == embedding


def test_record_json_round_trip_for_each_layer() -> None:
    for content in (
        TrajectoryMemory(query="q", trace=["a", {"b": [1, 2.5]}], outcome=None, insight="i"),
        WorkspaceMemory(task={"k": "v"}, interaction=[1], state="done"),
        PersonaMemory(topic="tone", preference="terse", strategy="no preamble"),
    ):
        record = MemoryRecord.of(content=content, embedding=Embedding.of("m", [0.25, 1.0]))
        assert MemoryRecord.model_validate_json(record.model_dump_json()) == record


def test_raw_task_record_is_strict() -> None:
    record = RawTaskRecord(
        user_id="u",
        query="q",
        persona=[PersonaMemory(topic="t", preference="p")],
    )
    assert record.persona[0].topic == "t"
    with pytest.raises(ValidationError, match="persona"):
        RawTaskRecord(user_id="u", query="q", persona=[{"topic": "t"}])
    with pytest.raises(ValidationError, match="user_id"):
        RawTaskRecord(user_id="", query="q")


def test_unknown_layer_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown memory layer 'episodic'"):
        content_type("episodic")  # type: ignore[arg-type]
