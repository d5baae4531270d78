"""Retrieval inside PostgreSQL: the database recalls candidates, the worker scores them.

``PostgresMemoryStore(dsn, search="database")`` answers `MemoryRetriever` searches
here instead of in an index per bank held by each worker, from the columns and
statistics `autopersona_flows.memory.postgres_index` keeps.

A search is two statements: the bank's statistics and the query terms'
frequencies, then the candidates. The candidates are the rows holding enough of
the query's idf: the GIN index finds the rows holding one of the sets of query
terms whose idf reaches a threshold, chosen from the frequencies so that about
`_TARGET` rows qualify (all rows holding any query term when the query is short
or rare); of those, the `_CANDIDATES` of best estimated score (the lexical part's
bound, the dense part from the sketches, recency) come back with their vectors.
The worker scores them exactly as `Scoring` says. When fewer than asked come back,
or the last one wanted scores under the dense weight (so a row sharing no word
could rank above it), a third statement adds the rows whose sketches are nearest
the query's (Hamming distance): a query sharing no word with the bank is served by
meaning alone. Nothing is kept between searches: a worker's memory does not grow
with the banks it serves.

The ranking is the in-memory index's wherever the candidates hold its top results;
``docs/retrieval.md`` states the tolerance where they may not.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

from autopersona_flows.errors import EmbeddingMismatchError
from autopersona_flows.memory.embedders import Embedder, check_vectors
from autopersona_flows.memory.index import Scoring, TimeView
from autopersona_flows.memory.postgres_index import PREFIX_LENGTH, bank_prefix, quote, sketch
from autopersona_flows.memory.protocol import Found
from autopersona_flows.memory.records import MemoryRecord
from autopersona_flows.memory.text import memory_text, terms

__all__ = ["DatabaseSearch"]

_TARGET = 64
"""Rows the candidate query aims to find before keeping the best estimates."""
_CANDIDATES = 32
"""Rows fetched with their vectors per search (more if more are wanted)."""
_PLANNED_TERMS = 10
"""Candidates are chosen by at most this many query terms, the rarest."""
_MAX_NODES = 48
_SLOTS = 8
"""Query terms (the rarest) whose idf orders the candidates in SQL."""
_LEXEME = re.compile(r"'((?:[^']|'')*)'(?::([0-9A-D,]+))?")


_STATE = (
    "SELECT b.live, b.total_length, b.unverified,"
    " EXISTS (SELECT FROM autopersona_memories m WHERE m.user_id = b.user_id"
    "   AND m.layer = b.layer AND m.lexemes IS NULL),"
    " ARRAY(SELECT coalesce((SELECT t.df FROM autopersona_terms t WHERE t.user_id = b.user_id"
    "   AND t.layer = b.layer AND t.term = q.term), 0)"
    "   FROM unnest(%(terms)s::text[]) WITH ORDINALITY AS q(term, i) ORDER BY q.i)"
    " FROM autopersona_banks b WHERE b.user_id = %(user)s AND b.layer = %(layer)s"
)
_FETCHED = (
    "m.user_id, m.id, m.position,"
    " ts_filter(setweight(m.lexemes, 'A', %(words)s::text[]), '{a}')::text,"
    " m.length, m.vector, m.model, m.stated_at, m.record"
)
_CURRENT = (
    " AND (%(past)s OR m.valid_until IS NULL OR m.valid_until > %(as_of)s)"
    " AND (%(later)s OR m.stated_at <= %(as_of)s)"
)
_RECENCY = (
    "coalesce((1 + power(2::float8, -greatest(%(as_of)s - m.stated_at, 0)"
    " / %(half_life)s::float8)) / 2, 1)"
)
_NEAREST = (
    f"SELECT {_FETCHED} FROM autopersona_memories m"  # noqa: S608 - constant SQL, values are parameters
    " WHERE m.user_id = %(user)s AND m.layer = %(layer)s AND m.length IS NOT NULL"
    f" AND m.model = %(model)s{_CURRENT}"
    " ORDER BY bit_count(m.sketch # %(sketch)s::bit(256)), m.position LIMIT %(limit)s"
)


@lru_cache(maxsize=_SLOTS)
def _matching(slots: int) -> str:
    """The candidate query with ``slots`` weighed query terms (one text per count: prepared).

    Rows are ordered by an estimate of their score: the lexical part's bound (exact
    for rows repeating no term, see `_SLOTS`), the dense part from the sketches (the
    angle between two vectors is about pi times the share of sketch bits that
    differ) and recency. Only the GIN index can serve ``lexemes @@ query``: the
    bank is in the prefix of every lexeme, so no btree condition on the user tempts
    the planner (the worker checks the user of every row it is given).
    """
    weights = " + ".join(
        f"%(w{i})s::float8 * (m.lexemes @@ %(t{i})s::tsquery)::int" for i in range(slots)
    )
    lexical = (
        f"least(1, ({weights}) * m.tfmax * %(k1p1)s::float8"
        " / (m.tfmax + %(k1)s::float8 * (1 - %(b)s::float8 + %(b)s::float8 * m.length"
        " / %(average)s::float8)) / %(reference)s::float8)"
    )
    dense = (
        "CASE WHEN m.model = %(model)s THEN greatest(cos(pi() * bit_count(m.sketch #"
        " %(sketch)s::bit(256)) / 256) - %(floor)s::float8, 0) ELSE 1 END"
    )
    # The best rows are chosen narrow (the sort copies every row it is given), then read.
    return (
        f"SELECT {_FETCHED} FROM (SELECT m.user_id, m.layer, m.id,"  # noqa: S608 - constant SQL, values are parameters
        f" ((1 - %(weight)s::float8) * {lexical}"
        f" + %(weight)s::float8 / (1 - %(floor)s::float8) * {dense}) * {_RECENCY} AS estimate"
        " FROM autopersona_memories m"
        f" WHERE m.lexemes @@ %(query)s::tsquery AND m.layer = %(layer)s{_CURRENT}"
        " ORDER BY estimate DESC, m.position LIMIT %(limit)s) AS best"
        " JOIN autopersona_memories m USING (user_id, layer, id)"
    )


def _threshold(idf: np.ndarray, share: np.ndarray, target: float) -> float:
    """The idf sum a candidate's query terms must reach for about ``target`` of the rows.

    ``idf`` is sorted from the rarest term down, ``share`` is each term's share of the
    bank's rows (terms taken as independent); ``target`` is a share of the rows too.
    """
    k = len(idf)
    masks = np.arange(1, 2**k)
    holds = (masks[:, None] >> np.arange(k)) & 1 == 1  # subset x term
    sums = holds @ idf
    share = np.clip(share, 1e-12, 1 - 1e-12)
    exactly = np.exp(holds @ np.log(share) + (~holds) @ np.log1p(-share))
    order = np.argsort(-sums, kind="stable")
    reached = np.cumsum(exactly[order])
    return float(sums[order[min(int(np.searchsorted(reached, target)), len(order) - 1)]])


def _holding(words: list[str], idf: np.ndarray, threshold: float) -> str | None:
    """A tsquery true of the rows whose ``words`` (rarest first) reach ``threshold`` of idf.

    Each word is either held (its idf counts) or not, rarest first, stopping as soon
    as the rest cannot reach the threshold or it is reached. ``None`` if the query
    would name more than `_MAX_NODES` words.
    """
    rest = np.concatenate([np.cumsum(idf[::-1])[::-1], [0.0]])
    size = 0

    def holding(i: int, need: float) -> str | bool:
        nonlocal size
        if need <= 1e-9:
            return True
        if i == len(words) or rest[i] < need - 1e-9:
            return False
        size += 1
        if size > _MAX_NODES:
            raise OverflowError
        held, skipped = holding(i + 1, need - idf[i]), holding(i + 1, need)
        word = quote(words[i])
        with_word = word if held is True else f"{word} & ({held})" if held else False
        if skipped is True:  # only if ``with_word`` is True too: never, as need > 0
            return True
        if not with_word:
            return skipped
        return with_word if skipped is False else f"{with_word} | {skipped}"

    try:
        found = holding(0, threshold)
    except OverflowError:
        return None
    return found if isinstance(found, str) else None


def _recall(words: list[str], idf: np.ndarray, share: np.ndarray, live: int) -> str:
    """The words part of the candidate query (see `_holding`): about `_TARGET` rows.

    Queries of many words plan over their `_PLANNED_TERMS` rarest; when the tree for
    a threshold grows too big, the threshold drops (down to any single word).
    """
    words, idf, share = words[:_PLANNED_TERMS], idf[:_PLANNED_TERMS], share[:_PLANNED_TERMS]
    threshold = _threshold(idf, share, _TARGET / live) if len(words) > 1 else 0.0
    while threshold > float(idf.min()):
        query = _holding(words, idf, threshold)
        if query is not None:
            return query
        threshold *= 0.8
    return " | ".join(quote(word) for word in words)


@dataclass
class _Candidate:
    id: str
    position: int
    tfs: dict[str, int]
    length: int
    vector: np.ndarray | None
    model: str | None
    at: float
    raw: bytes
    score: float = 0.0


def _candidate(row: tuple[Any, ...]) -> tuple[str, _Candidate]:
    _, memory_id, position, lexemes, length, vector, model, at, raw = row
    tfs = {}
    for lexeme, positions in _LEXEME.findall(lexemes or ""):
        tfs[lexeme[PREFIX_LENGTH:].replace("''", "'").replace("\\\\", "\\")] = (
            positions.count(",") + 1 if positions else 1
        )
    unit = None if vector is None else np.frombuffer(bytes(vector), dtype="<f4")
    candidate = _Candidate(memory_id, int(position), tfs, int(length), unit, model, at, bytes(raw))
    return memory_id, candidate


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

    def run(
        self,
        conn: Any,
        user: bytes,
        layer: str,
        queries: Sequence[str],
        vectors: np.ndarray,
        *,
        embedder: Embedder,
        scoring: Scoring,
        time: TimeView,
        wanted: int,
    ) -> list[list[Found]]:
        """Each query's best ``wanted`` current records, best first, with their scores."""
        analysed = [sorted(set(terms(query))) for query in queries]
        vocabulary = sorted({term for words in analysed for term in words})
        params = {"user": user, "layer": layer, "terms": vocabulary}
        state = conn.execute(_STATE, params, prepare=True, binary=True).fetchone()
        if state is not None and (state[2] or state[3]):
            self._refresh(user, layer)
            state = conn.execute(_STATE, params, prepare=True, binary=True).fetchone()
        if state is None or not state[0]:
            return [[] for _ in queries]
        live, total, _, _, dfs = state
        df = dict(zip(vocabulary, (int(n) for n in dfs), strict=True))
        bank = _Bank(int(live), float(total) / int(live) or 1.0, df)
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        units = np.divide(vectors, norms, out=np.zeros_like(vectors), where=norms > 0)
        best = [
            self._one(conn, _Asked(user, layer, words, unit, bank, embedder, scoring, time), wanted)
            for words, unit in zip(analysed, units, strict=True)
        ]
        return [[Found(c.score, self._record(c.raw, layer)) for c in found] for found in best]

    def _one(self, conn: Any, asked: _Asked, wanted: int) -> list[_Candidate]:
        """One query's best ``wanted`` candidates, scored (see the module docstring)."""
        bank, scoring, time = asked.bank, asked.scoring, asked.time
        prefix = bank_prefix(asked.user, asked.layer)
        timing = {
            "as_of": time.as_of,
            "past": time.past,
            "later": time.include_later,
            "half_life": time.half_life,
            "words": [prefix + word for word in asked.words],
            "model": asked.embedder.name,
            "sketch": sketch(asked.unit),
        }
        limit = max(_CANDIDATES, 2 * wanted)
        found: dict[str, _Candidate] = {}
        idf = asked.idf
        known = sorted((t for t in asked.words if bank.df[t]), key=lambda t: (-idf[t], t))
        if known:
            weights = np.array([idf[t] for t in known])
            share = np.array([bank.df[t] / bank.live for t in known])
            slots = known[:_SLOTS]
            params: dict[str, Any] = {
                "query": _recall([prefix + t for t in known], weights, share, bank.live),
                "layer": asked.layer,
                "k1": scoring.k1,
                "k1p1": scoring.k1 + 1,
                "b": scoring.b,
                "average": bank.average,
                "reference": asked.reference,
                "weight": scoring.dense_weight,
                "floor": scoring.dense_floor,
                "limit": limit,
                **timing,
            }
            for i, term in enumerate(slots):
                params[f"w{i}"], params[f"t{i}"] = idf[term], quote(prefix + term)
            rows = conn.execute(_matching(len(slots)), params, prepare=True, binary=True).fetchall()
            found.update(_candidate(row) for row in rows if bytes(row[0]) == asked.user)
        self._score(asked, found)
        best = sorted(found.values(), key=lambda c: (-c.score, c.position))[:wanted]
        if scoring.dense_weight and (
            len(best) < wanted or best[-1].score < scoring.dense_weight * (1 - 1e-6)
        ):
            # A row sharing no word scores at most the dense weight: look by meaning too.
            nearest = conn.execute(
                _NEAREST,
                {"user": asked.user, "layer": asked.layer, "limit": limit, **timing},
                prepare=True,
                binary=True,
            ).fetchall()
            more = dict(_candidate(row) for row in nearest if row[1] not in found)
            self._score(asked, more)
            found.update(more)
            best = sorted(found.values(), key=lambda c: (-c.score, c.position))[:wanted]
        return [c for c in best if c.score > 0]

    def _score(self, asked: _Asked, found: dict[str, _Candidate]) -> None:
        """Score candidates exactly as `BankIndex` does (its float32 arithmetic)."""
        if not found:
            return
        candidates = list(found.values())
        scoring, idf = asked.scoring, asked.idf
        k1, b = scoring.k1, scoring.b
        lexical = np.zeros(len(candidates), dtype=np.float32)
        if asked.reference:
            words = asked.words
            tf = np.array([[c.tfs.get(t, 0) for t in words] for c in candidates], np.float32)
            lengths = np.array([c.length for c in candidates], dtype=np.float32)
            norm = k1 * (1 - b + b * lengths / asked.bank.average)
            weights = np.array([idf[t] for t in words]) * tf * (k1 + 1) / (tf + norm[:, None])
            lexical = np.minimum(weights.astype(np.float32).sum(axis=1) / asked.reference, 1.0)
        scores = (1 - scoring.dense_weight) * lexical
        if scoring.dense_weight:
            floor = scoring.dense_floor
            cosine = self._vectors(asked, candidates) @ asked.unit.astype(np.float32)
            scores = scores + (scoring.dense_weight / (1.0 - floor)) * np.maximum(
                cosine - floor, 0.0
            )
        if asked.time.half_life is not None:
            scores = scores * asked.time.weights(np.array([c.at for c in candidates]))
        for c, score in zip(candidates, scores.tolist(), strict=True):
            c.score = score

    def _vectors(self, asked: _Asked, candidates: list[_Candidate]) -> np.ndarray:
        """The candidates' unit vectors; those of another embedder or none embedded here."""
        embedder = asked.embedder
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

    user: bytes
    layer: str
    words: list[str]
    unit: np.ndarray
    bank: _Bank
    embedder: Embedder
    scoring: Scoring
    time: TimeView
    idf: dict[str, float] = field(init=False)
    reference: float = field(init=False)

    def __post_init__(self) -> None:
        live, df = self.bank.live, self.bank.df
        self.idf = {t: math.log(1 + (live - df[t] + 0.5) / (df[t] + 0.5)) for t in self.words}
        self.reference = sum(self.idf.values())
