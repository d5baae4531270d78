"""MemoryBank: one object for the store, embedder, retriever and updater."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from autopersona_flows import MemoryBank as TopLevelMemoryBank
from autopersona_flows.errors import ConfigurationError, MemoryBankError, MemoryStoreError
from autopersona_flows.memory import (
    ExtractedMemory,
    HashingEmbedder,
    JsonlMemoryStore,
    MemoryBank,
    MemoryRetriever,
    MemoryUpdater,
    PersonaMemory,
    RawTaskRecord,
    SearchRequest,
    TrajectoryMemory,
)
from autopersona_flows.memory.encoders import shared_encoder

TONE = SearchRequest(layer="persona", query="which tone should I write in?")


class CountingEmbedder(HashingEmbedder):
    """Counts the texts it embeds."""

    def __init__(self) -> None:
        super().__init__()
        self.texts: list[str] = []

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.texts += texts
        return super().embed(texts)


def test_a_bank_from_a_path_string_adds_updates_retrieves_and_keeps_history(
    tmp_path: Path,
) -> None:
    bank = MemoryBank(str(tmp_path / "memory"))
    assert isinstance(bank.store, JsonlMemoryStore)
    assert bank.store.root == tmp_path / "memory"
    assert bank.embedder is shared_encoder()  # the default: the shipped sentence encoder

    first = bank.add("ada", PersonaMemory(topic="tone", preference="formal"))
    (found,) = bank.retrieve("ada", [TONE])
    assert found.record == first

    decision = bank.update("ada", "persona", PersonaMemory(topic="tone", preference="casual"))
    assert decision.operation == "update"
    (found,) = bank.retrieve("ada", [TONE])
    assert isinstance(found.record.content, PersonaMemory)
    assert found.record.content.preference == "casual"
    (change,) = bank.history("ada", "persona")
    assert change.before == first
    # The same folder opened again sees what the bank wrote.
    assert JsonlMemoryStore(tmp_path / "memory").list("ada", "persona") == [decision.record]


def test_a_bank_also_takes_a_path_and_a_store(tmp_path: Path) -> None:
    for address, root in [(tmp_path / "a", "a"), (f"jsonl:{tmp_path / 'c'}", "c")]:
        store = MemoryBank(address).store
        assert isinstance(store, JsonlMemoryStore)
        assert store.root == tmp_path / root
    given = JsonlMemoryStore(tmp_path / "b")
    assert MemoryBank(given).store is given
    assert TopLevelMemoryBank is MemoryBank


def test_the_retriever_and_updater_share_the_store_embedder_and_index(tmp_path: Path) -> None:
    embedder = CountingEmbedder()
    bank = MemoryBank(tmp_path, embedder)

    assert bank.retriever.store is bank.store
    assert bank.updater.store is bank.store
    assert bank.retriever.embedder is embedder
    assert bank.updater.embedder is embedder
    assert bank.embedder is embedder
    assert bank.updater.retriever is bank.retriever

    bank.retrieve("ada", [TONE])  # builds the (ada, persona) index
    embedder.texts.clear()
    bank.update("ada", "persona", PersonaMemory(topic="tone", preference="formal"))
    written = list(embedder.texts)
    (found,) = bank.retrieve("ada", [TONE])
    assert found.record.content == PersonaMemory(topic="tone", preference="formal")
    # The retrieval embedded its query (cached from the first call) and nothing else:
    # the written memory reached its index with the embedding the updater computed.
    assert embedder.texts == written


def test_ingest_takes_one_task_or_many_with_the_bank_s_extractor(tmp_path: Path) -> None:
    class Extractor:
        def __init__(self) -> None:
            self.seen: list[str] = []

        def extract(self, record: RawTaskRecord) -> list[ExtractedMemory]:
            self.seen.append(record.query)
            return [ExtractedMemory(content=PersonaMemory(topic="diet", preference="vegetarian"))]

    extractor = Extractor()
    bank = MemoryBank(str(tmp_path), extractor=extractor)
    at = datetime(2026, 3, 1, tzinfo=UTC)
    task = RawTaskRecord(user_id="ada", query="order groceries", outcome="ordered", at=at)

    result = bank.ingest(task)
    assert result.counts() == {"trajectory:add": 1, "persona:add": 1}
    again = bank.ingest([task, task.model_copy(update={"query": "plan dinner"})])
    assert [r.counts() for r in again] == [
        {"trajectory:noop": 1, "persona:noop": 1},
        {"trajectory:add": 1, "persona:noop": 1},
    ]
    assert extractor.seen == ["order groceries", "order groceries", "plan dinner"]
    queries = {
        r.content.query
        for r in bank.store.list("ada", "trajectory")
        if isinstance(r.content, TrajectoryMemory)
    }
    assert queries == {"order groceries", "plan dinner"}


@pytest.mark.parametrize("store", [42, None, MemoryRetriever])
def test_a_store_that_is_neither_a_store_nor_an_address_is_a_typed_error(store: object) -> None:
    with pytest.raises(MemoryBankError, match="store must be a MemoryStore or its address"):
        MemoryBank(store)  # type: ignore[arg-type]
    assert issubclass(MemoryBankError, ConfigurationError)
    assert issubclass(MemoryBankError, TypeError)


def test_an_address_of_another_kind_is_a_store_error() -> None:
    with pytest.raises(MemoryStoreError, match="unsupported store address"):
        MemoryBank("s3://bucket/memory")


def test_other_parts_of_the_wrong_kind_are_typed_errors(tmp_path: Path) -> None:
    with pytest.raises(MemoryBankError, match="embedder must be an Embedder"):
        MemoryBank(tmp_path, lambda texts: texts)  # type: ignore[arg-type]
    with pytest.raises(MemoryBankError, match="extractor must be an Extractor"):
        MemoryBank(tmp_path, extractor=object())  # type: ignore[arg-type]
    with pytest.raises(MemoryBankError, match="RawTaskRecord"):
        MemoryBank(tmp_path).ingest({"user_id": "ada", "query": "q"})  # type: ignore[call-overload]
    with pytest.raises(MemoryBankError, match="MemoryRetriever"):
        MemoryBank.from_retriever(JsonlMemoryStore(tmp_path))  # type: ignore[arg-type]


def test_a_bank_over_parts_built_by_hand_keeps_them(tmp_path: Path) -> None:
    store = JsonlMemoryStore(tmp_path)
    retriever = MemoryRetriever(store)
    updater = MemoryUpdater(store, retriever=retriever)
    bank = MemoryBank.from_retriever(retriever, updater)
    assert (bank.store, bank.retriever, bank.updater) == (store, retriever, updater)
    assert MemoryBank.from_retriever(retriever).updater.retriever is retriever
    with pytest.raises(ValueError, match="store object"):
        MemoryBank.from_retriever(retriever, MemoryUpdater(JsonlMemoryStore(tmp_path)))
