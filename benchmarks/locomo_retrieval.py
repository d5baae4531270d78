"""Benchmark: retrieval quality on LoCoMo, our hybrid index against BM25 baselines.

Run it as ``python benchmarks/locomo_retrieval.py``; ``--minilm`` adds the
MiniLM embedder (needs the ``minilm`` extra; embedding the 5,882 turns takes a
minute or more on two CPU cores), ``--sweep`` adds a sweep of ``Scoring.dense_weight``.

What is measured
----------------
LoCoMo (10 long conversations, 5,882 dialogue turns, 1,986 questions) is read
from ``../shared/data/locomo10.json`` beside the repository (``--data`` to point
elsewhere); it is never copied into the repository. Each conversation becomes one
user (user id = its ``sample_id``), and every dialogue turn one trajectory memory
of that user, stored through `JsonlMemoryStore.add_many` with its embedding, as
the product writes memories::

    TrajectoryMemory(
        query="Speaker: text [shares <image caption>]",
        outcome={"dia_id": "D1:3", "session_date": "1:56 pm on 8 May, 2023"},
    )

The image caption is appended only when the turn shares one. `memory_text` makes
the outcome's values searchable too; ``--outcome dia_id`` keeps only the turn id
to measure what the date does. Measured: the turn id changes no recall by more
than 0.001; the session date lifts R@5 by about 0.02 for every method, all of it
on the ~200 questions that name a month or a year ("What setback did Melanie face
in October 2023?"). That is information a memory of the turn legitimately has (when it was
said), not pollution, so the default keeps it.

Every question of categories 1-4 (category 5 is adversarial: unanswerable) asks
its conversation's user with one `SearchRequest` on the trajectory layer and
``top_k=10``; the ranked turn ids are cut at k = 1, 5 and 10. Evidence recall@k
is the share of a question's evidence turns found in the top k, averaged over the
questions. Evidence strings that pack several ids ("D8:6; D9:17", "D9:1 D4:4")
are split on semicolons and spaces; ids that name no turn of the conversation
are dropped (they cannot be found by any method), and questions left without
evidence are not scored. The counts are printed.

Methods, all over the very same memory texts (`memory_text` of each content):

* ``ours (semantic)``: `MemoryRetriever` with the default embedder, the shipped
  `SentenceEncoder`, and the scoring it brings (dense_weight 0.5, dense_floor 0.3,
  k1 1.2, b 0.3): what a plain install retrieves with.
* ``ours (hashing)``: the same with `HashingEmbedder` (dense_weight 0.3), the
  default before the shipped encoder.
* ``ours (minilm)``: the same with `MiniLMEmbedder` (``--minilm``).
* ``BM25Okapi plain``: ``rank_bm25.BM25Okapi`` (its defaults k1 1.5, b 0.75) over
  lowercase ``\\w+`` tokens: the baseline of the bar.
* ``BM25Okapi terms()``: the same over our analyzer `terms` (stop words, light
  stemming), a stronger baseline that shows how much comes from the tokenizer;
  and once more with our k1 1.2, b 0.3, to separate the parameters from the rest.

Baseline rankings keep only memories scoring above zero, as ours do.

With ``--postgres DSN`` (default: ``$AUTOPERSONA_TEST_POSTGRES_DSN``) the same records
are also stored in `PostgresMemoryStore` with ``search="database"`` (in a schema
created for the run, dropped at its end), and each ``ours`` row gets a ``PG in db``
twin: the same retriever, searching inside PostgreSQL (candidates from its
full-text index, scored in the worker). The bar is a recall@5 within 0.02 of the
JSONL store's; informative, never in the exit code. Without a database it prints
one line saying why it was skipped.

``--sweep`` evaluates ``Scoring(dense_weight=w, k1=1.2, b=0.3)`` for w in 0, 0.1,
... 0.6 for each embedder evaluated. The bank and query embeddings are computed
once per embedder and reused: the bank's are stored with the records, which the
index reads; the queries' are cached by `CachingEmbedder`.

How to read it
--------------
The table gives R@1, R@5 and R@10 per method (higher is better), then the
relative gain of the default, ``ours (semantic)``, over ``BM25Okapi plain`` at R@5
and R@10. The bar is a gain of +20% at R@5 and ours >= plain BM25 at R@10 (exit code
1 otherwise).
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from _common import (
    PostgresSkipped,
    add_postgres_argument,
    postgres_schema,
    print_skipped,
    progress,
    recorded,
)
from rank_bm25 import BM25Okapi

from autopersona_flows.memory.embedders import Embedder, HashingEmbedder, default_embedder
from autopersona_flows.memory.index import Scoring
from autopersona_flows.memory.jsonl import JsonlMemoryStore
from autopersona_flows.memory.records import Embedding, MemoryRecord, TrajectoryMemory
from autopersona_flows.memory.retrieval import MemoryRetriever, SearchRequest
from autopersona_flows.memory.text import memory_text, terms

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA = REPO_ROOT.parent / "shared" / "data" / "locomo10.json"
KS = (1, 5, 10)
TOP_K = max(KS)
SCORED_CATEGORIES = frozenset({1, 2, 3, 4})
SWEEP_WEIGHTS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6)
BAR = 0.20

_WORD = re.compile(r"\w+")
_SESSION = re.compile(r"session_(\d+)")
_EVIDENCE_SPLIT = re.compile(r"[;\s]+")

# -- data -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Turn:
    dia_id: str
    speaker: str
    text: str
    caption: str | None
    date: str


@dataclass(frozen=True)
class Conversation:
    user: str
    turns: list[Turn]


@dataclass(frozen=True)
class Question:
    user: str
    text: str
    evidence: frozenset[str]


@dataclass(frozen=True)
class Dataset:
    conversations: list[Conversation]
    questions: list[Question]
    skipped_category_5: int
    dropped_ids: list[str]  # "conversation/id" of evidence ids naming no turn
    no_evidence: int  # questions of categories 1-4 left without evidence


def load(path: Path) -> Dataset:
    """Read LoCoMo: the turns of every conversation and its scored questions."""
    samples = orjson.loads(path.read_bytes())
    conversations, questions, dropped = [], [], []
    skipped = no_evidence = 0
    for sample in samples:
        user, talk = sample["sample_id"], sample["conversation"]
        sessions = sorted(
            (int(match.group(1)), key)
            for key in talk
            if (match := _SESSION.fullmatch(key)) and isinstance(talk[key], list)
        )
        turns = [
            Turn(
                dia_id=turn["dia_id"],
                speaker=turn["speaker"],
                text=turn["text"],
                caption=turn.get("blip_caption") or None,
                date=talk.get(f"{key}_date_time", ""),
            )
            for _, key in sessions
            for turn in talk[key]
        ]
        conversations.append(Conversation(user, turns))
        ids = {turn.dia_id for turn in turns}
        for qa in sample["qa"]:
            if qa["category"] not in SCORED_CATEGORIES:
                skipped += 1
                continue
            evidence = {
                part for entry in qa["evidence"] for part in _EVIDENCE_SPLIT.split(entry) if part
            }
            dropped += sorted(f"{user}/{part}" for part in evidence - ids)
            if evidence & ids:
                questions.append(Question(user, qa["question"], frozenset(evidence & ids)))
            else:
                no_evidence += 1
    return Dataset(conversations, questions, skipped, dropped, no_evidence)


def content_of(turn: Turn, outcome: str) -> TrajectoryMemory:
    """The trajectory memory of one turn; ``outcome`` is "dia_id" or "full" (id and date)."""
    query = f"{turn.speaker}: {turn.text}"
    if turn.caption:
        query += f" [shares {turn.caption}]"
    details = {"dia_id": turn.dia_id}
    if outcome == "full":
        details["session_date"] = turn.date
    return TrajectoryMemory(query=query, outcome=details)


# -- embedders ------------------------------------------------------------------------------


class CachingEmbedder:
    """An `Embedder` that embeds each distinct text once and serves repeats from memory."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.name = inner.name
        self.dim = inner.dim
        # The retriever takes its scoring from the embedder's attributes.
        for attribute in ("dense_weight", "dense_floor"):
            if hasattr(inner, attribute):
                setattr(self, attribute, getattr(inner, attribute))
        self._cache: dict[str, np.ndarray] = {}

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        missing = list(dict.fromkeys(text for text in texts if text not in self._cache))
        if missing:
            self._cache.update(zip(missing, self.inner.embed(missing), strict=True))
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            out[row] = self._cache[text]
        return out


