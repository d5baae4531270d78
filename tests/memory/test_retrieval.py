"""Retrieval per layer: relevance, dedup, thresholds, fill-up, freshness and isolation."""

import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autopersona_flows import (
    InvalidUserIdError,
    JsonlMemoryStore,
    PersonaMemory,
    StoreUnavailableError,
    TrajectoryMemory,
    WorkspaceMemory,
)
from autopersona_flows.errors import EmbeddingMismatchError, RetrievalError
from autopersona_flows.memory import (
    FunctionEmbedder,
    HashingEmbedder,
    MemoryRetriever,
    MemoryUpdater,
    SearchRequest,
)
from autopersona_flows.memory.embedders import Embedder
from autopersona_flows.memory.index import BankIndex, Scoring, TimeView
from autopersona_flows.memory.persisted import BankLog, LogRead
from autopersona_flows.memory.records import Embedding, MemoryRecord
from autopersona_flows.memory.updates import embed_records


class CountingEmbedder:
    """The default embedder, counting every text it is asked to embed."""

    def __init__(self) -> None:
        self.inner = HashingEmbedder()
        self.name, self.dim = self.inner.name, self.inner.dim
        self.texts: list[str] = []

    def embed(self, texts):
        self.texts += texts
        return self.inner.embed(texts)


PREFERENCES = [
    PersonaMemory(topic="citation style", preference="APA 7", strategy="format references in APA"),
    PersonaMemory(topic="tone", preference="terse, no preamble"),
    PersonaMemory(topic="summary length", preference="under 500 words"),
    PersonaMemory(topic="programming language", preference="Python with type hints"),
    PersonaMemory(topic="meeting times", preference="mornings only, never Fridays"),
]


def search(query: str, layer: str = "persona") -> SearchRequest:
    return SearchRequest(layer=layer, query=query)


@pytest.fixture
def seeded(store: JsonlMemoryStore) -> JsonlMemoryStore:
    store.add_many("ada", "persona", embed_records(HashingEmbedder(), PREFERENCES))
    store.add_many(
        "ada",
        "trajectory",
        embed_records(
            HashingEmbedder(),
            [
                TrajectoryMemory(
                    query="format the bibliography", insight="she checks every citation"
                ),
                TrajectoryMemory(query="plan the offsite", trace=["book rooms"], outcome="booked"),
            ],
        ),
    )
    store.add("ada", WorkspaceMemory(state={"draft": "paper/citations.bib"}))
    return store


def test_finds_the_relevant_memory_first(seeded: JsonlMemoryStore) -> None:
    bundle = MemoryRetriever(seeded).retrieve("ada", [search("Which citation style do I use?")])
    assert bundle.persona[0].record.content.topic == "citation style"
    assert bundle.persona[0].search.query == "Which citation style do I use?"
    assert all(0.0 < m.score <= 1.0 for m in bundle)
    assert [m.score for m in bundle.persona] == sorted(
        (m.score for m in bundle.persona), reverse=True
    )


def test_layers_are_searched_separately(seeded: JsonlMemoryStore) -> None:
    bundle = MemoryRetriever(seeded).retrieve(
        "ada",
        [
            search("citation", "persona"),
            search("citation", "trajectory"),
            search("citations", "workspace"),
        ],
        top_k=5,
    )
    assert {m.record.layer for m in bundle.persona} == {"persona"}
    assert bundle.trajectory[0].record.content.query == "format the bibliography"
    assert [m.record.layer for m in bundle.workspace] == ["workspace"]
    assert len(bundle) == len(bundle.persona) + len(bundle.trajectory) + len(bundle.workspace)


def test_top_k_applies_per_search_and_results_are_deduplicated_and_filled_up(
    seeded: JsonlMemoryStore,
) -> None:
    retriever = MemoryRetriever(seeded)
    # The second search also shares a word with the tone ("no preamble").
    same = [search("citation style"), search("citation style APA, no preamble")]
    bundle = retriever.retrieve("ada", same, top_k=1)
    ids = [m.record.id for m in bundle.persona]
    assert len(ids) == 2  # each search contributes its best new memory
    assert len(set(ids)) == 2  # the second search did not return the first one's find
    assert bundle.persona[0].record.content.topic == "citation style"
    assert bundle.persona[0].search == same[0]


