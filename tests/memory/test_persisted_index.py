"""Saved indexes of JSONL banks: the same scores as an index built in memory, never stale."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from autopersona_flows import JsonlMemoryStore, PersonaMemory
from autopersona_flows.errors import MemoryStoreCorruptionError
from autopersona_flows.memory import HashingEmbedder, MemoryRetriever, SearchRequest, persisted
from autopersona_flows.memory._banks import LogEntry, scan_entries
from autopersona_flows.memory.index import BankIndex, Scoring
from autopersona_flows.memory.persisted import BankLog
from autopersona_flows.memory.records import MemoryRecord
from autopersona_flows.memory.updates import embed_records
from autopersona_flows.memory.users import user_key

USER = "ada"
WORDS = "aisle window seat meal vegan tea coffee train flight hotel quiet early late memo".split()


@pytest.fixture(autouse=True)
def small_banks_are_saved(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(BankLog, "min_rows", 10)
    monkeypatch.setattr(BankLog, "save_every", 8)


def _content(rng: random.Random) -> PersonaMemory:
    return PersonaMemory(
        topic=" ".join(rng.sample(WORDS, 2)), preference=" ".join(rng.sample(WORDS, 3))
    )


def _fill(store: JsonlMemoryStore, rng: random.Random, adds: int) -> None:
    for _ in range(adds):
        store.add(USER, _content(rng))
    ids = [record.id for record in store.list(USER, "persona")]
    for memory_id in rng.sample(ids, len(ids) // 5):
        store.update(USER, "persona", memory_id, _content(rng))
    for memory_id in rng.sample(ids, len(ids) // 6):
        store.delete(USER, "persona", memory_id)


def _scores(index: BankIndex, query: str) -> dict[str, float]:
    vector = index.embedder.embed([query])
    scores = index.scores_many([query], vector)[0]
    return {
        record.id: float(scores[row])
        for row in range(index.size)
        if (record := index.record(row)) is not None
    }


def _in_memory(store: JsonlMemoryStore) -> BankIndex:
    """The index of the store's change feed: what a non-JSONL store's retriever builds."""
    index = BankIndex(HashingEmbedder(), Scoring())
    index.apply(JsonlMemoryStore(store.root).changes(USER, "persona"))
    return index


def _fresh(root: Path) -> BankIndex:
    """The index a fresh process's retriever holds after its first retrieval."""
    retriever = MemoryRetriever(JsonlMemoryStore(root), HashingEmbedder())
    retriever.retrieve(USER, [SearchRequest(layer="persona", query="seat")])
    return retriever._indexes[(USER, "persona")][1]