def make_embedder(kind: str) -> Embedder:
    if kind == "semantic":
        return default_embedder()
    if kind == "hashing":
        return HashingEmbedder()
    from autopersona_flows.memory.embedders import MiniLMEmbedder

    return MiniLMEmbedder(device="cpu")


# -- methods --------------------------------------------------------------------------------

Ranking = list[list[str]]  # per question, the turn ids found, best first


def write_store(
    root: Path, data: Dataset, embedder: Embedder, outcome: str
) -> tuple[JsonlMemoryStore, float]:
    """Store every turn, embedded, as a trajectory memory; return the store and embed seconds."""
    store = JsonlMemoryStore(root)
    contents = {
        conv.user: [content_of(turn, outcome) for turn in conv.turns] for conv in data.conversations
    }
    texts = [memory_text(content) for batch in contents.values() for content in batch]
    start = time.perf_counter()
    vectors = iter(embedder.embed(texts))
    seconds = time.perf_counter() - start
    for user, batch in contents.items():
        records = [
            MemoryRecord.of(content, embedding=Embedding.of(embedder.name, next(vectors)))
            for content in batch
        ]
        store.add_many(user, "trajectory", records)
    return store, seconds


def turn_id(record: MemoryRecord) -> str:
    """The LoCoMo turn id a stored memory came from."""
    content = record.content
    assert isinstance(content, TrajectoryMemory)
    assert isinstance(content.outcome, dict)
    return content.outcome["dia_id"]