def test_min_similarity_drops_weak_matches(seeded: JsonlMemoryStore) -> None:
    retriever = MemoryRetriever(seeded)
    everything = retriever.retrieve("ada", [search("citation style tone")], top_k=5)
    assert len(everything.persona) >= 2
    cut = (everything.persona[0].score + everything.persona[1].score) / 2
    strict = retriever.retrieve("ada", [search("citation style tone")], top_k=5, min_similarity=cut)
    assert [m.record.id for m in strict.persona] == [everything.persona[0].record.id]
    assert retriever.retrieve("ada", [search("citation")], min_similarity=1.0).persona == []


def test_a_memory_sharing_nothing_with_the_query_is_not_returned(store: JsonlMemoryStore) -> None:
    store.add("ada", PersonaMemory(topic="tone", preference="terse"))
    retriever = MemoryRetriever(store, scoring=Scoring(dense_weight=0.0))
    assert retriever.retrieve("ada", [search("quantum chromodynamics")]).persona == []


def test_by_default_a_memory_unrelated_in_words_and_meaning_is_not_returned(
    store: JsonlMemoryStore,
) -> None:
    # The default embedder's floor: a chance cosine between unrelated texts adds nothing.
    store.add("ada", PersonaMemory(topic="tone", preference="formal"))
    store.add("ada", PersonaMemory(topic="seat", preference="aisle on trains"))
    retriever = MemoryRetriever(store)
    for query in ("dairy", "what milk do I drink", "lactose"):
        assert retriever.retrieve("ada", [search(query)]).persona == [], query
    [seat] = retriever.retrieve("ada", [search("train seat")]).persona
    assert seat.record.content.topic == "seat"


def test_repeating_a_memory_scores_about_one(seeded: JsonlMemoryStore) -> None:
    bundle = MemoryRetriever(seeded).retrieve("ada", [search("tone terse, no preamble")], top_k=1)
    assert bundle.persona[0].score == pytest.approx(1.0, abs=0.02)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"top_k": 0}, "top_k must be a positive int"),
        ({"top_k": True}, "top_k must be a positive int"),
        ({"top_k": 2.0}, "top_k must be a positive int"),
        ({"min_similarity": 1.5}, "min_similarity must be a number in"),
        ({"min_similarity": float("nan")}, "min_similarity must be a number in"),
        ({"min_similarity": -0.1}, "min_similarity must be a number in"),
        ({"min_similarity": False}, "min_similarity must be a number in"),
    ],
)
def test_invalid_arguments_are_clear_errors(store: JsonlMemoryStore, kwargs, message) -> None:
    with pytest.raises(RetrievalError, match=message):
        MemoryRetriever(store).retrieve("ada", [search("x")], **kwargs)


def test_invalid_searches_are_clear_errors(store: JsonlMemoryStore) -> None:
    with pytest.raises(ValueError, match="layer"):
        search("x", "episodic")
    with pytest.raises(RetrievalError, match=r"searches\[0\] must be a SearchRequest"):
        MemoryRetriever(store).retrieve("ada", [("persona", "x")])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="must be a str"):
        MemoryRetriever(store).retrieve(None, [search("x")])  # type: ignore[arg-type]
    assert len(MemoryRetriever(store).retrieve("ada", [])) == 0


