"""The in-memory search index of one (user, layer) bank: dense vectors plus BM25.

An index follows its bank through `MemoryStore.changes`, so after a write it
costs the changed records, not the bank. Vectors come from the embeddings stored
with the records; only a record stored without one is embedded here (once, and
only in memory: ``autopersona reindex`` stores them), and so is one stored by
another embedder when this one says it may (``local``, as the default
`SentenceEncoder` does): a store written before the default embedder changed keeps
working, a little slower to open, until reindexed. Any other embedder refuses a bank
written by another (`EmbeddingMismatchError`): a remote one never re-embeds a bank
behind the caller's back.
"""

from __future__ import annotations

import logging
import math
from collections import Counter, OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import cast

import numpy as np

from autopersona_flows import _json
from autopersona_flows.errors import EmbeddingMismatchError
from autopersona_flows.memory.embedders import Embedder, check_vectors
from autopersona_flows.memory.protocol import ChangeSet
from autopersona_flows.memory.records import LayerContent, MemoryRecord
from autopersona_flows.memory.text import memory_text, normalise, terms

__all__ = ["BankIndex", "Scoring", "TimeView"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Scoring:
    """How dense and lexical evidence combine into one score in [0, 1].

    ``score = dense_weight * dense + (1 - dense_weight) * min(1, bm25 / bm25_ref)``,
    where ``dense = max(cosine - dense_floor, 0) / (1 - dense_floor)`` and
    ``bm25_ref`` is what BM25 gives a memory of average length holding every query
    term once (the sum of the terms' idf). The lexical part is thus the share of the
    query's term weight a memory covers: a memory repeating the query scores about 1,
    one sharing no term 0, and a threshold means the same in every bank. The dense
    part counts only a cosine above what unrelated texts reach with the embedder (its
    ``dense_floor``): a memory unrelated in words and in meaning scores 0, and is
    never returned.

    Attributes:
        dense_weight: Weight of the embedding cosine; the rest goes to BM25.
        dense_floor: The cosine below which texts are unrelated, for the embedder.
        k1: BM25 term-frequency saturation.
        b: BM25 length normalisation (memories are short; little is best).
    """

    dense_weight: float = 0.3
    k1: float = 1.2
    b: float = 0.3
    dense_floor: float = 0.0

    def __post_init__(self) -> None:
        for name in ("dense_weight", "k1", "b", "dense_floor"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"{name} must be a number, got {value!r}")
        if not 0.0 <= self.dense_weight <= 1.0 or not 0.0 <= self.b <= 1.0 or self.k1 < 0:
            raise ValueError("dense_weight and b must lie in [0, 1] and k1 must be >= 0")
        if not 0.0 <= self.dense_floor < 1.0:
            raise ValueError(f"dense_floor must lie in [0, 1), got {self.dense_floor}")


@dataclass(frozen=True)
class TimeView:
    """Which memories are current at a time, and how much recency counts.

    Attributes:
        as_of: POSIX seconds of the time the bank is looked at.
        include_later: Whether memories stated after ``as_of`` count (looking at "now",
            another worker's clock may run a little ahead).
        past: Whether memories no longer current count too (history).
        half_life: Seconds after which a memory's score is weighed 3/4, then 5/8...
            towards 1/2 (``score * (1 + 2 ** -(age / half_life)) / 2``); ``None``:
            recency does not weigh.
    """

    as_of: float
    include_later: bool = True
    past: bool = False
    half_life: float | None = None

    def current(self, at: np.ndarray, until: np.ndarray) -> np.ndarray:
        """Whether each row (stated at ``at``, valid until ``until``) holds then."""
        holds = np.ones(len(at), dtype=bool) if self.past else until > self.as_of
        return holds if self.include_later else holds & (at <= self.as_of)

    def weights(self, at: np.ndarray) -> np.ndarray | float:
        """Each row's recency weight in (1/2, 1]."""
        if self.half_life is None:
            return 1.0
        age = np.maximum(self.as_of - at, 0.0)
        return ((1.0 + np.exp2(-age / self.half_life)) / 2.0).astype(np.float32)


_SCORED_FLOATS = 1 << 18
"""Scores an index keeps of the queries it answered (1 MB): what the vectors of 700 to
1,000 memories take, and the scores of a few hundred queries in a bank of that size."""


def _contexts(content: LayerContent) -> set[str]:
    return {normalise(context) for context in getattr(content, "contexts", ())}


def content_digest(content: LayerContent) -> str:
    """Identify content exactly: equal content, equal digest."""
    return _json.digest(content.model_dump(mode="json"))


class BankIndex:
    """Search structures over one bank's live records (not thread-safe: callers lock)."""

    def __init__(self, embedder: Embedder, scoring: Scoring) -> None:
        self.embedder = embedder
        self.scoring = scoring
        self.cursor: str | None = None
        self._clear()

    def _clear(self) -> None:
        self.records: list[MemoryRecord | None] = []  # by row; None once removed
        self.rows: dict[str, int] = {}  # live id -> row
        self.digests: dict[str, dict[str, None]] = {}  # content digest -> live ids, in order
        self.contexts: dict[str, dict[str, None]] = {}  # learned-at context -> live ids
        self._vectors = np.zeros((64, self.embedder.dim), dtype=np.float32)
        self._live = np.zeros(64, dtype=bool)
        self._lengths = np.zeros(64, dtype=np.float32)
        # Event time (`MemoryRecord.at`) and validity end, as POSIX seconds.
        self._at = np.zeros(64, dtype=np.float64)
        self._until = np.full(64, np.inf, dtype=np.float64)
        # Postings grow as Python lists (cheap appends); their NumPy copies are
        # extended by the new tail only when a query needs them.
        self._postings: dict[str, tuple[list[int], list[int]]] = {}
        self._arrays: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._df: Counter[str] = Counter()
        self._total_length = 0.0
        self._weighed: dict[str, tuple[float, np.ndarray | None, np.ndarray | None]] = {}
        self._holding: dict[tuple[str, ...], list[MemoryRecord]] = {}
        # (query, its vector's bytes) -> its relevance of every row: see `scores_many`
        self._scored: OrderedDict[tuple[str, bytes], np.ndarray] = OrderedDict()

    def __len__(self) -> int:
        return len(self.rows)

    # -- maintenance -------------------------------------------------------------------

    def apply(self, changes: ChangeSet) -> None:
        """Bring the index up to date with a change set from the store.

        A buried record (`MemoryRecord.buried_at`) is left out as if deleted: every
        search, lookup and duplicate check goes through an index, so none of them
        sees it, and unburying it brings it back through the same change feed.
        """
        if changes.full or changes.records or changes.deleted:
            self._weighed = {}  # every idf and length norm moves with the bank
            self._holding = {}
            self._scored.clear()
        if changes.full:
            self._clear()
        for memory_id in changes.deleted:
            self._remove(memory_id)
        for record in changes.records:
            self._remove(record.id)
        self._add([record for record in changes.records if record.buried_at is None])
        self.cursor = changes.cursor
        dead = len(self.records) - len(self.rows)
        if dead > max(1024, len(self.rows)):
            rows = sorted(self.rows.values())
            live = self._records_at(rows)
            vectors = self._vectors[rows]  # kept: nothing is embedded twice
            self._clear()
            self._add(live, vectors)

    def _records_at(self, rows: Iterable[int]) -> list[MemoryRecord]:
        """The records at live rows (only a removed row holds ``None``)."""
        return cast("list[MemoryRecord]", [self.records[row] for row in rows])

    def _vectors_of(self, records: list[MemoryRecord]) -> np.ndarray:
        vectors = np.zeros((len(records), self.embedder.dim), dtype=np.float32)
        missing = []
        foreign: set[str] = set()
        for i, record in enumerate(records):
            embedding = record.embedding
            if embedding is None:
                missing.append(i)
            elif embedding.model != self.embedder.name or embedding.dim != self.embedder.dim:
                if getattr(self.embedder, "local", False):
                    missing.append(i)
                    foreign.add(embedding.model)
                    continue
                raise EmbeddingMismatchError(
                    f"{record.layer} memory {record.id} was embedded by {embedding.model!r} "
                    f"({embedding.dim} dimensions), but this retriever uses "
                    f"{self.embedder.name!r} ({self.embedder.dim}); re-embed the store with "
                    f"`autopersona reindex STORE --embedder ...`"
                )
            else:
                vectors[i] = embedding.array()
        if foreign:
            _log.warning(
                "memories embedded by %s are embedded again by %s in memory; store the new "
                "vectors with `autopersona reindex STORE`",
                ", ".join(sorted(foreign)),
                self.embedder.name,
            )
        if missing:
            texts = [memory_text(records[i].content) for i in missing]
            vectors[missing] = check_vectors(self.embedder, texts, self.embedder.embed(texts))
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        return np.divide(vectors, norms, out=np.zeros_like(vectors), where=norms > 0)

    def _add(self, records: list[MemoryRecord], vectors: np.ndarray | None = None) -> None:
        if not records:
            return
        if vectors is None:
            vectors = self._vectors_of(records)
        start = len(self.records)
        self._reserve(start + len(records))
        self._vectors[start : start + len(records)] = vectors
        for row, record in enumerate(records, start):
            counts = Counter(terms(memory_text(record.content)))
            self.records.append(record)
            self.rows[record.id] = row
            self.digests.setdefault(content_digest(record.content), {})[record.id] = None
            for context in _contexts(record.content):
                self.contexts.setdefault(context, {})[record.id] = None
            self._live[row] = True
            self._at[row] = record.at.timestamp()
            self._until[row] = record.valid_until.timestamp() if record.valid_until else np.inf
            self._lengths[row] = length = sum(counts.values())
            self._total_length += length
            for term, tf in counts.items():
                rows, tfs = self._postings.setdefault(term, ([], []))
                rows.append(row)
                tfs.append(tf)
                self._df[term] += 1

    def _remove(self, memory_id: str) -> None:
        row = self.rows.pop(memory_id, None)
        if row is None:
            return
        record = self.records[row]
        assert record is not None
        self.records[row] = None
        self._live[row] = False
        digest = content_digest(record.content)
        same = self.digests[digest]
        del same[memory_id]
        if not same:
            del self.digests[digest]
        for context in _contexts(record.content):
            learned = self.contexts[context]
            del learned[memory_id]
            if not learned:
                del self.contexts[context]
        self._total_length -= float(self._lengths[row])
        for term in set(terms(memory_text(record.content))):
            self._df[term] -= 1
            if not self._df[term]:
                del self._df[term]

    def _reserve(self, size: int) -> None:
        capacity = len(self._live)
        if size <= capacity:
            return
        while capacity < size:
            capacity *= 2
        vectors = np.zeros((capacity, self.embedder.dim), dtype=np.float32)
        vectors[: len(self._vectors)] = self._vectors
        self._vectors = vectors
        grow = capacity - len(self._live)
        self._live = np.concatenate([self._live, np.zeros(grow, bool)])
        self._lengths = np.concatenate([self._lengths, np.zeros(grow, np.float32)])
        self._at = np.concatenate([self._at, np.zeros(grow, np.float64)])
        self._until = np.concatenate([self._until, np.full(grow, np.inf, np.float64)])

    # -- scoring -----------------------------------------------------------------------

    def scores(self, query: str, query_vector: np.ndarray) -> np.ndarray:
        """Score every row for ``query``; removed rows score -1."""
        return self.scores_many([query], query_vector[None, :])[0]

    def scores_many(
        self, queries: list[str], query_vectors: np.ndarray, time: TimeView | None = None
    ) -> np.ndarray:
        """Score every row for each query at once: shape ``(len(queries), rows)``.

        A term shared by several queries is weighed once; the dense part is one
        matrix product. A query's relevance of every row is kept until the bank
        changes (a node's searches repeat in every run, and several nodes of a run
        search its request alike), within a budget of `_SCORED_FLOATS` scores. With
        ``time``, rows not current then score -1 and scores are weighed by recency
        as it says.
        """
        n = len(self.records)
        result = np.zeros((len(queries), n), dtype=np.float32)
        if not self.rows:
            return result - 1
        keys = [
            (query, vector.tobytes()) for query, vector in zip(queries, query_vectors, strict=True)
        ]
        missing = []
        for i, key in enumerate(keys):
            kept = self._scored.get(key)
            if kept is None:
                missing.append(i)
            else:
                result[i] = kept
                self._scored.move_to_end(key)
        if missing:
            scored = self._relevance([queries[i] for i in missing], query_vectors[missing], n)
            result[missing] = scored
            if n * 2 <= _SCORED_FLOATS:
                # Copies: a kept row must not hold the whole batch it was scored in.
                self._scored.update(
                    (keys[i], row.copy()) for i, row in zip(missing, scored, strict=True)
                )
                while len(self._scored) * n > _SCORED_FLOATS:
                    self._scored.popitem(last=False)
        if time is not None:
            result *= time.weights(self._at[:n])
            result[:, ~time.current(self._at[:n], self._until[:n])] = -1.0
        result[:, ~self._live[:n]] = -1.0
        return result

    def _relevance(self, queries: list[str], query_vectors: np.ndarray, n: int) -> np.ndarray:
        """Each query's score of rows ``[:n]``, before time and liveness count."""
        result = np.zeros((len(queries), n), dtype=np.float32)
        weight = self.scoring.dense_weight
        if weight:
            norms = np.linalg.norm(query_vectors, axis=1, keepdims=True)
            unit = np.divide(
                query_vectors, norms, out=np.zeros_like(query_vectors), where=norms > 0
            )
            floor = self.scoring.dense_floor
            result += (weight / (1.0 - floor)) * np.maximum(unit @ self._vectors[:n].T - floor, 0.0)
        if weight < 1:
            for i, query in enumerate(queries):
                result[i] += (1 - weight) * self._bm25(query, n)
        return result

    def _bm25(self, query: str, n: int) -> np.ndarray:
        """BM25 of every row for ``query`` over the query's reference (see `Scoring`).

        A term's idf and per-row weights are kept until the bank changes: a node's
        searches repeat every run, and a bank changes far less often than it is read.
        """
        scores = np.zeros(n, dtype=np.float32)
        reference = 0.0
        for term in set(terms(query)):
            weighed = self._weighed.get(term)
            if weighed is None:
                weighed = self._weighed[term] = self._term_weights(term)
            idf, rows, values = weighed
            reference += idf
            if rows is not None:
                scores[rows] += values
        return np.minimum(scores / reference, 1.0) if reference else scores

    def _term_weights(self, term: str) -> tuple[float, np.ndarray | None, np.ndarray | None]:
        k1, b = self.scoring.k1, self.scoring.b
        live = len(self.rows)
        df = self._df.get(term, 0)
        idf = math.log(1 + (live - df + 0.5) / (df + 0.5))
        if not df:
            return idf, None, None
        rows, tf = self._posting_arrays(term)
        average = self._total_length / live or 1.0
        norm = k1 * (1 - b + b * self._lengths[rows] / average)
        return idf, rows, idf * tf * (k1 + 1) / (tf + norm)

    def _posting_arrays(self, term: str) -> tuple[np.ndarray, np.ndarray]:
        rows, tfs = self._postings[term]
        cached = self._arrays.get(term)
        done = 0 if cached is None else len(cached[0])
        if done < len(rows):
            new_rows = np.asarray(rows[done:], dtype=np.int64)
            new_tfs = np.asarray(tfs[done:], dtype=np.float32)
            cached = self._arrays[term] = (
                (new_rows, new_tfs)
                if cached is None
                else (np.concatenate([cached[0], new_rows]), np.concatenate([cached[1], new_tfs]))
            )
        assert cached is not None  # every indexed term has a posting
        return cached

    def containing(self, words: tuple[str, ...]) -> list[MemoryRecord]:
        """The live records holding every term of any of ``words``, most recent first.

        Ordered by when each was said (`MemoryRecord.at`, then id), so that any
        process holding the same bank answers alike; kept until the bank changes.
        """
        found = self._holding.get(words)
        if found is None:
            rows: set[int] = set()
            for word in words:
                wanted = set(terms(word))
                if not wanted or any(term not in self._postings for term in wanted):
                    continue
                held = set.intersection(*(set(self._postings[term][0]) for term in wanted))
                rows |= {row for row in held if self._live[row]}
            found = sorted(
                self._records_at(rows),
                key=lambda record: (record.at, record.id),
                reverse=True,
            )
            self._holding[words] = found
        return found

    def learned_at(self, contexts: list[str]) -> list[MemoryRecord]:
        """The live records learned at any of ``contexts`` (see `PersonaMemory.contexts`)."""
        ids = dict.fromkeys(
            memory_id
            for context in contexts
            for memory_id in self.contexts.get(normalise(context), ())
        )
        return self._records_at(self.rows[memory_id] for memory_id in ids)

    def find(self, content: LayerContent) -> list[MemoryRecord]:
        """The live records whose content equals ``content``, oldest first."""
        ids = sorted(self.digests.get(content_digest(content), ()))  # ids sort by creation
        return self._records_at(self.rows[memory_id] for memory_id in ids)
