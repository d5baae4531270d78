"""A person's corrections in Python: edit, forget, bury and unbury on `MemoryBank`."""

from __future__ import annotations

from pathlib import Path

import pytest

from autopersona_flows.errors import CorrectionError, EmbeddingMismatchError, MemoryNotFoundError
from autopersona_flows.memory import (
    FunctionEmbedder,
    JsonlMemoryStore,
    MemoryBank,
    PersonaMemory,
    SearchRequest,
)
from autopersona_flows.memory.maintenance import consolidate_duplicates


def found(bank: MemoryBank, query: str) -> list[str]:
    search = SearchRequest(layer="persona", query=query)
    return [scored.record.id for scored in bank.retrieve("ada", [search], top_k=10)]


def test_edit_is_a_revision_seen_by_the_next_retrieval(store: JsonlMemoryStore) -> None:
    bank = MemoryBank(store)
    record = bank.add("ada", PersonaMemory(topic="citation style", preference="MLA"))
    assert found(bank, "citation style") == [record.id]  # the index is warm
    edited = bank.edit("ada", record.id, {"preference": "APA"}, reason="she said so")
    assert (edited.id, edited.created_at, edited.content.preference) == (  # type: ignore[union-attr]
        record.id,
        record.created_at,
        "APA",
    )
    assert edited.embedding is not None
    assert edited.embedding != record.embedding
    (hit,) = bank.retrieve("ada", [SearchRequest(layer="persona", query="APA")])
    assert hit.record == edited
    (change,) = bank.history("ada", "persona", record.id)
    assert (change.before, change.after, change.reason) == (
        record,
        edited,
        "edited by a person: she said so",
    )
    assert bank.edit("ada", record.id, {"preference": "APA"}) == edited  # nothing to change
    assert len(bank.history("ada", "persona")) == 1


def test_bury_hides_from_every_lookup_and_survives_edits(store: JsonlMemoryStore) -> None:
    bank = MemoryBank(store)
    content = PersonaMemory(topic="tone", preference="terse", contexts=["node-a"])
    record = bank.add("ada", content)
    assert found(bank, "tone") == [record.id]
    buried = bank.bury("ada", record.id)
    assert buried.buried_at is not None
    assert buried.at == record.at
    assert found(bank, "tone") == []
    assert bank.retriever.find_exact("ada", "persona", content) is None
    assert bank.retriever.learned_at("ada", ["node-a"]) == []
    assert bank.retriever.containing("ada", "persona", ["terse"]) == []
    edited = bank.edit("ada", record.id, {"preference": "warm"})
    assert edited.buried_at == buried.buried_at
    assert found(bank, "warm") == []
    # A fresh bank over the same folder (another process) sees it buried too.
    assert found(MemoryBank(JsonlMemoryStore(store.root)), "tone warm") == []
    assert bank.unbury("ada", record.id).buried_at is None
    assert found(bank, "tone warm") == [record.id]


def test_forget_leaves_the_bank_for_the_history(store: JsonlMemoryStore) -> None:
    bank = MemoryBank(store)
    record = bank.add("ada", PersonaMemory(topic="tone", preference="terse"))
    assert bank.forget("ada", record.id, reason="wrong") == record
    assert found(bank, "tone terse") == []
    with pytest.raises(MemoryNotFoundError):
        bank.find("ada", record.id)
    assert [c.operation for c in bank.history("ada", "persona", record.id)] == ["delete"]


def test_maintenance_never_merges_a_buried_memory(store: JsonlMemoryStore) -> None:
    bank = MemoryBank(store)
    live = bank.add("ada", PersonaMemory(topic="tone", preference="terse"))
    twin = bank.add("ada", PersonaMemory(topic="tone", preference="terse"))
    bank.bury("ada", twin.id)  # the newer twin: it would otherwise be kept, the live one deleted
    assert consolidate_duplicates(store, "ada", "persona") == []
    assert {r.id for r in store.list("ada", "persona")} == {live.id, twin.id}


def test_bad_corrections_are_typed_errors_and_write_nothing(tmp_path: Path) -> None:
    store = JsonlMemoryStore(tmp_path / "store")
    bank = MemoryBank(store)
    record = bank.add("ada", PersonaMemory(topic="tone", preference="terse"))
    before = store.snapshot_fingerprint("ada")
    with pytest.raises(CorrectionError, match="no field 'colour'"):
        bank.edit("ada", record.id, {"colour": "blue"})
    with pytest.raises(CorrectionError, match="nothing to change"):
        bank.edit("ada", record.id, {})
    with pytest.raises(CorrectionError, match="preference"):
        bank.edit("ada", record.id, {"preference": 3})
    with pytest.raises(CorrectionError, match="not a memory id"):
        bank.bury("ada", "x")
    with pytest.raises(MemoryNotFoundError):
        bank.forget("ada", record.id, layer="trajectory")
    other = MemoryBank(
        store, FunctionEmbedder(lambda texts: [[1.0] * 8 for _ in texts], name="other", dim=8)
    )
    with pytest.raises(EmbeddingMismatchError, match="edit with the store's embedder"):
        other.edit("ada", record.id, {"preference": "warm"})
    assert store.snapshot_fingerprint("ada") == before
    assert store.history("ada", "persona") == []


def test_an_unburied_record_keeps_its_old_bytes(store: JsonlMemoryStore) -> None:
    # buried_at is left out of the stored form while unset: a record written before
    # burial existed keeps its bytes, digest and snapshot fingerprint.
    record = MemoryBank(store).add("ada", PersonaMemory(topic="tone", preference="terse"))
    assert "buried_at" not in record.model_dump_json()