def test_writes_are_visible_to_the_very_next_call(store: JsonlMemoryStore) -> None:
    retriever = MemoryRetriever(store)
    assert retriever.retrieve("ada", [search("favourite editor")]).persona == []
    record = store.add("ada", PersonaMemory(topic="favourite editor", preference="vim"))
    assert retriever.retrieve("ada", [search("favourite editor")]).persona[0].record == record
    updated = store.update(
        "ada", "persona", record.id, PersonaMemory(topic="favourite editor", preference="emacs")
    )
    assert retriever.retrieve("ada", [search("favourite editor")]).persona[0].record == updated
    store.delete("ada", "persona", record.id)
    assert retriever.retrieve("ada", [search("favourite editor")]).persona == []
    # Writes through another store instance (as another process would) count too.
    other = JsonlMemoryStore(store.root).add(
        "ada", PersonaMemory(topic="favourite editor", preference="nano")
    )
    assert retriever.retrieve("ada", [search("favourite editor")]).persona[0].record == other


def test_retrieval_embeds_the_queries_never_the_bank(seeded: JsonlMemoryStore) -> None:
    embedder = CountingEmbedder()
    retriever = MemoryRetriever(seeded, embedder)
    for i in range(5):
        retriever.retrieve("ada", [search(f"citation {i}"), search("plan", "trajectory")])
    # Each query text once: a query asked again is not embedded again either.
    assert embedder.texts == ["citation 0", "plan", *(f"citation {i}" for i in range(1, 5))]
    # A memory stored without an embedding is embedded once, when first indexed.
    seeded.add("ada", PersonaMemory(topic="editor", preference="vim"))
    retriever.retrieve("ada", [search("editor")])
    retriever.retrieve("ada", [search("editor")])
    assert sorted(embedder.texts[-2:]) == ["editor", "editor vim"]


def test_many_updates_keep_the_index_correct(store: JsonlMemoryStore, monkeypatch) -> None:
    monkeypatch.setattr(JsonlMemoryStore, "compact_min_dead", 8)
    retriever = MemoryRetriever(store)
    records = store.add_many(
        "ada", "persona", [PersonaMemory(topic=f"topic {i}", preference="old") for i in range(20)]
    )
    for round_ in range(60):  # enough to compact both the file and the index
        record = records[round_ % 20]
        records[round_ % 20] = store.update(
            "ada",
            "persona",
            record.id,
            PersonaMemory(topic=record.content.topic, preference=f"value {round_}"),
        )
        found = retriever.retrieve(
            "ada", [search(f"{record.content.topic} value {round_}")], top_k=1
        )
        assert found.persona[0].record == records[round_ % 20]
    everything = retriever.retrieve("ada", [search("topic")], top_k=100)
    assert sorted(m.record.id for m in everything.persona) == sorted(r.id for r in records)


def test_another_embedder_is_detected(store: JsonlMemoryStore) -> None:
    store.add_many("ada", "persona", embed_records(HashingEmbedder(dim=64), PREFERENCES[:1]))
    remote = FunctionEmbedder(lambda texts: np.ones((len(texts), 8)), name="remote", dim=8)
    with pytest.raises(EmbeddingMismatchError, match="autopersona reindex"):
        MemoryRetriever(store, remote).retrieve("ada", [search("citation")])
    other_dim = FunctionEmbedder(
        lambda texts: np.ones((len(texts), 64)), name="hashing-v1-256", dim=64
    )
    with pytest.raises(EmbeddingMismatchError, match="64 dimensions"):
        MemoryRetriever(store, other_dim).retrieve("ada", [search("citation")])


def test_a_local_embedder_embeds_a_bank_written_by_another_again(
    store: JsonlMemoryStore, caplog: pytest.LogCaptureFixture
) -> None:
    """A store written before the default embedder changed keeps working, unchanged."""
    store.add_many("ada", "persona", embed_records(HashingEmbedder(dim=64), PREFERENCES[:1]))
    before = store.list("ada", "persona")
    with caplog.at_level("WARNING"):
        found = MemoryRetriever(store).retrieve("ada", [search("citation")])
    assert [m.record.id for m in found.persona] == [before[0].id]
    assert "autopersona reindex" in caplog.text
    assert store.list("ada", "persona") == before  # re-embedded in memory only