def rank_ours(retriever: MemoryRetriever, questions: Sequence[Question]) -> Ranking:
    ranking = []
    for question in questions:
        search = SearchRequest(layer="trajectory", query=question.text)
        bundle = retriever.retrieve(question.user, [search], top_k=TOP_K)
        ranking.append([turn_id(found.record) for found in bundle.trajectory])
    return ranking


def plain_words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def rank_bm25(
    data: Dataset,
    outcome: str,
    tokenize: Callable[[str], list[str]],
    **params: float,
) -> Ranking:
    """Rank each question's conversation with ``BM25Okapi`` over ``tokenize``d memory texts."""
    indexes: dict[str, tuple[BM25Okapi, list[str]]] = {}
    for conv in data.conversations:
        corpus = [tokenize(memory_text(content_of(turn, outcome))) for turn in conv.turns]
        indexes[conv.user] = (BM25Okapi(corpus, **params), [turn.dia_id for turn in conv.turns])
    ranking = []
    for question in data.questions:
        bm25, ids = indexes[question.user]
        scores = bm25.get_scores(tokenize(question.text))
        order = np.argsort(-scores, kind="stable")[:TOP_K]
        ranking.append([ids[row] for row in order if scores[row] > 0])
    return ranking


def recalls(ranking: Ranking, questions: Sequence[Question]) -> dict[int, float]:
    """Mean evidence recall@k over the questions, for each k of `KS`."""
    return {
        k: sum(
            len(question.evidence.intersection(found[:k])) / len(question.evidence)
            for question, found in zip(questions, ranking, strict=True)
        )
        / len(questions)
        for k in KS
    }


# -- report ---------------------------------------------------------------------------------


def print_table(rows: list[tuple[str, dict[int, float]]], first: str = "method") -> None:
    width = max(len(first), *(len(name) for name, _ in rows))
    header = f"{first:<{width}} | " + " | ".join(f"{f'R@{k}':>6}" for k in KS)
    print(header)
    print("-" * len(header))
    for name, result in rows:
        print(f"{name:<{width}} | " + " | ".join(f"{result[k]:>6.3f}" for k in KS))


def verdict(ours: dict[int, float], plain: dict[int, float]) -> int:
    """Print the gains of the default over plain BM25 and the verdict; return the exit code."""
    gains = {k: ours[k] / plain[k] - 1 for k in (5, 10)}
    for k, gain in gains.items():
        print(
            f"gain of ours (semantic) over BM25Okapi plain at R@{k}: {gain:+.1%} "
            f"({ours[k]:.3f} vs {plain[k]:.3f})"
        )
    ok = gains[5] >= BAR and gains[10] >= 0
    print(
        f"bar: ours (semantic) >= {1 + BAR:.1f}x BM25Okapi plain at R@5 and >= it at R@10: "
        f"{'ok' if ok else 'FAIL'}"
    )
    return 0 if ok else 1


def rank_in_database(
    dsn: str | None, store: JsonlMemoryStore, embedder: Embedder, data: Dataset
) -> dict[int, float]:
    """Recall of the same records and questions, searched inside PostgreSQL.

    Raises:
        PostgresSkipped: Without a database (or psycopg).
    """
    from autopersona_flows.memory.postgres import PostgresMemoryStore

    with (
        postgres_schema(dsn, "locomo_retrieval") as (address, _),
        PostgresMemoryStore(address, search="database") as database,
    ):
        for user in store.users():
            database.add_many(user, "trajectory", store.list(user, "trajectory"))
        database._conn().execute("ANALYZE")  # what autovacuum does within a minute
        retriever = MemoryRetriever(database, embedder)
        return recalls(rank_ours(retriever, data.questions), data.questions)


