"""Retrieval inside PostgreSQL (``PostgresMemoryStore(dsn, search="database")``).

Each test works in a schema of its own of the ``AUTOPERSONA_TEST_POSTGRES_DSN``
database (`.ci/postgres` starts one). The ranking is compared with the JSONL
store's on the same records and queries: the tolerance is the one
``docs/retrieval.md`` states.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from autopersona_flows.errors import EmbeddingMismatchError, MemoryStoreError
from autopersona_flows.memory import (
    FunctionEmbedder,
    HashingEmbedder,
    JsonlMemoryStore,
    MemoryRecord,
    MemoryRetriever,
    PersonaMemory,
    SearchRequest,
    postgres_index,
)
from autopersona_flows.memory.index import Scoring
from autopersona_flows.memory.protocol import BankSearch
from autopersona_flows.memory.records import Embedding
from autopersona_flows.memory.retrieval import time_view
from autopersona_flows.memory.text import memory_text

psycopg = pytest.importorskip("psycopg", reason="the postgres extra is not installed")

from autopersona_flows.memory.postgres import _SCHEMA, PostgresMemoryStore  # noqa: E402

USER = "ada"
_TOPICS = ["email tone", "citation style", "travel booking", "meeting times", "code review"]
_THINGS = ["bullet points", "footnotes", "window seats", "dark mode", "unit tests", "emoji"]
_PEOPLE = ["Grace", "Linus", "Barbara", "Ken", "Radia", "Hedy"]
_PLACES = ["Berlin", "Lisbon", "Tokyo", "Oslo", "the London office"]


def persona(rng: random.Random) -> PersonaMemory:
    return PersonaMemory(
        topic=rng.choice(_TOPICS),
        preference=f"wants {rng.choice(_THINGS)} when writing to {rng.choice(_PEOPLE)}",
        strategy=f"book around {rng.choice(_PLACES)} and send {rng.choice(_THINGS)}",
    )


def embedded(contents: list[PersonaMemory], embedder: HashingEmbedder) -> list[MemoryRecord]:
    vectors = embedder.embed([memory_text(c) for c in contents])
    return [
        MemoryRecord.of(c, embedding=Embedding.of(embedder.name, v))
        for c, v in zip(contents, vectors, strict=True)
    ]


def queries(n: int) -> list[str]:
    rng = random.Random(7)
    return [
        f"{rng.choice(_TOPICS)} with {rng.choice(_THINGS)} for {rng.choice(_PEOPLE)}"
        for _ in range(n)
    ]


def ranked(retriever: MemoryRetriever, query: str, **kw: object) -> list[tuple[str, float]]:
    bundle = retriever.retrieve(USER, [SearchRequest(layer="persona", query=query)], **kw)
    return [(m.record.id, m.score) for m in bundle.persona]


def scores(found: list[tuple[str, float]]) -> list[float]:
    return [score for _, score in found]


@pytest.fixture
def pair(postgres_schema: str, tmp_path: Path):
    """The same 400 embedded memories in a JSONL store and in PostgreSQL, searched there."""
    embedder = HashingEmbedder()
    rng = random.Random(3)
    records = embedded([persona(rng) for _ in range(400)], embedder)
    jsonl, pg = (
        JsonlMemoryStore(tmp_path / "store"),
        PostgresMemoryStore(postgres_schema, search="database"),
    )
    jsonl.add_many(USER, "persona", records)
    pg.add_many(USER, "persona", records)
    yield jsonl, pg
    pg.close()


def test_ranks_as_the_jsonl_store(pair) -> None:
    jsonl, pg = pair
    ours, theirs = MemoryRetriever(pg, HashingEmbedder()), MemoryRetriever(jsonl, HashingEmbedder())
    identical, asked = 0, queries(60)
    for query in asked:
        got, want = ranked(ours, query, top_k=5), ranked(theirs, query, top_k=5)
        # Every score is the JSONL store's score of the same record (exact scoring) ...
        exact = dict(ranked(theirs, query, top_k=400))
        for memory_id, score in got:
            assert score == pytest.approx(exact[memory_id], abs=1e-5)
        # ... and the ranking is the same but for ties (equal scores in another order).
        identical += scores(got) == pytest.approx(scores(want), abs=1e-5)
    assert identical >= 0.95 * len(asked)
    assert ours.cached_bytes() == 0  # nothing held per bank in the worker


def test_time_and_thresholds_are_those_of_the_jsonl_store(pair) -> None:
    jsonl, pg = pair
    now = datetime.now(UTC)
    for store in (jsonl, pg):  # an expired memory and a buried one, alike in both stores
        first, second = store.list(USER, "persona")[:2]
        store.update(
            USER, "persona", first.id, first.content, embedding=first.embedding,
            valid_until=now - timedelta(days=1),
        )  # fmt: skip
        store.update(
            USER, "persona", second.id, second.content, embedding=second.embedding, buried=True
        )
    ours, theirs = MemoryRetriever(pg, HashingEmbedder()), MemoryRetriever(jsonl, HashingEmbedder())
    for query in queries(10):
        for kw in (
            {"min_similarity": 0.4},
            {"recency_half_life": timedelta(hours=1)},
            {"include_past": True},
            {"as_of": now + timedelta(days=1)},  # a look back: the index built for the call
        ):
            got, want = ranked(ours, query, top_k=3, **kw), ranked(theirs, query, top_k=3, **kw)
            assert scores(got) == pytest.approx(scores(want), abs=1e-5), (query, kw)
    expired, buried = (r.id for r in pg.list(USER, "persona")[:2])
    found = {i for q in queries(30) for i, _ in ranked(ours, q, top_k=20)}
    assert buried not in found
    assert expired not in found


def _synonyms(texts: list[str]) -> np.ndarray:
    """A toy meaning: texts about cats point one way, the others another."""
    cats = ("cat", "feline", "kitten", "tabby")
    return np.array(
        [[1.0, 0.1] if any(w in t.lower() for w in cats) else [0.1, 1.0] for t in texts]
    )


def test_a_query_sharing_no_word_is_served_by_meaning(postgres_schema: str) -> None:
    embedder = FunctionEmbedder(_synonyms, name="toy", dim=2)
    store = PostgresMemoryStore(postgres_schema, search="database")
    contents = [PersonaMemory(topic="pets", preference="adopted a tabby")] + [
        PersonaMemory(topic=f"topic {i}", preference=f"likes walking {i}") for i in range(50)
    ]
    vectors = embedder.embed([memory_text(c) for c in contents])
    store.add_many(
        USER,
        "persona",
        [
            MemoryRecord.of(c, embedding=Embedding.of("toy", v))
            for c, v in zip(contents, vectors, strict=True)
        ],
    )
    retriever = MemoryRetriever(store, embedder)
    (best, *_) = ranked(retriever, "feline companion", top_k=3)  # no word in common
    assert store.get(USER, "persona", best[0]).content.preference == "adopted a tabby"
    store.close()


def test_writes_of_one_worker_are_searched_by_another_at_once(postgres_schema: str) -> None:
    writer = PostgresMemoryStore(postgres_schema, search="database")
    hashing = HashingEmbedder()
    reader = MemoryRetriever(PostgresMemoryStore(postgres_schema, search="database"), hashing)
    rng = random.Random(5)
    writer.add_many(USER, "persona", embedded([persona(rng) for _ in range(50)], hashing))
    (added,) = embedded([PersonaMemory(topic="quokka census", preference="zebra stripes")], hashing)
    writer.add(USER, added)
    assert ranked(reader, "quokka census")[0][0] == added.id

    (moved,) = embedded([PersonaMemory(topic="wombat survey", preference="zebra stripes")], hashing)
    writer.update(USER, "persona", added.id, moved.content, embedding=moved.embedding)
    assert ranked(reader, "wombat survey")[0][0] == added.id
    assert added.id not in {i for i, _ in ranked(reader, "quokka census")}

    writer.delete(USER, "persona", added.id)
    assert added.id not in {i for i, _ in ranked(reader, "wombat survey zebra stripes")}
    writer.close()
    reader.store.close()  # type: ignore[attr-defined]


def _statistics(store: PostgresMemoryStore) -> tuple[int, int, dict[str, int]]:
    conn = store._conn()
    live, total = conn.execute(
        "SELECT live, total_length FROM autopersona_banks WHERE layer = 'persona'"
    ).fetchone()
    terms = dict(conn.execute("SELECT term, df FROM autopersona_terms ORDER BY term"))
    assert all(df > 0 for df in terms.values())  # a word no memory holds is not kept
    return live, total, terms


def test_statistics_follow_every_write_and_survive_a_rebuild(
    postgres_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(postgres_index, "UNPACKED", 4)  # packed postings to erase too
    store = PostgresMemoryStore(postgres_schema, search="database")
    rng = random.Random(11)
    hashing = HashingEmbedder()
    records = store.add_many(USER, "persona", embedded([persona(rng) for _ in range(30)], hashing))
    store.update(USER, "persona", records[0].id, persona(rng))
    store.update(USER, "persona", records[1].id, records[1].content, buried=True)
    store.delete(USER, "persona", records[2].id)
    kept = _statistics(store)
    assert kept[0] == 28  # 30 added, one buried, one deleted
    with store._write(USER.encode(), "persona") as conn:  # a rebuild from the records
        store._verify(conn, USER.encode(), "persona")
    assert _statistics(store) == kept
    assert store._conn().execute("SELECT count(*) FROM autopersona_packed").fetchone()[0] > 0
    assert store.erase(USER).found
    for table in postgres_index.TABLES:  # the words of its memories, and their postings
        assert store._conn().execute(f"SELECT count(*) FROM {table}").fetchone() == (0,)  # noqa: S608
    store.close()


def test_rows_of_an_older_version_are_indexed_at_the_first_search(
    postgres_schema: str, tmp_path: Path
) -> None:
    rng = random.Random(13)
    hashing = HashingEmbedder()
    records = embedded([persona(rng) for _ in range(60)], hashing)
    with psycopg.connect(postgres_schema, autocommit=True) as conn:  # the tables before search
        conn.execute(_SCHEMA)
        conn.execute("SELECT set_config('autopersona.writer', 'store', false)")
        conn.execute(
            "INSERT INTO autopersona_banks (user_id, layer, generation, last_seq)"
            " VALUES (%s, 'persona', 'old', 60)",
            (USER.encode(),),
        )
        with conn.cursor() as cursor:
            cursor.executemany(
                "INSERT INTO autopersona_memories (user_id, layer, id, position, seq, record)"
                " VALUES (%s, 'persona', %s, %s, %s, %s)",
                [
                    (USER.encode(), r.id, i, i, r.model_dump_json().encode())
                    for i, r in enumerate(records, 1)
                ],
            )
    jsonl = JsonlMemoryStore(tmp_path / "store")
    jsonl.add_many(USER, "persona", records)
    store = PostgresMemoryStore(postgres_schema, search="database")
    ours, theirs = MemoryRetriever(store, hashing), MemoryRetriever(jsonl, hashing)
    for query in queries(5):
        assert scores(ranked(ours, query)) == pytest.approx(scores(ranked(theirs, query)), abs=1e-5)
    assert _statistics(store)[0] == 60
    store.close()


def test_rows_written_by_hand_are_checked_and_indexed(postgres_schema: str) -> None:
    store = PostgresMemoryStore(postgres_schema, search="database")
    hashing = HashingEmbedder()
    store.add_many(USER, "persona", embedded([persona(random.Random(1))], hashing))
    (hand,) = embedded([PersonaMemory(topic="quokka census", preference="by hand")], hashing)
    with psycopg.connect(postgres_schema, autocommit=True) as conn:  # no search columns
        conn.execute(
            "INSERT INTO autopersona_memories (user_id, layer, id, position, seq, record)"
            " VALUES (%s, 'persona', %s, 99, 99, %s)",
            (USER.encode(), hand.id, hand.model_dump_json().encode()),
        )
    assert ranked(MemoryRetriever(store, hashing), "quokka census")[0][0] == hand.id
    store.close()


def test_the_option_is_checked(postgres_schema: str) -> None:
    with pytest.raises(MemoryStoreError, match="search must be"):
        PostgresMemoryStore(postgres_schema, search="elsewhere")  # type: ignore[arg-type]
    memory = PostgresMemoryStore(postgres_schema)  # the default: an index per worker
    hashing = HashingEmbedder()
    asked = BankSearch(
        ["x"], np.zeros((1, hashing.dim), np.float32), hashing, Scoring(), time_view(), 3
    )
    assert memory.search_bank(USER, "persona", asked) is None
    assert memory.prepare_bank(USER, "persona") is False
    memory.close()


def test_lookups_are_those_of_the_jsonl_store(postgres_schema: str, tmp_path: Path) -> None:
    jsonl = JsonlMemoryStore(tmp_path / "store")
    pg = PostgresMemoryStore(postgres_schema, search="database")
    rng = random.Random(17)
    contents = [
        persona(rng).model_copy(update={"contexts": [rng.choice(["Node A", "node b", "C"])]})
        for _ in range(40)
    ]
    records = embedded(contents, HashingEmbedder())
    for store in (jsonl, pg):
        store.add_many(USER, "persona", records)
        store.update(USER, "persona", records[0].id, records[0].content, buried=True)
    ours, theirs = MemoryRetriever(pg, HashingEmbedder()), MemoryRetriever(jsonl, HashingEmbedder())

    def ids(found: list[MemoryRecord]) -> list[str]:
        return [record.id for record in found]

    for words in (["Tokyo"], ["window seats", "Grace"], ["footnotes Ken"], ["nowhere"]):
        assert ids(ours.containing(USER, "persona", words)) == ids(
            theirs.containing(USER, "persona", words)
        )
    for contexts in (["node a"], ["C", "NODE B"], ["elsewhere"]):
        assert ids(ours.learned_at(USER, contexts)) == ids(theirs.learned_at(USER, contexts))
    for record in records[:3]:
        assert ids(ours.find_all(USER, "persona", record.content)) == ids(
            theirs.find_all(USER, "persona", record.content)
        )
    assert ours.cached_bytes() == 0
    pg.close()


def test_vectors_of_another_embedder_are_refused(pair) -> None:
    _, pg = pair
    remote = FunctionEmbedder(lambda texts: np.ones((len(texts), 8)), name="remote", dim=8)
    with pytest.raises(EmbeddingMismatchError, match="autopersona reindex"):
        ranked(MemoryRetriever(pg, remote), queries(1)[0])


def _postings(store: PostgresMemoryStore) -> dict[str, set[int]]:
    """Each term's rows, as the packed and unpacked postings and outdated rows say."""
    conn = store._conn()
    outdated = {p for (p,) in conn.execute("SELECT position FROM autopersona_outdated")}
    found: dict[str, set[int]] = {}
    last: dict[str, int] = {}
    for term, first, packed in conn.execute(
        "SELECT term, first, postings FROM autopersona_packed ORDER BY term, first"
    ):
        rows = np.frombuffer(packed, dtype=postgres_index.POSTING)["position"]
        # A term's chunks: named by their first row, in row order, none overlapping.
        assert 0 < len(rows) <= postgres_index.CHUNK
        assert rows[0] == first
        assert (np.diff(rows) > 0).all()
        assert rows[0] > last.get(term, -1)
        last[term] = int(rows[-1])
        found.setdefault(term, set()).update(int(p) for p in rows if int(p) not in outdated)
    for position, term in conn.execute(
        f"SELECT position, substr(lexeme, {postgres_index.PREFIX_LENGTH + 1})"  # noqa: S608 - constant SQL
        " FROM autopersona_memories JOIN autopersona_unpacked USING (user_id, layer, position),"
        " unnest(tsvector_to_array(lexemes)) AS lexeme WHERE length IS NOT NULL"
    ):
        found.setdefault(term, set()).add(position)
    return {term: rows for term, rows in found.items() if rows}