def test_a_broken_embedder_is_a_clear_error(store: JsonlMemoryStore) -> None:
    store.add("ada", PersonaMemory(topic="t", preference="p"))
    wrong = FunctionEmbedder(lambda texts: np.ones((len(texts), 3)), name="wrong", dim=4)
    with pytest.raises(ValueError, match=r"returned shape \(1, 3\), expected \(1, 4\)"):
        MemoryRetriever(store, wrong).retrieve("ada", [search("t")])


def test_retrieval_and_updates_run_concurrently_without_deadlock(store: JsonlMemoryStore) -> None:
    retriever = MemoryRetriever(store)
    updater = MemoryUpdater(store, retriever=retriever)
    errors: list[BaseException] = []

    colours = ["red", "green", "blue"]
    things = ["car", "house", "boat", "shirt", "lamp"]

    def write(n: int) -> None:
        try:
            for i in range(40):
                topic = f"{colours[n]} {things[i % 5]}"
                updater.update("ada", "persona", PersonaMemory(topic=topic, preference=f"v{i}"))
        except BaseException as exc:
            errors.append(exc)

    def read() -> None:
        try:
            for i in range(80):
                retriever.retrieve("ada", [search(f"topic {i % 4}")])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(3)]
    threads += [threading.Thread(target=read) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads), "deadlock"
    assert errors == []
    topics = [m.content.topic for m in store.list("ada", "persona")]
    assert sorted(topics) == sorted(f"{c} {t}" for c in colours for t in things)


user_ids = st.sampled_from(["ada", "Ada", "bob", "a/b", "a_b", "ä", "ada "])


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    writes=st.lists(
        st.tuples(user_ids, st.sampled_from(["apples", "pears", "plums"])), min_size=1, max_size=12
    ),
    reader=user_ids,
)
def test_no_retrieval_ever_returns_another_users_memory(tmp_path: Path, writes, reader) -> None:
    store = JsonlMemoryStore(tmp_path / f"s{abs(hash((tuple(writes), reader)))}")
    retriever = MemoryRetriever(store)
    owned: dict[str, set[str]] = {}
    for user, fruit in writes:
        record = store.add(user, PersonaMemory(topic="fruit", preference=f"{fruit} of {user}"))
        owned.setdefault(user, set()).add(record.id)
        found = retriever.retrieve(reader, [search(f"fruit {fruit}")], top_k=20)
        assert {m.record.id for m in found.persona} <= owned.get(reader, set())


def test_exact_duplicates_are_found_until_the_last_copy_is_gone(store: JsonlMemoryStore) -> None:
    content = PersonaMemory(topic="citation style", preference="APA")
    first, second = store.add("ada", content), store.add("ada", content)
    retriever = MemoryRetriever(store)
    assert retriever.find_exact("ada", "persona", content) == first
    store.delete("ada", "persona", first.id)
    assert retriever.find_exact("ada", "persona", content) == second
    store.delete("ada", "persona", second.id)
    assert retriever.find_exact("ada", "persona", content) is None


def test_the_dense_weight_follows_the_embedder_unless_given() -> None:
    from autopersona_flows.memory import MiniLMEmbedder

    store = JsonlMemoryStore("unused-folder-never-written")
    assert MemoryRetriever(store).scoring.dense_weight == 0.5  # the shipped encoder
    assert MemoryRetriever(store, HashingEmbedder()).scoring.dense_weight == 0.3
    assert MemoryRetriever(store, MiniLMEmbedder()).scoring.dense_weight == 0.5
    assert MemoryRetriever(store, scoring=Scoring(dense_weight=0.0)).scoring.dense_weight == 0.0
    with pytest.raises(ValueError, match="dense_weight"):
        Scoring(dense_weight=1.5)


def test_searches_of_different_labels_each_get_their_own_results(store: JsonlMemoryStore) -> None:
    store.add("ada", PersonaMemory(topic="email tone", preference="warm"))
    retriever = MemoryRetriever(store)
    searches = [
        SearchRequest(layer="persona", query="email tone", label="a"),
        SearchRequest(layer="persona", query="email", label="b"),
    ]
    shared = retriever.retrieve("ada", searches)
    assert [m.search.label for m in shared.persona] == ["a"]  # handed to the first search
    apart = retriever.retrieve("ada", searches, distinct_per_label=True)
    assert sorted(m.search.label for m in apart.persona) == ["a", "b"]