def _index_files(root: Path) -> list[Path]:
    return sorted((root / "users" / user_key(USER)).glob("persona.*.index"))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_saved_index_scores_exactly_as_one_built_in_memory(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    store = JsonlMemoryStore(tmp_path)
    _fill(store, rng, 60)
    first = _fresh(tmp_path)  # reads the bank whole and saves its index
    assert _index_files(tmp_path)
    _fill(store, rng, 20)  # more than the saved index covers: updates and deletes too
    loaded = _fresh(tmp_path)  # loads it, then reads only the rest
    assert loaded.cursor != first.cursor
    expected = _in_memory(store)
    for query in ["seat", "vegan meal on the train", "quiet hotel early", "nothing shared"]:
        assert _scores(loaded, query) == pytest.approx(_scores(expected, query), abs=1e-6)
    assert len(loaded) == len(expected)


def test_rows_of_the_loaded_and_the_added_part_read_the_vectors_built_in_memory() -> None:
    # A loaded index keeps its saved (mapped) vectors apart from those added since;
    # scoring few rows and compacting gather from both, rows asked for in any order.
    embedder = HashingEmbedder()
    contents = [PersonaMemory(topic=f"topic {i}", preference=f"value {i}") for i in range(1200)]
    seats = [100, 500, 700, 1100]  # two in each part
    for row in seats:
        contents[row] = PersonaMemory(topic="seat", preference=f"seat {row}")
    records = embed_records(embedder, contents)
    by_id = {record.id: record for record in records}
    saved = BankIndex(embedder, Scoring())
    saved.add_records(records[:600], where=[(row, 1) for row in range(600)])
    arrays, values = saved.state()
    for array in arrays.values():
        array.setflags(write=False)  # as mapped from the saved files
    index = BankIndex(embedder, Scoring())
    index.load(arrays, values)
    index.reader = lambda offset, length, memory_id: by_id[memory_id]
    index.add_records(records[600:], where=[(row, 1) for row in range(600, 1200)])
    expected = BankIndex(embedder, Scoring())
    expected.add_records(records)

    # Searches mostly ask for rows in order: ask in one mixing both parts.
    rows = np.random.default_rng(3).permutation(1200)[:300]
    assert 0 < np.count_nonzero(rows < 600) < len(rows)
    np.testing.assert_array_equal(index._vectors_at(rows), expected._vectors_at(rows))
    unit = embedder.embed(["which seat", "value 42"])
    np.testing.assert_allclose(index._dense(unit, rows), expected._dense(unit, rows), atol=1e-6)
    scores = index.scores_many(["which seat"], unit[:1], wanted=4)[0]
    assert (scores != -1).sum() < 50  # scored few rows, the seats of both parts among them
    assert sorted(np.argsort(-scores)[:4].tolist()) == seats
    full = expected.scores_many(["which seat"], unit[:1])[0]
    np.testing.assert_allclose(scores[seats], full[seats], atol=1e-6)

    index.remove(record.id for record in records[50:1150])  # more dead rows than live ones
    expected.remove(record.id for record in records[50:1150])
    assert index.size == len(index) == 100  # compacted
    assert _scores(index, "which seat") == pytest.approx(_scores(expected, "which seat"))


def test_a_fresh_process_reads_only_what_the_saved_index_does_not_cover(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(7)
    store = JsonlMemoryStore(tmp_path)
    _fill(store, rng, 40)
    _fresh(tmp_path)
    store.add(USER, PersonaMemory(topic="quokka", preference="counts quokkas"))
    read_back: list[str] = []
    original = MemoryRecord.model_validate_json

    def spy(data: str | bytes, **kwargs: object) -> MemoryRecord:
        read_back.append("record")
        return original(data, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(MemoryRecord, "model_validate_json", spy)
    scanned = _count_scans(monkeypatch)
    retriever = MemoryRetriever(JsonlMemoryStore(tmp_path), HashingEmbedder())
    bundle = retriever.retrieve(USER, [SearchRequest(layer="persona", query="quokka")], top_k=1)
    assert bundle.persona[0].record.content.topic == "quokka"
    assert scanned == [1]  # the bank's lines past the saved index: the one add
    assert len(read_back) <= 1  # the hit read back, and nothing else of the bank's records


def test_a_saved_index_saved_again_appends_its_new_vectors_and_is_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(9)
    store = JsonlMemoryStore(tmp_path)
    _fill(store, rng, 40)
    _fresh(tmp_path)  # saved
    folder = tmp_path / "users" / user_key(USER)
    (vectors,) = folder.glob("persona.*.vectors")
    size = vectors.stat().st_size
    _fill(store, rng, 20)
    _fresh(tmp_path)  # loads it, reads the rest, and saves again
    assert list(folder.glob("persona.*.vectors")) == [vectors]
    assert vectors.stat().st_size > size  # the new rows, appended
    scanned = _count_scans(monkeypatch)
    loaded = _fresh(tmp_path)
    assert scanned == [0]  # served: nothing past the second save is read
    for query in ["seat", "vegan meal on the train"]:
        assert _scores(loaded, query) == pytest.approx(_scores(_in_memory(store), query), abs=1e-6)


def _count_scans(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record how many bank lines each read of a bank's uncovered part scans."""
    scanned: list[int] = []

    def scan(data: bytes, *args: Any) -> tuple[list[LogEntry], int]:
        entries, end = scan_entries(data, *args)
        scanned.append(len(entries))
        return entries, end

    monkeypatch.setattr(persisted, "scan_entries", scan)
    return scanned


def _saved_then_changed(tmp_path: Path) -> JsonlMemoryStore:
    store = JsonlMemoryStore(tmp_path)
    _fill(store, random.Random(5), 30)
    _fresh(tmp_path)
    return store


def _assert_not_served(tmp_path: Path, store: JsonlMemoryStore) -> None:
    expected = _in_memory(store)
    rebuilt = _fresh(tmp_path)
    assert _scores(rebuilt, "seat window") == pytest.approx(_scores(expected, "seat window"))


def test_a_stale_index_after_a_compaction_is_rebuilt_not_served(tmp_path: Path) -> None:
    store = _saved_then_changed(tmp_path)
    for record in store.list(USER, "persona")[:10]:
        store.update(USER, "persona", record.id, PersonaMemory(topic="tea", preference="green"))
    store.compact(USER)  # a new generation: every offset moved
    _assert_not_served(tmp_path, store)


def test_a_torn_index_file_is_rebuilt_not_served(tmp_path: Path) -> None:
    store = _saved_then_changed(tmp_path)
    [path] = _index_files(tmp_path)
    path.write_bytes(path.read_bytes()[:-100])  # cut short
    _assert_not_served(tmp_path, store)
    [path] = _index_files(tmp_path)
    vectors = next(path.parent.glob("persona.*.vectors"))
    vectors.write_bytes(vectors.read_bytes()[:64])  # vectors file shorter than its rows
    _assert_not_served(tmp_path, store)


def test_a_foreign_index_file_is_rebuilt_not_served(tmp_path: Path) -> None:
    store = _saved_then_changed(tmp_path)
    other = JsonlMemoryStore(tmp_path / "other")
    _fill(other, random.Random(9), 30)
    _fresh(tmp_path / "other")  # bob's index, copied over ada's
    [mine] = _index_files(tmp_path)
    [theirs] = _index_files(tmp_path / "other")
    mine.write_bytes(theirs.read_bytes())
    for vectors in theirs.parent.glob("persona.*.vectors"):
        (mine.parent / vectors.name).write_bytes(vectors.read_bytes())
    _assert_not_served(tmp_path, store)


def test_a_bank_changed_in_place_under_its_index_is_caught_when_read_back(
    tmp_path: Path,
) -> None:
    store = _saved_then_changed(tmp_path)
    bank = tmp_path / "users" / user_key(USER) / "persona.jsonl"
    data = bank.read_bytes()
    second = data.index(b"\n", data.index(b"\n") + 1) + 1  # the second entry's line
    at = data.index(b'"id":"', second) + len(b'"id":"') + 25  # the id's last character
    other = b"0" if data[at : at + 1] != b"0" else b"1"
    bank.write_bytes(data[:at] + other + data[at + 1 :])  # another id, same length
    # Far before the covered offset, so not in its check: caught when read back.
    retriever = MemoryRetriever(JsonlMemoryStore(tmp_path), HashingEmbedder())
    searches = [SearchRequest(layer="persona", query=word) for word in WORDS]
    with pytest.raises(MemoryStoreCorruptionError, match="changed in place"):
        retriever.retrieve(USER, searches, top_k=50)  # reads back every record
    assert not _index_files(tmp_path)  # removed: the next process reads the bank whole
    del store


def test_a_crash_while_saving_loses_nothing_but_time(tmp_path: Path) -> None:
    store = _saved_then_changed(tmp_path)
    [path] = _index_files(tmp_path)
    # A writer killed mid-save leaves a temporary file and vectors past the count.
    (path.parent / f".{path.name}.abc.tmp").write_bytes(b"half an index")
    vectors = next(path.parent.glob("persona.*.vectors"))
    with vectors.open("ab") as file:
        file.write(np.ones(7, dtype="<f4").tobytes())
    _fill(store, random.Random(11), 20)
    _assert_not_served(tmp_path, store)
    again = _fresh(tmp_path)  # saved again over the leftovers, and loads
    assert _scores(again, "seat") == pytest.approx(_scores(_in_memory(store), "seat"))
    assert not list(path.parent.glob(".*.tmp"))  # the leftover was cleared by the save
    assert len(list(path.parent.glob("persona.*.vectors"))) == 1


def test_recency_weighs_every_row_as_the_time_view_says(tmp_path: Path) -> None:
    from datetime import UTC, datetime, timedelta

    from autopersona_flows.memory.index import TimeView

    store = JsonlMemoryStore(tmp_path)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    for day in range(30):
        said = start + timedelta(days=day)
        store.add(USER, MemoryRecord.of(_content(random.Random(day)), stated_at=said))
    index = _fresh(tmp_path)
    query = "seat window"
    vector = index.embedder.embed([query])
    plain = index.scores_many([query], vector)[0]
    for half_life in (1.0, 3600.0, 86400.0 * 90):
        for as_of in (start + timedelta(days=40), start - timedelta(days=400)):
            view = TimeView(as_of.timestamp(), past=True, half_life=half_life)
            weighed = index.scores_many([query], vector, view)[0]
            expected = plain * view.weights(index._at[: index.size])
            assert weighed == pytest.approx(expected, rel=1e-6)
        store.add(USER, _content(random.Random(half_life)))  # a row more: kept factors grow
        index = _fresh(tmp_path)
        plain = index.scores_many([query], vector)[0]


def test_a_retriever_keeps_its_indexes_within_its_memory_bound(tmp_path: Path) -> None:
    store = JsonlMemoryStore(tmp_path)
    for user in ("ann", "bob", "cy"):
        store.add(user, PersonaMemory(topic="seat", preference=f"{user} wants the aisle"))
    one_bank = MemoryRetriever(store, HashingEmbedder())
    one_bank.retrieve("ann", [SearchRequest(layer="persona", query="seat")])
    bound = one_bank.cached_bytes() + 1  # room for one bank's index, not two
    retriever = MemoryRetriever(store, HashingEmbedder(), max_cached_bytes=bound)
    for user in ("ann", "bob", "cy", "ann"):
        [found] = retriever.retrieve(user, [SearchRequest(layer="persona", query="seat")]).persona
        assert found.record.content.preference == f"{user} wants the aisle"
        assert list(retriever._indexes) == [(user, "persona")]  # the others were dropped
        assert retriever.cached_bytes() <= bound


# After "go", adds memories and searches with a fresh retriever after each, which saves
# the bank's index every entry: most of its time is spent saving, where a kill lands.
SAVING_CHILD = """
import random, sys
from autopersona_flows.memory import HashingEmbedder, JsonlMemoryStore, MemoryRetriever
from autopersona_flows.memory import PersonaMemory, SearchRequest
from autopersona_flows.memory.persisted import BankLog

BankLog.min_rows, BankLog.save_every = 10, 1
root, user, run = sys.argv[1], sys.argv[2], int(sys.argv[3])
if sys.stdin.readline() != "go\\n":
    sys.exit()
rng, words = random.Random(run), sys.argv[4].split()
print("started", flush=True)
while True:
    store = JsonlMemoryStore(root)
    said = " ".join(rng.sample(words, 3))
    store.add(user, PersonaMemory(topic=rng.choice(words), preference=said))
    retriever = MemoryRetriever(store, HashingEmbedder())
    retriever.retrieve(user, [SearchRequest(layer="persona", query=rng.choice(words))])
"""


@pytest.mark.slow
def test_sigkill_while_saving_an_index_loses_nothing_but_time(tmp_path: Path) -> None:
    store = JsonlMemoryStore(tmp_path)
    _fill(store, random.Random(3), 30)
    for run in range(8):
        child = subprocess.Popen(
            [sys.executable, "-c", SAVING_CHILD, str(tmp_path), USER, str(run), " ".join(WORDS)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdin is not None
        assert child.stdout is not None
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline() == "started\n"
        time.sleep(0.2 + random.Random(run).random() * 0.5)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
        child.stdout.close()
        child.stdin.close()
        loaded = _fresh(tmp_path)  # whatever the kill left, never served stale
        expected = _in_memory(store)
        assert len(loaded) == len(expected)
        for query in ["seat", "quiet hotel early"]:
            assert _scores(loaded, query) == pytest.approx(_scores(expected, query), abs=1e-6)


def test_a_memory_that_expires_between_two_searches_is_left_out_of_the_second(
    tmp_path: Path,
) -> None:
    from datetime import UTC, datetime, timedelta

    store = JsonlMemoryStore(tmp_path)
    ends = datetime.now(UTC) + timedelta(seconds=1)
    brief = store.add(
        USER, MemoryRecord.of(PersonaMemory(topic="seat", preference="aisle"), valid_until=ends)
    )
    store.add(USER, PersonaMemory(topic="seat", preference="window"))
    retriever = MemoryRetriever(store, HashingEmbedder())
    search = [SearchRequest(layer="persona", query="seat aisle")]
    assert brief.id in {found.record.id for found in retriever.retrieve(USER, search).persona}
    time.sleep(max(0.0, (ends - datetime.now(UTC)).total_seconds()) + 0.05)
    assert brief.id not in {found.record.id for found in retriever.retrieve(USER, search).persona}


def test_a_store_that_overrides_its_change_feed_is_read_through_it(tmp_path: Path) -> None:
    reads: list[str] = []

    class Counting(JsonlMemoryStore):
        def changes(self, user_id: str, layer: Any, since: str | None = None) -> Any:
            reads.append(layer)
            return super().changes(user_id, layer, since)

    store = Counting(tmp_path)
    store.add(USER, PersonaMemory(topic="seat", preference="aisle"))
    assert store.bank_log(USER, "persona") is None
    retriever = MemoryRetriever(store, HashingEmbedder())
    assert retriever.retrieve(USER, [SearchRequest(layer="persona", query="seat")]).persona
    assert reads == ["persona"]
    assert JsonlMemoryStore(tmp_path).bank_log(USER, "persona") is not None
