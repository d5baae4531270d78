"""Retrieval inside PostgreSQL: the database holds the postings, the worker ranks.

``PostgresMemoryStore(dsn, search="database")`` answers `MemoryRetriever` searches
here instead of in an index per bank held by each worker, from what
`autopersona_flows.memory.postgres_index` keeps.

A search is two statements. The first returns, in one row, the bank's statistics
and, for each query term, its document frequency and packed postings (one value
per term: every row holding it, with the term's frequency and the row's length),
the rows whose packed postings are outdated, and the postings of the rows written
since the bank was last packed. From them the worker computes the lexical part of
every row holding a query term exactly as `BankIndex` does. The second statement
fetches the `_CANDIDATES` rows of the best lexical parts with their vectors (more
when some turn out not current), which the worker scores exactly. When fewer than
asked come back, or the last one wanted scores under the dense weight (so a row
sharing no word could rank above it), a third statement adds the rows whose
sketches are nearest the query's (Hamming distance): a query sharing no word with
the bank is served by meaning alone. Nothing is kept between searches: a worker's
memory does not grow with the banks it serves.

The ranking is the in-memory index's wherever its top results are among the rows
of the best lexical parts or nearest sketches; ``docs/retrieval.md`` states the
tolerance where they may not be.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from autopersona_flows.errors import EmbeddingMismatchError
from autopersona_flows.memory.embedders import check_vectors
from autopersona_flows.memory.postgres_index import (
    POSTING,
    POSTING_SQL,
    STALE_SQL,
    bank_prefix,
    sketch,
)
from autopersona_flows.memory.protocol import BankSearch, Found
from autopersona_flows.memory.records import MemoryRecord
from autopersona_flows.memory.text import memory_text, terms

__all__ = ["DatabaseSearch"]

_CANDIDATES = 32
"""Rows fetched with their vectors per search (more if more are wanted)."""
_TAIL = np.dtype([("term", ">i2"), *POSTING.descr])
"""An unpacked posting: which query term (from 1), then as `POSTING`."""

_FETCHED = "m.id, m.position, m.vector, m.model, m.stated_at, m.record"
_CURRENT = (
    " AND (%(past)s OR m.valid_until IS NULL OR m.valid_until > %(as_of)s)"
    " AND (%(later)s OR m.stated_at <= %(as_of)s)"
)
_QUERY_TERMS = "unnest(%(terms)s::text[]) WITH ORDINALITY AS q(term, i)"
_MATCHING = (
    # The bank's statistics, and whether some of its rows are not indexed yet.
    f"SELECT b.live, b.total_length, {STALE_SQL},"  # noqa: S608 - constant SQL, values are parameters
    # Each query term's document frequency and packed postings.
    f" ARRAY(SELECT coalesce(t.df, 0) FROM {_QUERY_TERMS} LEFT JOIN autopersona_terms t"
    "   ON t.user_id = b.user_id AND t.layer = b.layer AND t.term = q.term ORDER BY q.i),"
    f" ARRAY(SELECT (SELECT string_agg(p.postings, '' ORDER BY p.first)"
    "   FROM autopersona_packed p"
    "   WHERE p.user_id = b.user_id AND p.layer = b.layer AND p.term = q.term)"
    f"   FROM {_QUERY_TERMS} ORDER BY q.i),"
    # The rows whose packed postings are outdated.
    " (SELECT string_agg(int8send(o.position), '') FROM autopersona_outdated o"
    "   WHERE o.user_id = b.user_id AND o.layer = b.layer),"
    # The postings of the rows written since the bank was packed.
    f" (SELECT string_agg(int2send(q.i::int2) || {POSTING_SQL}, '')"
    "   FROM autopersona_unpacked w JOIN autopersona_memories m"
    "   ON m.user_id = w.user_id AND m.layer = w.layer AND m.position = w.position"
    "   CROSS JOIN unnest(m.lexemes) AS u"
    "   JOIN unnest(%(words)s::text[]) WITH ORDINALITY AS q(term, i) ON u.lexeme = q.term"
    "   WHERE w.user_id = b.user_id AND w.layer = b.layer AND m.length IS NOT NULL)"
    " FROM autopersona_banks b WHERE b.user_id = %(user)s AND b.layer = %(layer)s"
)
_FETCH = (
    f"SELECT {_FETCHED} FROM autopersona_memories m"  # noqa: S608 - constant SQL, values are parameters
    " WHERE m.user_id = %(user)s AND m.layer = %(layer)s"
    f" AND m.position = ANY(%(positions)s::bigint[]) AND m.length IS NOT NULL{_CURRENT}"
)
_NEAREST = (
    f"SELECT {_FETCHED} FROM autopersona_memories m"  # noqa: S608 - constant SQL, values are parameters
    " WHERE m.user_id = %(user)s AND m.layer = %(layer)s AND m.length IS NOT NULL"
    f" AND m.model = %(model)s{_CURRENT}"
    " ORDER BY bit_count(m.sketch # %(sketch)s::bit(256)), m.position LIMIT %(limit)s"
)


@dataclass
class _Candidate:
    id: str
    position: int
    vector: np.ndarray | None
    model: str | None
    at: float
    raw: bytes
    score: float = 0.0


def _candidate(row: tuple[Any, ...]) -> tuple[str, _Candidate]:
    memory_id, position, vector, model, at, raw = row
    unit = None if vector is None else np.frombuffer(bytes(vector), dtype="<f4")
    return memory_id, _Candidate(memory_id, int(position), unit, model, at, bytes(raw))


class DatabaseSearch:
    """Runs the searches of one retrieval in a bank (see the module docstring).

    Args:
        record: Reads a stored record's JSON bytes (checking it is one of the layer).
        refresh: Indexes the bank's rows that are not yet (rows from before the
            search columns, or written by something else); called, then the
            search made again, when a search finds some.
    """

    def __init__(
        self,
        record: Callable[[bytes, str], MemoryRecord],
        refresh: Callable[[bytes, str], None],
    ) -> None:
        self._record = record
        self._refresh = refresh

    def run(self, conn: Any, user: bytes, layer: str, search: BankSearch) -> list[list[Found]]:
        """Each query's best ``search.wanted`` current records, best first, with their scores."""
        norms = np.linalg.norm(search.vectors, axis=1, keepdims=True)
        units = np.divide(search.vectors, norms, out=np.zeros_like(search.vectors), where=norms > 0)
        best = [
            self._one(conn, user, layer, search, query=query, unit=unit)
            for query, unit in zip(search.queries, units, strict=True)
        ]
        return [[Found(c.score, self._record(c.raw, layer)) for c in found] for found in best]

    def _one(
        self,
        conn: Any,
        user: bytes,
        layer: str,
        search: BankSearch,
        *,
        query: str,
        unit: np.ndarray,
    ) -> list[_Candidate]:
        """One query's best candidates, scored (see the module docstring)."""
        words = sorted(set(terms(query)))
        prefix = bank_prefix(user, layer)
        limit = max(_CANDIDATES, 2 * search.wanted)
        params: dict[str, Any] = {
            "user": user,
            "layer": layer,
            "terms": words,
            "words": [prefix + word for word in words],
            "as_of": search.time.as_of,
            "past": search.time.past,
            "later": search.time.include_later,
            "limit": limit,
        }
        state = conn.execute(_MATCHING, params, prepare=True, binary=True).fetchone()
        if state is not None and state[2]:
            self._refresh(user, layer)
            state = conn.execute(_MATCHING, params, prepare=True, binary=True).fetchone()
        if state is None or not state[0]:
            return []
        live, total, _, dfs, packed, outdated, unpacked = state
        bank = _Bank(int(live), float(total) / int(live) or 1.0, dict(zip(words, dfs, strict=True)))
        asked = _Asked(layer, words, unit, bank, search)
        asked.weigh(packed, outdated or b"", unpacked or b"")
        found: dict[str, _Candidate] = {}
        wanted, weight = search.wanted, search.scoring.dense_weight
        # Rows of the best lexical parts first; rows found not current make way for more.
        count, fetched = limit, 0
        while len(found) < wanted and fetched < asked.holding:
            params["positions"] = asked.best(count)[fetched:].tolist()
            rows = conn.execute(_FETCH, params, prepare=True, binary=True).fetchall()
            found.update(_candidate(row) for row in rows)
            fetched, count = count, 4 * count
        self._score(asked, found)
        best = sorted(found.values(), key=lambda c: (-c.score, c.position))[:wanted]
        if weight and (len(best) < wanted or best[-1].score < weight * (1 - 1e-6)):
            # A row sharing no word scores at most the dense weight: look by meaning too.
            params.update(model=search.embedder.name, sketch=sketch(unit))
            nearest = conn.execute(_NEAREST, params, prepare=True, binary=True).fetchall()
            more = dict(_candidate(row) for row in nearest if row[0] not in found)
            self._score(asked, more)
            found.update(more)
            best = sorted(found.values(), key=lambda c: (-c.score, c.position))[:wanted]
        return [c for c in best if c.score > 0]

    def _score(self, asked: _Asked, found: dict[str, _Candidate]) -> None:
        """Score candidates exactly as `BankIndex` does (its float32 arithmetic)."""
        if not found:
            return
        candidates = list(found.values())
        scoring = asked.search.scoring
        lexical = asked.lexical(np.array([c.position for c in candidates], dtype=np.int64))
        scores = (1 - scoring.dense_weight) * lexical
        if scoring.dense_weight:
            floor = scoring.dense_floor
            cosine = self._vectors(asked, candidates) @ asked.unit.astype(np.float32)
            scores = scores + (scoring.dense_weight / (1.0 - floor)) * np.maximum(
                cosine - floor, 0.0
            )
        if asked.search.time.half_life is not None:
            scores = scores * asked.search.time.weights(np.array([c.at for c in candidates]))
        for c, score in zip(candidates, scores.tolist(), strict=True):
            c.score = score

    def _vectors(self, asked: _Asked, candidates: list[_Candidate]) -> np.ndarray:
        """The candidates' unit vectors; those of another embedder or none embedded here."""
        embedder = asked.search.embedder
        matrix = np.zeros((len(candidates), embedder.dim), dtype=np.float32)
        missing = []
        for i, c in enumerate(candidates):
            if c.vector is not None and c.model == embedder.name and len(c.vector) == embedder.dim:
                matrix[i] = c.vector
            elif c.vector is None or getattr(embedder, "local", False):
                missing.append(i)
            else:
                raise EmbeddingMismatchError(
                    f"{asked.layer} memory {c.id} was embedded by {c.model!r} "
                    f"({len(c.vector)} dimensions), but this retriever uses "
                    f"{embedder.name!r} ({embedder.dim}); re-embed the store with "
                    f"`autopersona reindex STORE --embedder ...`"
                )
        if missing:
            texts = [
                memory_text(self._record(candidates[i].raw, asked.layer).content) for i in missing
            ]
            vectors = np.asarray(check_vectors(embedder, texts, embedder.embed(texts)))
            norms = np.linalg.norm(vectors, axis=1, keepdims=True)
            matrix[missing] = np.divide(
                vectors, norms, out=np.zeros_like(vectors, dtype=np.float32), where=norms > 0
            )
        return matrix


