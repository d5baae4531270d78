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

A JSONL bank's index is read by byte offsets and saved beside the bank
(`autopersona_flows.memory.persisted`): its rows keep where their records lie in the
bank file and read back only the records a search returns, and `state` and `load`
turn it into arrays and back.
"""

from __future__ import annotations

import logging
import math
import secrets
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

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


def _contexts(content: LayerContent) -> set[str]:
    return {normalise(context) for context in getattr(content, "contexts", ())}


def content_digest(content: LayerContent) -> str:
    """Identify content exactly: equal content, equal digest."""
    return _json.digest(content.model_dump(mode="json"))


class _Unread:
    """A row whose record stays in the bank file until it is needed (see `BankIndex.reader`)."""


_UNREAD = _Unread()
_KEPT_READ = 4096
"""Records read back from a bank file that an index keeps (the rest are read again)."""


class _Column:
    """One string per row, kept as it was saved until a lookup needs them all.

    Saved ids and digests are fixed-width bytes (an array, one row read without
    decoding the rest); contexts are one text, a row a line. A loaded index serves
    searches without splitting either; lookups by id or content (tail updates,
    `BankIndex.find`) split them once.
    """

    def __init__(self, saved: np.ndarray | str | None = None) -> None:
        self._saved = saved
        self._values: list[str] | None = [] if saved is None else None
        self._tail: list[str] = []

    def append(self, value: str) -> None:
        (self._tail if self._values is None else self._values).append(value)

    def get(self, row: int) -> str:
        if self._values is None and isinstance(self._saved, np.ndarray):
            if row < len(self._saved):
                return bytes(self._saved[row]).decode()
            return self._tail[row - len(self._saved)]
        return self.values()[row]

    def values(self) -> list[str]:
        if self._values is None:
            saved = self._saved
            if isinstance(saved, np.ndarray):
                self._values = [bytes(value).decode() for value in saved.tolist()]
            else:
                self._values = saved.split("\n") if saved else []
            self._values += self._tail
            self._saved, self._tail = None, []
        return self._values

    def array(self) -> np.ndarray:
        """The values as fixed-width bytes (ASCII values only: ids, digests)."""
        if self._values is None and isinstance(self._saved, np.ndarray):
            tail = np.array([value.encode() for value in self._tail], dtype=self._saved.dtype)
            return np.concatenate([self._saved, tail])
        values = [value.encode() for value in self.values()]
        return np.array(values) if values else np.zeros(0, dtype="S1")

    def text(self) -> str:
        if self._values is None and isinstance(self._saved, str):
            return "\n".join([self._saved, *self._tail]) if self._tail else self._saved
        return "\n".join(self.values())


_CONTEXT_SEPARATOR = "\x1f"  # never in a normalised context (control characters are spaced)


class BankIndex:
    """Search structures over one bank's live records (not thread-safe: callers lock).

    Rows are never reused: a removed record's row scores -1 until the index is
    compacted (more dead rows than live ones). A row may keep only where its record
    lies in the bank file (`reader`, for a JSONL bank): searches read back the
    records they return, nothing else.
    """

    def __init__(self, embedder: Embedder, scoring: Scoring) -> None:
        self.embedder = embedder
        self.scoring = scoring
        self.cursor: str | None = None
        self.reader: Callable[[int, int, str], MemoryRecord] | None = None
        """Reads the record whose line lies at (offset, length) in the bank file, and
        checks that it is the one of that id."""
        self.unsaved = 0  # entries applied since the index was saved or loaded (JSONL)
        self._clear()

    def _clear(self) -> None:
        self.layout = secrets.token_hex(8)  # changes whenever rows are renumbered
        self._records: list[MemoryRecord | _Unread | None] = []  # by row; None once removed
        self._read: OrderedDict[int, MemoryRecord] = OrderedDict()  # unread rows read back
        self._ids = _Column()
        self._digests = _Column()  # content digest by row
        self._contexts = _Column()  # learned-at contexts by row, joined
        self._live_count = 0
        self._row_of: dict[str, int] | None = {}  # live id -> row; None until needed
        self._by_digest: dict[str, dict[str, None]] | None = {}  # digest -> live ids, in order
        self._by_context: dict[str, dict[str, None]] | None = {}  # context -> live ids
        # Vectors: those loaded (mapped from a file, read-only), then rows added since.
        self._base_vectors = np.zeros((0, self.embedder.dim), dtype=np.float32)
        self._vectors = np.zeros((64, self.embedder.dim), dtype=np.float32)
        self._live = np.zeros(64, dtype=bool)
        self._lengths = np.zeros(64, dtype=np.float32)
        # Event time (`MemoryRecord.at`) and validity end, as POSIX seconds.
        self._at = np.zeros(64, dtype=np.float64)
        self._until = np.full(64, np.inf, dtype=np.float64)
        # Where each row's line lies in the bank file (offset, length); -1: not known.
        self._where = np.full((64, 2), -1, dtype=np.int64)
        # Postings: those loaded (term -> slice of the saved arrays), then the rows
        # added since as Python lists (cheap appends); their NumPy copies are
        # extended by the new tail only when a query needs them.
        self._saved_terms: dict[str, int] = {}
        self._saved_starts = np.zeros(1, dtype=np.int64)
        self._saved_rows = np.zeros(0, dtype=np.int64)
        self._saved_tfs = np.zeros(0, dtype=np.float32)
        self._postings: dict[str, tuple[list[int], list[int]]] = {}
        # term -> (rows, tfs, how many of them are the loaded postings)
        self._arrays: dict[str, tuple[np.ndarray, np.ndarray, int]] = {}
        self._df: Counter[str] = Counter()
        self._total_length = 0.0
        # Rows keep their event time: what `_recency` derives from it holds until a clear.
        self._decay: tuple[float, int, float, np.ndarray] | None = None
        self._invalidate()

    def _invalidate(self) -> None:
        """Drop what depends on the whole bank (idf, length norms): it has changed."""
        self._weighed: dict[str, tuple[float, np.ndarray | None, np.ndarray | None]] = {}
        self._holding: dict[tuple[str, ...], list[int]] = {}  # words -> rows
        # (rows, from, until, rows left out) of searches at "now": see `_left_out`
        self._expiring: tuple[int, float, float, np.ndarray] | None = None

    def __len__(self) -> int:
        return self._live_count

    @property
    def rows(self) -> dict[str, int]:
        """Each live record's row, by id."""
        if self._row_of is None:
            live = self._live
            self._row_of = {
                memory_id: row for row, memory_id in enumerate(self._ids.values()) if live[row]
            }
        return self._row_of

    @property
    def size(self) -> int:
        """How many rows the index holds, removed ones included."""
        return len(self._records)

    def record(self, row: int) -> MemoryRecord | None:
        """The record at ``row`` (read back from the bank file if need be); ``None`` if removed."""
        record = self._records[row]
        if not isinstance(record, _Unread):
            return record
        kept = self._read.get(row)
        if kept is not None:
            self._read.move_to_end(row)
            return kept
        assert self.reader is not None  # rows are left unread only with a reader
        offset, length = (int(value) for value in self._where[row])
        record = self.reader(offset, length, self._ids.get(row))
        self._read[row] = record
        while len(self._read) > _KEPT_READ:
            self._read.popitem(last=False)
        return record

    def nbytes(self) -> int:
        """Roughly what the index holds in memory, in bytes.

        Vectors mapped from a saved index count as the file's pages, which the
        system may drop and read again, not as memory held; records kept whole (a
        store without a file to read them back from) count 2 kB each.
        """
        arrays = (self._vectors, self._live, self._lengths, self._at, self._until, self._where)
        held = sum(array.nbytes for array in arrays)
        whole = 0 if self.reader is not None else self._live_count
        # ids, digests and row slots, and two postings (row, tf) per term of a row
        return held + 2048 * whole + 160 * len(self._records) + 16 * int(self._total_length)

    # -- maintenance -------------------------------------------------------------------

    def apply(self, changes: ChangeSet) -> None:
        """Bring the index up to date with a change set from the store.

        A buried record (`MemoryRecord.buried_at`) is left out as if deleted: every
        search, lookup and duplicate check goes through an index, so none of them
        sees it, and unburying it brings it back through the same change feed.
        """
        if changes.full:
            self._clear()
        for memory_id in changes.deleted:
            self._remove(memory_id)
        self.add_records(changes.records)
        self.cursor = changes.cursor

    def add_records(
        self, records: list[MemoryRecord], where: list[tuple[int, int]] | None = None
    ) -> None:
        """Add (or replace) records, each at the end, in order; buried ones are left out.

        Args:
            records: The records' current versions.
            where: Where each record's line lies in the bank file (offset, length):
                the index then keeps that, not the record (see `reader`).
        """
        if records:
            self._invalidate()
        for record in records:
            self._remove(record.id)
        kept = [i for i, record in enumerate(records) if record.buried_at is None]
        self._add(
            [records[i] for i in kept], where=None if where is None else [where[i] for i in kept]
        )
        self._maybe_compact()

    def remove(self, memory_ids: Iterable[str]) -> None:
        """Remove records by id; an id the index does not hold is ignored."""
        for memory_id in memory_ids:
            self._remove(memory_id)
        self._maybe_compact()

    def _maybe_compact(self) -> None:
        dead = len(self._records) - self._live_count
        if dead > max(1024, self._live_count):
            rows = np.flatnonzero(self._live[: len(self._records)])
            live = self._records_at(rows.tolist())
            vectors = self._vectors_at(rows)  # kept: nothing is embedded twice
            where = [(int(a), int(b)) for a, b in self._where[rows]]
            reader = self.reader
            self._clear()
            self.reader = reader
            self._add(live, vectors, where if all(a >= 0 for a, _ in where) else None)

    def _records_at(self, rows: Iterable[int]) -> list[MemoryRecord]:
        """The records at live rows (only a removed row holds ``None``)."""
        return cast("list[MemoryRecord]", [self.record(row) for row in rows])

    def _vectors_at(self, rows: np.ndarray) -> np.ndarray:
        """The (unit) vectors of ``rows``, in their order."""
        vectors = np.empty((len(rows), self.embedder.dim), dtype=np.float32)
        for held, part in self._by_part(rows):
            vectors[held] = part
        return vectors

    def _by_part(self, rows: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Gather the vectors of ``rows`` from each part: (which of ``rows``, their vectors).

        The loaded (mapped) part, then the part added since: only the rows asked for
        are copied, never the two parts joined whole.
        """
        base = len(self._base_vectors)
        loaded = rows < base
        yield loaded, self._base_vectors[rows[loaded]]
        yield ~loaded, self._vectors[rows[~loaded] - base]

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

    def _add(
        self,
        records: list[MemoryRecord],
        vectors: np.ndarray | None = None,
        where: list[tuple[int, int]] | None = None,
    ) -> None:
        if not records:
            return
        if vectors is None:
            vectors = self._vectors_of(records)
        start = len(self._records)
        self._reserve(start + len(records))
        base = len(self._base_vectors)
        self._vectors[start - base : start - base + len(records)] = vectors
        if where is not None:
            self._where[start : start + len(records)] = where
        for row, record in enumerate(records, start):
            counts = Counter(terms(memory_text(record.content)))
            self._records.append(record if where is None else _UNREAD)
            digest = content_digest(record.content)
            contexts = sorted(_contexts(record.content))
            self._ids.append(record.id)
            self._digests.append(digest)
            self._contexts.append(_CONTEXT_SEPARATOR.join(contexts))
            self._live_count += 1
            if self._row_of is not None:
                self._row_of[record.id] = row
            if self._by_digest is not None:
                self._by_digest.setdefault(digest, {})[record.id] = None
            if self._by_context is not None:
                for context in contexts:
                    self._by_context.setdefault(context, {})[record.id] = None
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
        self._invalidate()
        record = self.record(row)
        assert record is not None
        self._records[row] = None
        self._read.pop(row, None)
        self._live[row] = False
        self._live_count -= 1
        if self._by_digest is not None:
            digest = content_digest(record.content)
            same = self._by_digest[digest]
            del same[memory_id]
            if not same:
                del self._by_digest[digest]
        if self._by_context is not None:
            for context in _contexts(record.content):
                learned = self._by_context[context]
                del learned[memory_id]
                if not learned:
                    del self._by_context[context]
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
        base = len(self._base_vectors)
        vectors = np.zeros((capacity - base, self.embedder.dim), dtype=np.float32)
        vectors[: len(self._records) - base] = self._vectors[: len(self._records) - base]
        self._vectors = vectors
        grow = capacity - len(self._live)
        self._live = np.concatenate([self._live, np.zeros(grow, bool)])
        self._lengths = np.concatenate([self._lengths, np.zeros(grow, np.float32)])
        self._at = np.concatenate([self._at, np.zeros(grow, np.float64)])
        self._until = np.concatenate([self._until, np.full(grow, np.inf, np.float64)])
        self._where = np.concatenate([self._where, np.full((grow, 2), -1, np.int64)])

    # -- scoring -----------------------------------------------------------------------

    def scores(self, query: str, query_vector: np.ndarray) -> np.ndarray:
        """Score every row for ``query``; removed rows score -1."""
        return self.scores_many([query], query_vector[None, :])[0]

    def scores_many(
        self,
        queries: list[str],
        query_vectors: np.ndarray,
        time: TimeView | None = None,
        *,
        wanted: int | None = None,
    ) -> np.ndarray:
        """Score rows for each query at once: shape ``(len(queries), rows)``.

        With ``time``, rows not current then score -1 and scores are weighed by
        recency as it says. With ``wanted``, only the rows that may rank among a
        query's ``wanted`` best are scored; the others score -1, as if left out.
        The result's ``wanted`` best rows (and their scores) are those of a full
        scoring: a row's score is at most its lexical part plus the whole dense
        weight, so once some rows' exact scores are known, a row whose bound falls
        below the ``wanted``-th of them cannot rank, and its vector is never read.
        A query sharing words with the bank thus reads a few vectors, not all (at
        100k memories, the dense scan is most of a search); a query sharing none
        reads them all, in one matrix product with the other such queries.
        """
        n = len(self._records)
        if not self._live_count:
            return np.full((len(queries), n), -1.0, dtype=np.float32)
        weight = self.scoring.dense_weight
        left_out = self._left_out(time, n)
        recency: np.ndarray | float = 1.0
        if time is not None and time.half_life is not None:
            recency = self._recency(time.as_of, time.half_life, n)
        norms = np.linalg.norm(query_vectors, axis=1, keepdims=True)
        unit = np.divide(query_vectors, norms, out=np.zeros_like(query_vectors), where=norms > 0)
        result = np.zeros((len(queries), n), dtype=np.float32)
        if weight < 1:
            for i, query in enumerate(queries):
                result[i] = (1 - weight) * self._bm25(query, n)
        full = list(range(len(queries)))
        if weight and wanted is not None and 0 < wanted < n:
            full = []
            for i in range(len(queries)):
                rows = self._may_rank(result[i], unit[i], recency, left_out, wanted)
                if rows is None:
                    full.append(i)
                    continue
                scored = (result[i, rows] + self._dense(unit[i : i + 1], rows)[0]) * (
                    recency if isinstance(recency, float) else recency[rows]
                )
                result[i] = -1.0
                result[i, rows] = scored
        if full:
            part = result[full]
            if weight:
                part += self._dense(unit[full], None, n)
            part *= recency
            part[:, left_out] = -1.0
            result[full] = part
        return result

    def _may_rank(
        self,
        lexical: np.ndarray,
        unit: np.ndarray,
        recency: np.ndarray | float,
        left_out: np.ndarray,
        wanted: int,
    ) -> np.ndarray | None:
        """The rows whose score may rank among the ``wanted`` best; ``None``: most rows.

        ``lexical`` is each row's weighed lexical part. Scores the rows of the highest
        bounds exactly, then keeps every row whose bound reaches the ``wanted``-th of
        those scores.
        """
        bound = (lexical + self.scoring.dense_weight) * recency
        bound[left_out] = -1.0
        n = len(bound)
        first = np.argpartition(-bound, min(n, 4 * wanted) - 1)[: 4 * wanted]
        first = first[bound[first] >= 0]
        if len(first) < wanted:
            return None
        weights = recency if isinstance(recency, float) else recency[first]
        exact = (lexical[first] + self._dense(unit[None, :], first)[0]) * weights
        floor = np.partition(exact, len(exact) - wanted)[len(exact) - wanted]
        # The slack covers float32 rounding of a cosine of (almost) 1.
        rows = np.flatnonzero(bound >= floor - 1e-6) if floor > 0 else None
        return None if rows is None or len(rows) > n // 4 else rows

    def _dense(self, unit: np.ndarray, rows: np.ndarray | None, n: int = 0) -> np.ndarray:
        """The weighed dense part of unit query vectors for ``rows`` (all ``[:n]`` if ``None``)."""
        floor = self.scoring.dense_floor
        base = len(self._base_vectors)  # loaded rows (mapped), then those added since
        if rows is None:
            cosine = unit @ self._vectors[: n - base].T
            if base:
                cosine = np.concatenate([unit @ self._base_vectors.T, cosine], axis=1)
        else:
            cosine = np.empty((len(unit), len(rows)), dtype=np.float32)
            for held, part in self._by_part(rows):
                cosine[:, held] = unit @ part.T
        return (self.scoring.dense_weight / (1.0 - floor)) * np.maximum(cosine - floor, 0.0)

    def _left_out(self, time: TimeView | None, n: int) -> np.ndarray:
        """The rows ``[:n]`` a search at ``time`` must not return: removed, or not current.

        Looking at "now" (the usual search), they change only when a row is added or
        removed or a memory expires: kept until then.
        """
        live = self._live[:n]
        if time is None:
            return np.flatnonzero(~live)
        if time.past or not time.include_later:
            return np.flatnonzero(~(live & time.current(self._at[:n], self._until[:n])))
        kept = self._expiring
        if kept is not None and kept[0] == n and kept[1] <= time.as_of < kept[2]:
            return kept[3]
        until = self._until[:n]
        current = until > time.as_of
        ahead = until[current & live]
        expiry = float(ahead.min()) if len(ahead) else math.inf
        left_out = np.flatnonzero(~(live & current))
        self._expiring = (n, time.as_of, expiry, left_out)
        return left_out

    def _recency(self, as_of: float, half_life: float, n: int) -> np.ndarray:
        """`TimeView.weights` of rows ``[:n]``, from a per-row factor kept until rows change.

        ``2 ** -(age / half_life)`` is ``2 ** ((at - ref) / half_life)``, kept, times
        ``2 ** -((as_of - ref) / half_life)``, one number: a multiplication per row
        instead of a power.
        """
        kept = self._decay
        with np.errstate(over="ignore"):  # an overflow is caught below: computed afresh
            if kept is not None and kept[0] == half_life and kept[1] < n:  # rows added since
                added = np.exp2((self._at[kept[1] : n] - kept[2]) / half_life)
                grown = np.concatenate([kept[3], added])
                kept = (half_life, n, kept[2], grown) if np.isfinite(added).all() else None
            if kept is None or kept[:2] != (half_life, n):
                at = self._at[:n]
                ref = float(at.max()) if n else 0.0
                kept = (half_life, n, ref, np.exp2((at - ref) / half_life))
        self._decay = kept
        _, _, ref, decay = kept
        exponent = -(as_of - ref) / half_life
        if exponent > 512:  # looking far before the bank's last memory: weigh exactly
            return TimeView(as_of, half_life=half_life).weights(self._at[:n])  # type: ignore[return-value]
        factor = 2.0**exponent
        with np.errstate(over="ignore"):  # a row said after ``as_of``: capped at 1 below
            weighed = np.minimum(decay * factor, 1.0)
        return ((1.0 + weighed) / 2.0).astype(np.float32)

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
        live = self._live_count
        df = self._df.get(term, 0)
        idf = math.log(1 + (live - df + 0.5) / (df + 0.5))
        if not df:
            return idf, None, None
        rows, tf = self._posting_arrays(term)
        average = self._total_length / live or 1.0
        norm = k1 * (1 - b + b * self._lengths[rows] / average)
        return idf, rows, idf * tf * (k1 + 1) / (tf + norm)

    def _posting_arrays(self, term: str) -> tuple[np.ndarray, np.ndarray]:
        """A term's postings (rows, term frequencies): those loaded, then those added."""
        cached = self._arrays.get(term)
        if cached is None:
            saved = self._saved_terms.get(term)
            if saved is None:
                cached = np.zeros(0, np.int64), np.zeros(0, np.float32), 0
            else:
                start, end = self._saved_starts[saved], self._saved_starts[saved + 1]
                cached = self._saved_rows[start:end], self._saved_tfs[start:end], int(end - start)
            self._arrays[term] = cached
        rows, tfs = self._postings.get(term, ([], []))
        held_rows, held_tfs, loaded = cached
        done = len(held_rows) - loaded
        if done < len(rows):
            held_rows = np.concatenate([held_rows, np.asarray(rows[done:], dtype=np.int64)])
            held_tfs = np.concatenate([held_tfs, np.asarray(tfs[done:], dtype=np.float32)])
            self._arrays[term] = (held_rows, held_tfs, loaded)
        return held_rows, held_tfs

    def _has(self, term: str) -> bool:
        return term in self._saved_terms or term in self._postings

    def containing(self, words: tuple[str, ...]) -> list[int]:
        """The live rows holding every term of any of ``words``, most recent first.

        Ordered by when each was said (`MemoryRecord.at`, then id), so that any
        process holding the same bank answers alike; kept until the bank changes.
        """
        found = self._holding.get(words)
        if found is None:
            rows: set[int] = set()
            for word in words:
                wanted = set(terms(word))
                if not wanted or not all(self._has(term) for term in wanted):
                    continue
                held = set.intersection(
                    *(set(self._posting_arrays(term)[0].tolist()) for term in wanted)
                )
                rows |= {row for row in held if self._live[row]}
            ids = self._ids.values()
            found = sorted(rows, key=lambda row: (self._at[row], ids[row]), reverse=True)
            self._holding[words] = found
        return found

    def current(self, rows: list[int], as_of: float | None) -> list[int]:
        """Those of ``rows`` whose memory holds at ``as_of`` (POSIX seconds), or now."""
        if as_of is None:
            now = datetime.now(UTC).timestamp()
            return [row for row in rows if now < self._until[row]]
        return [row for row in rows if self._at[row] <= as_of < self._until[row]]

    @property
    def digests(self) -> dict[str, dict[str, None]]:
        """The live records' ids by content digest, in row order."""
        if self._by_digest is None:
            self._by_digest = {}
            ids, digests, live = self._ids.values(), self._digests.values(), self._live
            for row, digest in enumerate(digests):
                if live[row]:
                    self._by_digest.setdefault(digest, {})[ids[row]] = None
        return self._by_digest

    @property
    def contexts(self) -> dict[str, dict[str, None]]:
        """The live records' ids by the (normalised) context they were learned at."""
        if self._by_context is None:
            self._by_context = {}
            ids, joined, live = self._ids.values(), self._contexts.values(), self._live
            for row, contexts in enumerate(joined):
                if live[row] and contexts:
                    for context in contexts.split(_CONTEXT_SEPARATOR):
                        self._by_context.setdefault(context, {})[ids[row]] = None
        return self._by_context

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

    # -- saving and loading ------------------------------------------------------------

    def state(self, since: int = 0) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """What `load` needs to rebuild this index: arrays, and small values.

        Only for an index whose every row lies in a bank file (see `reader`).

        Args:
            since: The first row whose vector is given (``vectors``): those before it
                are saved already, and copying them would cost the whole bank.
        """
        n = len(self._records)
        if n and int(self._where[:n].min()) < 0:
            raise ValueError("only an index read from a bank file can be saved")
        vocabulary = sorted({*self._saved_terms, *self._postings})
        postings = [self._posting_arrays(term) for term in vocabulary]
        lengths = np.array([len(rows) for rows, _ in postings], dtype=np.int64)
        starts = np.concatenate([np.zeros(1, np.int64), np.cumsum(lengths)])
        rows = np.concatenate([r for r, _ in postings]) if postings else np.zeros(0, np.int64)
        tfs = np.concatenate([t for _, t in postings]) if postings else np.zeros(0, np.float32)
        arrays = {
            "vectors": self._vectors_at(np.arange(since, n)),
            "live": self._live[:n],
            "lengths": self._lengths[:n],
            "at": self._at[:n],
            "until": self._until[:n],
            "where": self._where[:n],
            "starts": starts,
            "rows": rows.astype(np.int32 if n < 2**31 else np.int64),
            "tfs": tfs.astype(np.float32),
            "df": np.array([self._df.get(term, 0) for term in vocabulary], dtype=np.int64),
            "ids": self._ids.array(),
            "digests": self._digests.array(),
        }
        values = {
            "layout": self.layout,
            "terms": "\n".join(vocabulary),
            "contexts": self._contexts.text(),
            "total_length": self._total_length,
        }
        return arrays, values

    def load(self, arrays: dict[str, np.ndarray], values: dict[str, Any]) -> None:
        """Become the index `state` described (arrays may be memory-mapped, read-only)."""
        self._clear()
        n = len(arrays["live"])
        self.layout = values["layout"]
        self._records = [_UNREAD] * n
        live = arrays["live"]
        self._live_count = int(np.count_nonzero(live))
        for row in np.flatnonzero(~live).tolist():
            self._records[row] = None
        self._ids = _Column(arrays["ids"] if n else None)
        self._digests = _Column(arrays["digests"] if n else None)
        self._contexts = _Column(values["contexts"] if n else None)
        self._row_of = self._by_digest = self._by_context = None
        # Vectors stay where they are (mapped) until a row is added; the rest is small.
        self._base_vectors = arrays["vectors"]
        self._vectors = np.zeros((0, self.embedder.dim), dtype=np.float32)
        self._live = live.copy()
        self._lengths = np.array(arrays["lengths"])
        self._at = np.array(arrays["at"])
        self._until = np.array(arrays["until"])
        self._where = np.array(arrays["where"])
        vocabulary = values["terms"].split("\n") if values["terms"] else []
        self._saved_terms = {term: i for i, term in enumerate(vocabulary)}
        self._saved_starts = arrays["starts"]
        self._saved_rows = arrays["rows"]
        self._saved_tfs = arrays["tfs"]
        self._df = Counter(
            {t: int(df) for t, df in zip(vocabulary, arrays["df"].tolist(), strict=True) if df}
        )
        self._total_length = float(values["total_length"])