def test_a_search_may_ask_for_more_results_than_the_call(store: JsonlMemoryStore) -> None:
    store.add_many(
        "ada", "persona", [PersonaMemory(topic=f"seat {i}", preference="x") for i in range(8)]
    )
    retriever = MemoryRetriever(store)
    deep = SearchRequest(layer="persona", query="seat", top_k=6)
    assert len(retriever.retrieve("ada", [deep], top_k=2).persona) == 6
    assert len(retriever.retrieve("ada", [search("seat")], top_k=2).persona) == 2
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        SearchRequest(layer="persona", query="seat", top_k=0)


def test_answers_learned_at_a_step_are_found_by_it_exactly(store: JsonlMemoryStore) -> None:
    learned = store.add(
        "ada",
        PersonaMemory(topic="seat", preference="aisle", contexts=["choose-seat", "Book Oslo"]),
    )
    store.add("ada", PersonaMemory(topic="meal", preference="vegetarian"))
    retriever = MemoryRetriever(store)
    assert [r.id for r in retriever.learned_at("ada", ["  CHOOSE-seat "])] == [learned.id]
    assert retriever.learned_at("ada", ["book oslo", "choose-seat"]) == [learned]  # once
    assert retriever.learned_at("ada", ["other step"]) == []
    assert retriever.learned_at("bob", ["choose-seat"]) == []  # nobody else's
    store.delete("ada", "persona", learned.id)
    assert retriever.learned_at("ada", ["choose-seat"]) == []


def _spy_on_reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str | None]]:
    """Record every read of a JSONL bank by an index: (layer, cursor)."""
    reads: list[tuple[str, str | None]] = []
    original = BankLog.read

    def read(log: BankLog, cursor: str | None, embedder: Embedder) -> LogRead:
        reads.append((log.bank.layer, cursor))
        return original(log, cursor, embedder)

    monkeypatch.setattr(BankLog, "read", read)
    return reads