def _holding(store: PostgresMemoryStore) -> dict[str, set[int]]:
    """Each term's live rows, from the rows themselves."""
    found: dict[str, set[int]] = {}
    for position, term in store._conn().execute(
        f"SELECT position, substr(lexeme, {postgres_index.PREFIX_LENGTH + 1})"  # noqa: S608 - constant SQL
        " FROM autopersona_memories, unnest(tsvector_to_array(lexemes)) AS lexeme"
        " WHERE length IS NOT NULL"
    ):
        found.setdefault(term, set()).add(position)
    return found


def test_packing_follows_every_kind_of_write(
    postgres_schema: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(postgres_index, "UNPACKED", 7)  # packs every few writes
    monkeypatch.setattr(postgres_index, "CHUNK", 8)  # into lists of many chunks
    hashing = HashingEmbedder()
    rng = random.Random(23)
    jsonl = JsonlMemoryStore(tmp_path / "store")
    pg = PostgresMemoryStore(postgres_schema, search="database")
    ours, theirs = MemoryRetriever(pg, hashing), MemoryRetriever(jsonl, hashing)
    live: list[str] = []
    packs = 0
    for step in range(150):
        kind = rng.random() if live else 0.0
        if kind < 0.5:
            batch = embedded([persona(rng) for _ in range(rng.choice([1, 1, 3, 12]))], hashing)
            for store in (jsonl, pg):
                store.add_many(USER, "persona", batch)
            live += [r.id for r in batch]
        elif kind < 0.75:  # new words, new length
            memory_id, content = rng.choice(live), persona(rng)
            (vector,) = hashing.embed([memory_text(content)])
            for store in (jsonl, pg):
                store.update(
                    USER,
                    "persona",
                    memory_id,
                    content,
                    embedding=Embedding.of(hashing.name, vector),
                )
        elif kind < 0.85:
            memory_id = live.pop(rng.randrange(len(live)))
            for store in (jsonl, pg):
                store.update(
                    USER,
                    "persona",
                    memory_id,
                    store.get(USER, "persona", memory_id).content,
                    buried=True,
                )
        else:
            memory_id = live.pop(rng.randrange(len(live)))
            for store in (jsonl, pg):
                store.delete(USER, "persona", memory_id)
        unpacked = pg._conn().execute("SELECT unpacked FROM autopersona_banks").fetchone()[0]
        packs += unpacked == 0
        assert _postings(pg) == _holding(pg), f"after step {step}"
        if step % 10 == 0:
            for query in queries(4):
                assert ranked(ours, query, top_k=5) == [
                    (i, pytest.approx(score, abs=1e-5))
                    for i, score in ranked(theirs, query, top_k=5)
                ]
    assert packs > 10  # the merge was exercised, not only the unpacked rows
    # What a pack leaves is exactly what the rows hold: nothing outdated stays behind.
    with pg._write(USER.encode(), "persona") as conn:
        postgres_index.pack(conn, USER.encode(), "persona")
    assert pg._conn().execute("SELECT count(*) FROM autopersona_outdated").fetchone() == (0,)
    assert _postings(pg) == _holding(pg)
    pg.close()


def test_a_bank_of_the_version_before_packed_postings_is_packed_at_its_first_search(
    postgres_schema: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hashing = HashingEmbedder()
    records = embedded([persona(random.Random(29)) for _ in range(80)], hashing)
    old = PostgresMemoryStore(postgres_schema, search="database")
    old.add_many(USER, "persona", records)
    old._conn().execute(  # what that version had
        "DROP TABLE autopersona_packed, autopersona_outdated, autopersona_unpacked;"
        " DROP INDEX autopersona_memories_position;"
        " ALTER TABLE autopersona_banks DROP COLUMN unpacked"
    )
    old.close()
    jsonl = JsonlMemoryStore(tmp_path / "store")
    jsonl.add_many(USER, "persona", records)
    monkeypatch.setattr(postgres_index, "UNPACKED", 16)
    store = PostgresMemoryStore(postgres_schema, search="database")
    ours, theirs = MemoryRetriever(store, hashing), MemoryRetriever(jsonl, hashing)
    for query in queries(5):
        assert ranked(ours, query) == [
            (i, pytest.approx(score, abs=1e-5)) for i, score in ranked(theirs, query)
        ]
    assert _postings(store) == _holding(store)
    assert store._conn().execute("SELECT count(*) FROM autopersona_packed").fetchone()[0] > 0
    store.close()