def print_in_database(
    rows: list[tuple[str, dict[int, float]]], in_database: list[tuple[str, dict[int, float]]]
) -> None:
    """The recalls searching inside PostgreSQL, beside the JSONL store's (bar: R@5 within 0.02)."""
    print_table(in_database)
    results = dict(rows)
    for name, found in in_database:
        jsonl = results[name.split(", PG")[0]]
        print(
            f"{name}: R@5 {found[5] - jsonl[5]:+.3f} against the JSONL store "
            f"(bar: within 0.02) {'ok' if abs(found[5] - jsonl[5]) <= 0.02 else 'missed'}"
        )
    print()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Evidence recall@k on LoCoMo: our retriever against BM25 baselines."
    )
    parser.add_argument(
        "--data",
        type=Path,
        default=DEFAULT_DATA,
        help="locomo10.json (default: ../shared/data/locomo10.json beside the repository)",
    )
    parser.add_argument(
        "--minilm", action="store_true", help="also evaluate MiniLMEmbedder (minilm extra)"
    )
    parser.add_argument(
        "--sweep",
        action="store_true",
        help="sweep Scoring.dense_weight over 0, 0.1, ... 0.6 (k1 1.2, b 0.3)",
    )
    parser.add_argument(
        "--outcome",
        choices=("full", "dia_id"),
        default="full",
        help="what the memories' outcome holds: the turn id, or the id and the session date",
    )
    add_postgres_argument(parser)
    args = parser.parse_args(argv)
    if not args.data.is_file():
        parser.error(f"no LoCoMo file at {args.data}; pass --data PATH")

    data = load(args.data)
    turns = sum(len(conv.turns) for conv in data.conversations)
    print(
        f"LoCoMo: {len(data.conversations)} conversations, {turns:,} turns stored as trajectory "
        f"memories (outcome: {args.outcome}); {len(data.questions):,} questions of categories "
        f"1-4 scored ({data.skipped_category_5} of category 5 skipped, {data.no_evidence} "
        f"without evidence left out; {len(data.dropped_ids)} evidence ids naming no turn "
        f"dropped: {', '.join(data.dropped_ids)})"
    )
    print()

    rows: list[tuple[str, dict[int, float]]] = []
    sweeps: list[tuple[str, dict[int, float]]] = []
    in_database: list[tuple[str, dict[int, float]]] = []
    kinds = ["semantic", "hashing", *(["minilm"] if args.minilm else [])]
    with tempfile.TemporaryDirectory(prefix="locomo-retrieval-") as tmp:
        for kind in kinds:
            embedder = CachingEmbedder(make_embedder(kind))
            progress(f"{kind}: embedding and storing {turns:,} turns ...")
            store, seconds = write_store(Path(tmp) / kind, data, embedder, args.outcome)
            progress(f"{kind}: embedded in {seconds:,.1f} s; asking the questions ...")
            retriever = MemoryRetriever(store, embedder)
            rows.append(
                (f"ours ({kind})", recalls(rank_ours(retriever, data.questions), data.questions))
            )
            try:
                in_database.append(
                    (
                        f"ours ({kind}), PG in db",
                        rank_in_database(args.postgres, store, embedder, data),
                    )
                )
            except PostgresSkipped as reason:
                if not in_database:
                    print_skipped(reason)
                    args.postgres = None
            if args.sweep:
                for weight in SWEEP_WEIGHTS:
                    scoring = Scoring(dense_weight=weight, k1=1.2, b=0.3)
                    retriever = MemoryRetriever(store, embedder, scoring=scoring)
                    ranking = rank_ours(retriever, data.questions)
                    sweeps.append((f"{kind}  {weight:.1f}", recalls(ranking, data.questions)))
        progress("BM25 baselines ...")
        baselines: list[tuple[str, Callable[[str], list[str]], dict[str, Any]]] = [
            ("BM25Okapi plain (k1 1.5, b 0.75)", plain_words, {}),
            ("BM25Okapi terms() (k1 1.5, b 0.75)", terms, {}),
            ("BM25Okapi terms() (k1 1.2, b 0.3)", terms, {"k1": 1.2, "b": 0.3}),
        ]
        for name, tokenize, params in baselines:
            rows.append(
                (name, recalls(rank_bm25(data, args.outcome, tokenize, **params), data.questions))
            )

    print_table(rows)
    print()
    if in_database:
        print_in_database(rows, in_database)
    if sweeps:
        print("sweep of Scoring(dense_weight, k1=1.2, b=0.3):")
        print_table(sweeps, first="embedder  dense_weight")
        for kind in kinds:
            mine = [(name, result) for name, result in sweeps if name.startswith(kind)]
            for k in (5, 10):
                name, best = max(mine, key=lambda item: item[1][k])
                print(f"best for {kind} at R@{k}: dense_weight {name.split()[-1]} ({best[k]:.3f})")
        print()
    results = dict(rows)
    return verdict(results["ours (semantic)"], results["BM25Okapi plain (k1 1.5, b 0.75)"])


if __name__ == "__main__":
    sys.exit(recorded("locomo_retrieval", main))