@dataclass(frozen=True)
class _Bank:
    live: int
    average: float
    df: dict[str, int]


@dataclass
class _Asked:
    """One query of a search, and what scoring it needs."""

    layer: str
    words: list[str]
    unit: np.ndarray
    bank: _Bank
    search: BankSearch
    idf: dict[str, float] = field(init=False)
    reference: float = field(init=False)
    _rows: np.ndarray = field(init=False, default_factory=lambda: np.empty(0, np.int64))
    _lexical: np.ndarray = field(init=False, default_factory=lambda: np.empty(0, np.float32))

    def __post_init__(self) -> None:
        live, df = self.bank.live, self.bank.df
        self.idf = {t: math.log(1 + (live - df[t] + 0.5) / (df[t] + 0.5)) for t in self.words}
        self.reference = sum(self.idf.values())

    def weigh(self, packed: list[bytes | None], outdated: bytes, unpacked: bytes) -> None:
        """Compute the lexical part of every row holding a query term, for `best` and `lexical`.

        Every such row is in the postings, packed or not.

        Args:
            packed: Each query term's packed postings (`POSTING`), if it has some.
            outdated: The positions (int8) whose packed postings no longer hold.
            unpacked: The postings of rows written since the pack (`_TAIL`).
        """
        lists = [postings or b"" for postings in packed]
        held = np.frombuffer(b"".join(lists), dtype=POSTING)
        term = np.repeat(np.arange(len(lists)), [len(p) // POSTING.itemsize for p in lists])
        skip = np.frombuffer(outdated, dtype=">i8")
        if len(skip):
            kept = ~np.isin(held["position"], skip)
            held, term = held[kept], term[kept]
        tail = np.frombuffer(unpacked, dtype=_TAIL)
        term = np.concatenate([term, tail["term"] - 1])
        tf = np.concatenate([held["tf"], tail["tf"]]).astype(np.float32)
        length = np.concatenate([held["length"], tail["length"]]).astype(np.float32)
        k1, b = self.search.scoring.k1, self.search.scoring.b
        idf = np.array([self.idf[word] for word in self.words] or [0.0], dtype=np.float32)
        norm = k1 * (1 - b + b * length / np.float32(self.bank.average))
        weight = idf[term] * tf * np.float32(k1 + 1) / (tf + norm)
        # Native byte order (a big-endian array sorts several times slower), and a stable
        # sort: it merges the terms' lists, each in row order, in one pass.
        every = np.concatenate([held["position"], tail["position"]]).astype(np.int64)
        order = np.argsort(every, kind="stable")
        every = every[order]
        starts = np.flatnonzero(np.diff(every, prepend=every[:1] - 1))
        rows = every[starts]
        weights = weight[order]
        sums = np.add.reduceat(weights, starts) if len(rows) else weights  # float32, as `BankIndex`
        self._rows = rows
        self._lexical = np.minimum(sums / (self.reference or 1.0), 1.0)

    def best(self, count: int) -> np.ndarray:
        """The positions of the ``count`` rows of the best lexical parts, best first.

        Ties go to the earlier row, as in `BankIndex`.
        """
        rows, lexical = self._rows, self._lexical
        if count < len(rows):  # only the rows that can be among them are sorted
            least = np.partition(lexical, len(rows) - count)[len(rows) - count]
            chosen = np.flatnonzero(lexical >= least)
            rows, lexical = rows[chosen], lexical[chosen]
        return rows[np.lexsort((rows, -lexical))][:count]

    @property
    def holding(self) -> int:
        """How many rows hold a query term."""
        return len(self._rows)

    def lexical(self, positions: np.ndarray) -> np.ndarray:
        """The lexical parts (see `Scoring`) of the rows at ``positions`` (0: no query term)."""
        at = np.minimum(np.searchsorted(self._rows, positions), max(len(self._rows) - 1, 0))
        lexical = np.zeros(len(positions), dtype=np.float32)
        if len(self._rows):
            held = self._rows[at] == positions
            lexical[held] = self._lexical[at[held]]
        return lexical