def test_loading_a_bank_reads_it_once_for_later_retrievals(
    store: JsonlMemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.add("ada", PersonaMemory(topic="seat", preference="aisle"))
    retriever = MemoryRetriever(store)
    retriever.load("ada")
    reads = _spy_on_reads(monkeypatch)
    assert retriever.retrieve("ada", [search("seat")]).persona[0].record.content.topic == "seat"
    assert len(reads) == 1  # one check that nothing changed, no full read
    assert reads[0][1] is not None  # from where the index stood


def test_a_reading_block_checks_each_bank_once_and_sees_writes_after_it(
    store: JsonlMemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.add("ada", PersonaMemory(topic="seat", preference="aisle"))
    retriever = MemoryRetriever(store)
    reads = _spy_on_reads(monkeypatch)
    with retriever.reading():
        for _ in range(3):
            assert retriever.retrieve("ada", [search("seat")]).persona
        assert retriever.learned_at("ada", ["a step"]) == []
        assert [r[0] for r in reads] == ["persona"]  # one check for four calls
        with retriever.reading():  # nested: still the outer block's state
            retriever.retrieve("ada", [search("seat")])
        assert len(reads) == 1
        # A write inside the block is not seen until it ends: one state per block.
        store.add("ada", PersonaMemory(topic="seat", preference="window"))
        assert len(retriever.retrieve("ada", [search("seat")]).persona) == 1
    assert len(retriever.retrieve("ada", [search("seat")]).persona) == 2
    assert len(reads) == 2
    # Outside a block, every call checks the store again.
    retriever.retrieve("ada", [search("seat")])
    retriever.retrieve("ada", [search("seat")])
    assert len(reads) == 4


def test_a_search_repeated_in_a_reading_block_finds_what_it_found_without_searching(
    store: JsonlMemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    for topic, preference in [("seat", "aisle"), ("seat", "window"), ("meal", "veg")]:
        store.add("ada", PersonaMemory(topic=topic, preference=preference))
    retriever = MemoryRetriever(store)
    ranked: list[str] = []
    top = MemoryRetriever._top
    monkeypatch.setattr(
        MemoryRetriever,
        "_top",
        staticmethod(
            lambda index, search, **kw: ranked.append(search.query) or top(index, search, **kw)
        ),
    )
    shared = SearchRequest(layer="persona", query="seat", label="query")
    own = [SearchRequest(layer="persona", query=q, label="node") for q in ("aisle", "meal")]
    outside = [
        retriever.retrieve("ada", [shared, node], top_k=1, distinct_per_label=True) for node in own
    ]
    ranked.clear()
    with retriever.reading():
        inside = [
            retriever.retrieve("ada", [shared, node], top_k=1, distinct_per_label=True)
            for node in own
        ]
        # A search after another of its label depends on what that one took: searched.
        both = [shared, SearchRequest(layer="persona", query="seat window", label="query")]
        retriever.retrieve("ada", both, top_k=1, distinct_per_label=True)
    assert inside == outside  # the same memories, scores and searches
    assert ranked == ["seat", "aisle", "meal", "seat window"]  # "seat" ranked once


def test_a_failed_read_in_a_reading_block_is_read_again_not_taken_as_checked(
    store: JsonlMemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.add("ada", PersonaMemory(topic="seat", preference="aisle"))
    retriever = MemoryRetriever(store)
    original = BankLog.read
    failures = [StoreUnavailableError("the store is down")]

    def flaky(log: BankLog, cursor: str | None, embedder: Embedder) -> LogRead:
        if failures:
            raise failures.pop()
        return original(log, cursor, embedder)

    monkeypatch.setattr(BankLog, "read", flaky)
    with retriever.reading():
        with pytest.raises(StoreUnavailableError):
            retriever.retrieve("ada", [search("seat")])
        # The bank was never read: the next call reads it, rather than searching
        # an empty index as if it were up to date.
        assert retriever.retrieve("ada", [search("seat")]).persona[0].record.content.topic == "seat"


def test_scoring_many_queries_at_once_equals_one_by_one(store: JsonlMemoryStore) -> None:
    store.add_many(
        "ada",
        "persona",
        [
            PersonaMemory(topic=t, preference=p)
            for t, p in [("seat", "aisle"), ("meal", "veg"), ("tone", "warm seat")]
        ],
    )
    retriever = MemoryRetriever(store)
    queries = ["seat", "meal tone", "nothing at all", "seat seat warm"]
    vectors = retriever.embedder.embed(queries)
    with retriever._index("ada", "persona") as index:
        together = index.scores_many(queries, vectors)
        apart = np.stack([index.scores(q, v) for q, v in zip(queries, vectors, strict=True)])
    np.testing.assert_allclose(together, apart, rtol=1e-6)


_WORDS = (
    "seat aisle window meal vegan tone terse formal train flight hotel quiet "
    "dog cat coffee tea morning evening python rust email phone"
).split()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    memories=st.lists(
        st.tuples(st.lists(st.sampled_from(_WORDS), min_size=1, max_size=3), st.integers(0, 9)),
        min_size=60,
        max_size=200,
    ),
    queries=st.lists(st.lists(st.sampled_from([*_WORDS, "unrelated"]), max_size=3), min_size=1),
    wanted=st.integers(1, 8),
    removed=st.sets(st.integers(0, 199), max_size=20),
    half_life=st.sampled_from([None, 3600.0]),
)
def test_scoring_only_the_rows_that_may_rank_finds_the_same_best_rows(
    memories, queries, wanted, removed, half_life
) -> None:
    # Any bank, query and recency: the `wanted` best scores equal a full scoring's,
    # whether or not the bound let most vectors go unread.
    index = BankIndex(HashingEmbedder(), Scoring())
    start = datetime(2026, 1, 1, tzinfo=UTC)
    contents = [PersonaMemory(topic=words[0], preference=" ".join(words)) for words, _ in memories]
    vectors = index.embedder.embed([content.preference for content in contents])
    records = [
        MemoryRecord.of(
            content,
            stated_at=start + timedelta(hours=hours),
            embedding=Embedding.of(index.embedder.name, vector),
        )
        for content, (_, hours), vector in zip(contents, memories, vectors, strict=True)
    ]
    index.add_records(records)
    index.remove(records[i].id for i in removed if i < len(records))
    texts = [" ".join(words) for words in queries]
    vectors = index.embedder.embed(texts)
    time = TimeView(as_of=(start + timedelta(hours=12)).timestamp(), half_life=half_life)
    full = index.scores_many(texts, vectors, time)
    pruned = index.scores_many(texts, vectors, time, wanted=wanted)
    for whole, part in zip(full, pruned, strict=True):
        # Rows are scored exactly (up to float rounding) or left out; the best scores
        # are the same (rows of equal scores may swap places).
        assert (np.isclose(part, whole, rtol=1e-5, atol=1e-6) | (part == -1)).all()
        top = -np.sort(-whole)[:wanted]
        top = top[top > 0]
        np.testing.assert_allclose(-np.sort(-part)[: len(top)], top, rtol=1e-5, atol=1e-6)


def test_a_query_sharing_words_with_a_large_bank_reads_few_of_its_vectors() -> None:
    index = BankIndex(HashingEmbedder(), Scoring())
    filler = [PersonaMemory(topic=f"topic {i}", preference=f"value {i}") for i in range(2000)]
    index.add_records(embed_records(index.embedder, filler))
    seats = [PersonaMemory(topic="seat", preference=f"{side} seat") for side in ("aisle", "window")]
    index.add_records(embed_records(index.embedder, seats))
    texts = ["which seat", "something else entirely"]
    scores = index.scores_many(texts, index.embedder.embed(texts), wanted=2)
    assert sorted(np.argsort(-scores[0])[:2]) == [2000, 2001]
    assert (scores[0] != -1).sum() < 50  # the bound ruled out the rest unread
    # Sharing no word (or too few rows doing so), a row may rank by meaning alone: all scored.
    assert (scores[1] != -1).sum() == 2002


def test_answers_learned_at_a_step_follow_updates_and_compaction(store: JsonlMemoryStore) -> None:
    learned = store.add(
        "ada", PersonaMemory(topic="seat", preference="aisle", contexts=["choose-seat"])
    )
    retriever = MemoryRetriever(store)
    assert retriever.learned_at("ada", ["choose-seat"]) == [learned]  # the index is built
    moved = store.update(
        "ada",
        "persona",
        learned.id,
        PersonaMemory(topic="seat", preference="window", contexts=["rebook"]),
    )
    assert retriever.learned_at("ada", ["choose-seat"]) == []
    assert retriever.learned_at("ada", ["rebook"]) == [moved]
    store.compact("ada")
    assert retriever.learned_at("ada", ["rebook"]) == [moved]
    assert MemoryRetriever(JsonlMemoryStore(store.root)).learned_at("ada", ["rebook"]) == [moved]


def test_memories_holding_words_are_found_exactly_newest_first(store: JsonlMemoryStore) -> None:
    nuts = store.add("ada", PersonaMemory(topic="health", preference="peanut allergy"))
    store.add("ada", PersonaMemory(topic="tone", preference="terse"))
    later = store.add("ada", PersonaMemory(topic="dog", preference="allergic to chicken"))
    store.add("bob", PersonaMemory(topic="health", preference="pollen allergy"))
    retriever = MemoryRetriever(store)
    # Any of the words; a word of two terms needs both.
    assert retriever.containing("ada", "persona", ["allergy", "allergic"]) == [later, nuts]
    assert retriever.containing("ada", "persona", ["allergic", "allergy"]) == [later, nuts]
    assert retriever.containing("ada", "persona", ["allergies"]) == [nuts]  # as stemmed
    assert retriever.containing("ada", "persona", ["peanut allergy"]) == [nuts]
    assert retriever.containing("ada", "persona", ["step-free", "  "]) == []
    assert retriever.containing("ada", "trajectory", ["allergy"]) == []
    store.delete("ada", "persona", later.id)
    assert retriever.containing("ada", "persona", ["allergy", "allergic"]) == [nuts]
    with pytest.raises(InvalidUserIdError):
        retriever.containing("", "persona", ["allergy"])


def test_a_long_lived_retriever_scores_as_a_fresh_one_after_every_change(
    store: JsonlMemoryStore,
) -> None:
    # Term weights are kept between searches; every change must let them go.
    updater = MemoryUpdater(store)
    for memory in PREFERENCES:
        updater.update("ada", "persona", memory)
    kept = MemoryRetriever(store)
    queries = [search("citation style APA"), search("terse tone"), search("meeting mornings")]

    def scores(retriever: MemoryRetriever) -> list[tuple[str, float]]:
        found = retriever.retrieve("ada", queries, top_k=5).persona
        # float32 products of rows in another order differ in the 7th digit
        return [(memory.record.id, round(memory.score, 6)) for memory in found]

    def same() -> None:
        assert scores(kept) == scores(MemoryRetriever(JsonlMemoryStore(store.root)))

    same()
    store.add_many(
        "ada",
        "persona",
        embed_records(HashingEmbedder(), [PersonaMemory(topic="tone", preference="APA warmth")]),
    )
    same()
    first = store.list("ada", "persona")[0]
    (revised,) = embed_records(
        HashingEmbedder(), [PersonaMemory(topic="style", preference="MLA mornings")]
    )
    store.update("ada", "persona", first.id, revised.content, embedding=revised.embedding)
    same()
    store.delete("ada", "persona", store.list("ada", "persona")[1].id)
    same()
    store.compact("ada")
    same()


def test_a_bundle_shows_each_memory_once_as_its_best_find(seeded: JsonlMemoryStore) -> None:
    retriever = MemoryRetriever(seeded)
    searches = [
        SearchRequest(layer="persona", query="citation style", label="a"),
        SearchRequest(layer="persona", query="APA references", label="b"),
    ]
    bundle = retriever.retrieve("ada", searches, top_k=3, distinct_per_label=True)
    ids = [memory.record.id for memory in bundle.persona]
    assert len(ids) > len(set(ids))  # both labels found the APA preference
    distinct = bundle.distinct()
    assert [m.record.id for m in distinct.persona] == list(
        dict.fromkeys(m.record.id for m in sorted(bundle.persona, key=lambda m: -m.score))
    )
    for shown in distinct.persona:
        assert shown.score == max(m.score for m in bundle.persona if m.record.id == shown.record.id)
    scores = [memory.score for memory in distinct.persona]
    assert scores == sorted(scores, reverse=True)


def test_query_vectors_are_embedded_once_and_the_cache_is_bounded(
    store: JsonlMemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    from autopersona_flows.memory import retrieval

    monkeypatch.setattr(retrieval, "_QUERY_CACHE", 3)
    store.add_many("ada", "persona", embed_records(HashingEmbedder(), PREFERENCES))
    counting = CountingEmbedder()
    retriever = MemoryRetriever(store, embedder=counting)
    for _ in range(2):
        retriever.retrieve("ada", [search("tone"), search("tone"), search("seat")])
    assert counting.texts == ["tone", "seat"]  # each once, however often asked
    for query in ("a", "b", "c", "d"):
        retriever.retrieve("ada", [search(query)])
    assert len(retriever._queries) == 3
    retriever.retrieve("ada", [search("tone")])  # evicted, so embedded again
    assert counting.texts[-1] == "tone"

    def retrieve_many() -> None:
        for i in range(50):
            retriever.retrieve("ada", [search(f"q{i % 7}"), search("tone")])

    threads = [threading.Thread(target=retrieve_many) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(retriever._queries) <= 3
