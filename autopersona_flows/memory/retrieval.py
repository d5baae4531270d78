"""Retrieval per layer: the memories most relevant to a set of searches.

`MemoryRetriever` scores each memory by a blend of embedding cosine and BM25 (see
`Scoring` for what a score means), over an in-memory index per (user, layer)
that follows the store's change feed: a write is visible to the very next
retrieval, and a retrieval embeds only its queries, never the bank. A store that
searches itself (`SearchableStore`, e.g. ``PostgresMemoryStore(dsn,
search="database")``) answers instead, and the retriever then holds no index.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Hashable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Annotated, Any, Protocol

import numpy as np
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from autopersona_flows.errors import RetrievalError
from autopersona_flows.memory.embedders import Embedder, check_vectors, default_embedder
from autopersona_flows.memory.index import BankIndex, Scoring, TimeView
from autopersona_flows.memory.persisted import BankLog
from autopersona_flows.memory.protocol import BankSearch, ChangeSet, Found, MemoryStore
from autopersona_flows.memory.records import LAYERS, LayerContent, MemoryLayer, MemoryRecord
from autopersona_flows.memory.users import check_user_id

__all__ = [
    "RECENCY_HALF_LIFE",
    "MemoryBundle",
    "MemoryRetriever",
    "ScoredMemory",
    "Scoring",
    "SearchRequest",
]


def _text(value: str) -> str:
    value.encode("utf-8")  # a lone surrogate fails here, with the position
    return value


class SearchRequest(BaseModel):
    """One search: a query text against one layer.

    Attributes:
        layer: The layer to search.
        query: What to look for.
        label: What the search is for (e.g. ``"requirement:citation style"``), so
            whoever reads the results can tell which search found what.
        top_k: At most this many results for this search; the call's ``top_k`` if
            ``None`` (recall for a judge wants more than a prompt does).
    """

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    layer: MemoryLayer
    query: Annotated[str, AfterValidator(_text)]
    label: str | None = None
    top_k: Annotated[int, Field(ge=1)] | None = None


class ScoredMemory(BaseModel):
    """A retrieved memory, its score in [0, 1], and the search that found it.

    Attributes:
        record: The memory.
        score: Higher is more relevant; see `Scoring` for the formula.
        search: The search that found it.
    """

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    record: MemoryRecord
    score: Annotated[float, Field(ge=0.0, le=1.0)]
    search: SearchRequest


class MemoryBundle(BaseModel):
    """The result of one retrieval: per layer, the memories found, best first.

    Attributes:
        trajectory: Past requests.
        workspace: Workspace state.
        persona: Preferences and constraints.
    """

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    trajectory: list[ScoredMemory] = Field(default_factory=list)
    workspace: list[ScoredMemory] = Field(default_factory=list)
    persona: list[ScoredMemory] = Field(default_factory=list)

    def layer(self, layer: MemoryLayer) -> list[ScoredMemory]:
        """Return the memories found in ``layer``, best first."""
        if layer not in LAYERS:
            raise RetrievalError(f"unknown memory layer {layer!r}; expected one of {LAYERS}")
        return getattr(self, layer)

    def distinct(self) -> MemoryBundle:
        """This bundle with each memory once, as its best-scoring find, best first.

        Searches distinct per label (see `MemoryRetriever.retrieve`) may each find
        the same memory; a decision shows it once.
        """
        layers: dict[str, list[ScoredMemory]] = {}
        for layer in LAYERS:
            best: dict[str, ScoredMemory] = {}
            for memory in getattr(self, layer):
                kept = best.get(memory.record.id)
                if kept is None or memory.score > kept.score:
                    best[memory.record.id] = memory
            layers[layer] = sorted(best.values(), key=lambda memory: -memory.score)
        return MemoryBundle.model_construct(None, **layers)

    def __iter__(self) -> Iterator[ScoredMemory]:  # type: ignore[override]  # memories, not (field, value) pairs
        """Iterate over every memory found, layer by layer (`LAYERS` order)."""
        for layer in LAYERS:
            yield from getattr(self, layer)

    def __len__(self) -> int:
        return sum(len(getattr(self, layer)) for layer in LAYERS)


def check_top_k(top_k: Any) -> int:
    """Return ``top_k`` if it is a positive int (not a bool); else raise `RetrievalError`."""
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise RetrievalError(f"top_k must be a positive int, got {top_k!r}")
    return top_k


def check_min_similarity(min_similarity: Any) -> float:
    """Return ``min_similarity`` if it is a finite number in [0, 1]; else raise."""
    if (
        isinstance(min_similarity, bool)
        or not isinstance(min_similarity, int | float)
        or not math.isfinite(min_similarity)
        or not 0.0 <= min_similarity <= 1.0
    ):
        raise RetrievalError(f"min_similarity must be a number in [0, 1], got {min_similarity!r}")
    return float(min_similarity)


def time_view(
    as_of: datetime | None = None,
    *,
    include_past: bool = False,
    recency_half_life: timedelta | None = None,
) -> TimeView:
    """The `TimeView` of retrieval's time arguments (see `MemoryRetriever.retrieve`).

    Raises:
        RetrievalError: If ``as_of`` is not a timezone-aware datetime or the half
            life is not a positive timedelta.
    """
    _check_as_of(as_of)
    if recency_half_life is not None and (
        not isinstance(recency_half_life, timedelta) or recency_half_life <= timedelta(0)
    ):
        raise RetrievalError(
            f"recency_half_life must be a positive timedelta, got {recency_half_life!r}"
        )
    return TimeView(
        as_of=(as_of or datetime.now(UTC)).timestamp(),
        include_later=as_of is None,
        past=include_past,
        half_life=recency_half_life.total_seconds() if recency_half_life else None,
    )


RECENCY_HALF_LIFE = timedelta(days=90)
"""The default weight of recency in retrieval: a memory said 90 days before another
that matches as well scores 3/4 of it (see `MemoryRetriever.retrieve`)."""


class _Unset:
    """A retrieval argument left to the retriever's setting."""

    def __repr__(self) -> str:
        return "<the retriever's>"


_UNSET = _Unset()


def _half_life(asked: timedelta | _Unset | None, default: timedelta | None) -> timedelta | None:
    """The half life a retrieval weighs recency with: asked, or the retriever's."""
    return default if isinstance(asked, _Unset) else asked


def _check_as_of(as_of: Any) -> None:
    if as_of is not None and (
        not isinstance(as_of, datetime) or as_of.tzinfo is None or as_of.utcoffset() is None
    ):
        raise RetrievalError(f"as_of must be a timezone-aware datetime, got {as_of!r}")


def _current(records: Sequence[MemoryRecord], as_of: datetime | None = None) -> list[MemoryRecord]:
    _check_as_of(as_of)
    if as_of is not None:
        return [record for record in records if record.holds_at(as_of)]
    now = datetime.now(UTC)
    return [record for record in records if record.valid_until is None or now < record.valid_until]


_QUERY_CACHE = 4096


class MemoryRetriever:
    """Finds the memories of one user most relevant to a set of searches.

    Args:
        store: Where the memories live.
        embedder: Embeds the queries; must be the embedder the store was written
            with (`EmbeddingMismatchError` otherwise). Defaults to the shipped `SentenceEncoder`.
        scoring: How dense and lexical evidence combine; see `Scoring`. By default
            the dense weight is the embedder's ``dense_weight`` attribute if it has
            one (tuned on LoCoMo: 0.3 for hashing, 0.5 for MiniLM), else 0.3, and
            the dense floor its ``dense_floor``, else 0.
        max_cached_banks: How many (user, layer) indexes to keep in memory; the
            least recently used is dropped beyond that and rebuilt when needed.
        max_cached_bytes: How much memory the indexes may hold together (see
            `BankIndex.nbytes`): beyond it, the least recently used are dropped when
            another bank is opened (never the one opened). A JSONL bank's index is
            loaded again from its saved files in milliseconds.
        recency_half_life: How much recency weighs in every retrieval that does not
            say (see `retrieve`): of two memories that match alike, the one said
            later ranks first. ``None``: what was said counts, not when.
    """

    def __init__(
        self,
        store: MemoryStore,
        embedder: Embedder | None = None,
        *,
        scoring: Scoring | None = None,
        max_cached_banks: int = 1024,
        max_cached_bytes: int = 1 << 30,
        recency_half_life: timedelta | None = RECENCY_HALF_LIFE,
    ) -> None:
        time_view(recency_half_life=recency_half_life)  # checked here, not at the first search
        self.recency_half_life = recency_half_life
        self.store = store
        self.embedder = embedder if embedder is not None else default_embedder()
        self.scoring = scoring or Scoring(
            dense_weight=getattr(self.embedder, "dense_weight", 0.3),
            dense_floor=getattr(self.embedder, "dense_floor", 0.0),
        )
        self.max_cached_banks = max_cached_banks
        self.max_cached_bytes = max_cached_bytes
        self._indexes: OrderedDict[tuple[str, str], tuple[threading.Lock, BankIndex]] = (
            OrderedDict()
        )
        self._lock = threading.Lock()
        self._queries: OrderedDict[str, np.ndarray] = OrderedDict()
        self._reads = threading.local()  # `.block`: this thread's `reading` block, if any

    def __repr__(self) -> str:
        return f"MemoryRetriever({self.store!r}, {self.embedder!r})"

    def retrieve(
        self,
        user_id: str,
        searches: Sequence[SearchRequest],
        top_k: int = 3,
        min_similarity: float = 0.0,
        *,
        distinct_per_label: bool = False,
        as_of: datetime | None = None,
        include_past: bool = False,
        recency_half_life: timedelta | _Unset | None = _UNSET,
    ) -> MemoryBundle:
        """Run ``searches`` over the user's bank and return what they found.

        Each search contributes up to ``top_k`` memories of its layer scoring at
        least ``min_similarity`` (and above zero: a memory sharing nothing with the
        query is never returned). A memory already found by an earlier search of
        the same call is skipped and the next one taken instead, so duplicates
        never crowd out results.

        Args:
            user_id: Whose bank to search.
            searches: The searches, most important first.
            top_k: Memories per search.
            min_similarity: Weakest score returned.
            distinct_per_label: Skip only memories an earlier search *of the same
                label* found, so that searches made for different purposes (one
                requirement and another) each get their own results; a memory may
                then appear once per label.
            as_of: Look at the bank as of this time: only memories stated by then
                (`MemoryRecord.at`) and not yet expired (``valid_until``). By
                default, every memory not expired now. Versions since replaced or
                deleted count for the time they held (read from `MemoryStore.history`).
            include_past: Return expired memories too (and, with ``as_of``, those
                stated later).
            recency_half_life: Weigh recency: a memory this much older than
                ``as_of`` (or now) scores 3/4 of what it would, one much older
                towards 1/2. ``None``: what was said counts, not when. By default,
                the retriever's (`RECENCY_HALF_LIFE` unless it was built with another).

        Raises:
            RetrievalError: If ``top_k``, ``min_similarity`` or the time arguments
                are invalid or a search is not a `SearchRequest`.
            EmbeddingMismatchError: If the bank was embedded by another embedder.
        """
        check_user_id(user_id)
        top_k = check_top_k(top_k)
        min_similarity = check_min_similarity(min_similarity)
        half_life = _half_life(recency_half_life, self.recency_half_life)
        time = time_view(as_of, include_past=include_past, recency_half_life=half_life)
        searches = list(searches)
        for i, search in enumerate(searches):
            if not isinstance(search, SearchRequest):
                raise RetrievalError(f"searches[{i}] must be a SearchRequest, got {search!r}")
        if not searches:
            return MemoryBundle()
        # Planners search the same text in several layers: embed each text once.
        texts = list(dict.fromkeys(search.query for search in searches))
        embedded = self._query_vectors(texts)
        row = {text: i for i, text in enumerate(texts)}
        found: dict[str, list[ScoredMemory]] = {layer: [] for layer in LAYERS}
        block: _Block | None = getattr(self._reads, "block", None)
        found_before = block.found if block is not None else None
        for layer in dict.fromkeys(search.layer for search in searches):
            mine = [search for search in searches if search.layer == layer]
            queries = list(dict.fromkeys(search.query for search in mine))
            taken: dict[str | None, set[str]] = {}
            # Enough for every search of the layer, those a label's earlier ones took too.
            wanted = sum(search.top_k or top_k for search in mine)
            vectors = embedded[[row[q] for q in queries]]
            with self._ranked(
                user_id,
                layer,
                queries,
                vectors=vectors,
                time=time,
                wanted=wanted,
                as_of=None if include_past else as_of,
            ) as (cursor, ranked):
                for search in mine:
                    held = taken.setdefault(search.label if distinct_per_label else None, set())
                    # A search that nothing before it in the call constrains finds,
                    # within a block, what it found before: the nodes of a run search
                    # its request alike.
                    key = (
                        (
                            user_id,
                            cursor,
                            search,
                            top_k,
                            min_similarity,
                            as_of,
                            include_past,
                            half_life,
                        )
                        if found_before is not None and not held
                        else None
                    )
                    top = None if found_before is None or key is None else found_before.get(key)
                    if top is None:
                        top = ranked(
                            search,
                            queries.index(search.query),
                            top_k=search.top_k or top_k,
                            min_similarity=min_similarity,
                            taken=held,
                        )
                        if found_before is not None and key is not None:
                            found_before[key] = top
                    else:
                        held.update(scored.record.id for scored in top)
                    found[layer] += top
            found[layer].sort(key=lambda scored: -scored.score)
        return MemoryBundle.model_construct(None, **found)

    @contextmanager
    def _ranked(
        self,
        user_id: str,
        layer: MemoryLayer,
        queries: list[str],
        *,
        vectors: np.ndarray,
        time: TimeView,
        wanted: int,
        as_of: datetime | None,
    ) -> Iterator[tuple[str | None, _Ranked]]:
        """The bank's state and a picker of each query's results, from the store or an index.

        A store that searches itself (`SearchableStore`) answers searches of the bank
        as it is; an index answers the rest (and every search of other stores).
        """
        search_bank = getattr(self.store, "search_bank", None)
        found = None
        if search_bank is not None and as_of is None:
            search = BankSearch(queries, vectors, self.embedder, self.scoring, time, wanted)
            found = search_bank(user_id, layer, search)
        if found is not None:
            yield "store", partial(self._top_found, found)
            return
        with self._index(user_id, layer, as_of) as index:
            scores = index.scores_many(queries, vectors, time, wanted=wanted)

            def ranked(search: SearchRequest, query: int, **picking: Any) -> list[ScoredMemory]:
                return self._top(index, search, scores=scores[query], **picking)

            yield index.cursor, ranked

    @staticmethod
    def _top_found(
        found: list[list[Found]],
        search: SearchRequest,
        query: int,
        *,
        top_k: int,
        min_similarity: float,
        taken: set[str],
    ) -> list[ScoredMemory]:
        """`_top` over what a store's search found (best first, each scoring above 0)."""
        results: list[ScoredMemory] = []
        for score, record in found[query]:
            if score <= 0.0 or score < min_similarity or len(results) == top_k:
                break
            if record.id in taken:
                continue
            taken.add(record.id)
            results.append(
                ScoredMemory.model_construct(record=record, score=min(score, 1.0), search=search)
            )
        return results

    def load(self, user_id: str, layers: Sequence[MemoryLayer] = LAYERS) -> None:
        """Bring the user's indexes up to date now (the first retrieval would otherwise).

        A worker can call it at start for the people it serves, so that no decision
        pays for reading a bank from the store.
        """
        check_user_id(user_id)
        prepare_bank = getattr(self.store, "prepare_bank", None)
        for layer in layers:
            if prepare_bank is not None and prepare_bank(user_id, layer):
                continue  # the store searches this bank itself: the worker holds nothing
            with self._index(user_id, layer):
                pass

    @contextmanager
    def reading(self) -> Iterator[None]:
        """Within the block, read each bank as it was when the block first read it.

        Every search, lookup and exact find in the block is then answered from one
        state of each bank, checked against the store once (a ``stat`` of a JSONL
        file, a round trip to PostgreSQL) instead of once per call, and a search made
        again (the first of its label in its layer, with the same arguments) finds
        what it found before without ranking the bank again. A decision reads this
        way, and so do the decisions of a graph's nodes, which search its request
        alike: they see one bank, and are not slowed by system calls, each of which
        gives up the GIL. Blocks nest; a write by this thread inside one is not seen
        until the block ends. A store that searches itself (`SearchableStore`) is
        asked at each search that is not made again: those see the bank as it is.
        """
        outer = getattr(self._reads, "block", None)
        if outer is None:
            self._reads.block = _Block()
        try:
            yield
        finally:
            if outer is None:
                self._reads.block = None

    def _query_vectors(self, texts: list[str]) -> np.ndarray:
        """Embed query texts, each once per process: a node's searches repeat every run."""
        with self._lock:
            known = {text: self._queries[text] for text in texts if text in self._queries}
            for text in known:
                self._queries.move_to_end(text)
        missing = [text for text in dict.fromkeys(texts) if text not in known]
        if missing:
            # A copy: the cache must not share memory with what the embedder may reuse.
            vectors = np.array(check_vectors(self.embedder, missing, self.embedder.embed(missing)))
            known.update(zip(missing, vectors, strict=True))
            with self._lock:
                self._queries.update(zip(missing, vectors, strict=True))
                while len(self._queries) > _QUERY_CACHE:
                    self._queries.popitem(last=False)
        return np.stack([known[text] for text in texts])

    def containing(
        self,
        user_id: str,
        layer: MemoryLayer,
        words: Sequence[str],
        *,
        as_of: datetime | None = None,
    ) -> list[MemoryRecord]:
        """The user's memories of ``layer`` holding any of ``words``, most recent first.

        A memory holds a word when it holds each of its terms (as the index analyses
        text). An exact lookup: whatever else the bank holds and however it scores.
        Only current memories (see ``as_of`` of `retrieve`).
        """
        check_user_id(user_id)
        _check_as_of(as_of)
        wanted = tuple(sorted({word for word in words if word.strip()}))
        if not wanted:
            return []
        holding_in_bank = getattr(self.store, "holding_in_bank", None)
        if as_of is None and holding_in_bank is not None:
            held = holding_in_bank(user_id, layer, wanted)
            if held is not None:
                return _current(held)
        with self._index(user_id, layer, as_of) as index:
            at = None if as_of is None else as_of.timestamp()
            rows = index.current(index.containing(wanted), at)
            return [record for row in rows if (record := index.record(row)) is not None]

    def learned_at(
        self, user_id: str, contexts: Sequence[str], *, as_of: datetime | None = None
    ) -> list[MemoryRecord]:
        """The user's persona memories learned at any of ``contexts``.

        Contexts are node ids, instructions and requests (`PersonaMemory.contexts`),
        compared without case or extra spacing. Only current memories (see
        ``as_of`` of `retrieve`).
        """
        _check_as_of(as_of)
        wanted = [context for context in contexts if context.strip()]
        if not wanted:
            return []
        learned_in_bank = getattr(self.store, "learned_in_bank", None)
        if as_of is None and learned_in_bank is not None:
            learned = learned_in_bank(user_id, wanted)
            if learned is not None:
                return _current(learned)
        with self._index(user_id, "persona", as_of) as index:
            return _current(index.learned_at(wanted), as_of)

    def find_exact(
        self, user_id: str, layer: MemoryLayer, content: LayerContent
    ) -> MemoryRecord | None:
        """Return the user's oldest current memory in ``layer`` equal to ``content``, if any."""
        return next(iter(_current(self.find_all(user_id, layer, content))), None)

    def find_all(
        self, user_id: str, layer: MemoryLayer, content: LayerContent
    ) -> list[MemoryRecord]:
        """The user's memories in ``layer`` equal to ``content``, expired ones too, oldest first."""
        check_user_id(user_id)
        find_in_bank = getattr(self.store, "find_in_bank", None)
        found = None if find_in_bank is None else find_in_bank(user_id, layer, content)
        if found is not None:
            return found
        with self._index(user_id, layer) as index:
            return index.find(content)

    @staticmethod
    def _top(
        index: BankIndex,
        search: SearchRequest,
        *,
        scores: np.ndarray,
        top_k: int,
        min_similarity: float,
        taken: set[str],
    ) -> list[ScoredMemory]:
        wanted = min(len(scores), top_k + len(taken))
        if not wanted:
            return []
        best = np.argpartition(-scores, wanted - 1)[:wanted]
        results: list[ScoredMemory] = []
        for row in best[np.argsort(-scores[best], kind="stable")]:
            score = float(scores[row])
            if score <= 0.0 or score < min_similarity or len(results) == top_k:
                break
            record = index.record(int(row))
            if record is None or record.id in taken:
                continue
            taken.add(record.id)
            # Built from validated parts (a stored record, a score clipped to [0, 1], a
            # validated search): validating them again would cost more than the search.
            results.append(
                ScoredMemory.model_construct(record=record, score=min(score, 1.0), search=search)
            )
        return results

    def _index(
        self, user_id: str, layer: MemoryLayer, as_of: datetime | None = None
    ) -> AbstractContextManager[BankIndex]:
        if as_of is not None:
            return nullcontext(self._as_of(user_id, layer, as_of))
        key = (user_id, layer)
        with self._lock:
            entry = self._indexes.get(key)
            if entry is None:
                entry = self._indexes[key] = (
                    threading.Lock(),
                    BankIndex(self.embedder, self.scoring),
                )
                self._evict()
            else:
                self._indexes.move_to_end(key)
        block: _Block | None = getattr(self._reads, "block", None)
        checked = None if block is None else block.checked
        bank_log = getattr(self.store, "bank_log", None)
        log = None if bank_log is None else bank_log(user_id, layer)
        return _HeldIndex(self.store, user_id, layer, *entry, checked=checked, log=log)

    def _evict(self) -> None:
        """Drop the least recently used indexes beyond the bounds (call with the lock)."""
        while len(self._indexes) > self.max_cached_banks:
            self._indexes.popitem(last=False)
        held = sum(index.nbytes() for _, index in self._indexes.values())
        while held > self.max_cached_bytes and len(self._indexes) > 1:
            _, (_, index) = self._indexes.popitem(last=False)
            held -= index.nbytes()

    def cached_bytes(self) -> int:
        """Roughly what this retriever's indexes hold in memory (see `BankIndex.nbytes`)."""
        with self._lock:
            return sum(index.nbytes() for _, index in self._indexes.values())

    def _as_of(self, user_id: str, layer: MemoryLayer, as_of: datetime) -> BankIndex:
        """An index of the bank as it stood at ``as_of``, its history included.

        A version an update replaced held from when it was said until the next
        version was said; a deleted one until it was deleted. Built for the call:
        looking back is rare, and the live index stays as it is.
        """
        records = {r.id: r for r in self.store.list(user_id, layer) if r.holds_at(as_of)}
        for change in self.store.history(user_id, layer):
            version = change.before
            ended = change.after.at if change.after is not None else change.at
            if version.id not in records and version.holds_at(as_of) and as_of < ended:
                records[version.id] = version
        index = BankIndex(self.embedder, self.scoring)
        index.apply(ChangeSet(cursor="as-of", full=True, records=list(records.values())))
        return index


class _Ranked(Protocol):
    """Picks a search's results from a layer's ranking (see `MemoryRetriever._ranked`)."""

    def __call__(
        self,
        search: SearchRequest,
        query: int,
        *,
        top_k: int,
        min_similarity: float,
        taken: set[str],
    ) -> list[ScoredMemory]: ...


@dataclass
class _Block:
    """What a thread's `MemoryRetriever.reading` block has read so far."""

    checked: set[tuple[str, str]] = field(default_factory=set)  # banks brought up to date
    found: dict[Hashable, list[ScoredMemory]] = field(default_factory=dict)  # by search


class _HeldIndex:
    """Locks an index and brings it up to date with the store for the block.

    The store is read *before* the index lock is taken: a caller may already hold
    the bank's lock (`MemoryStore.locked`, as the updater does) and then want the
    index, so holding the index lock while waiting for the bank would deadlock.
    """

    def __init__(
        self,
        store: MemoryStore,
        user_id: str,
        layer: MemoryLayer,
        lock: threading.Lock,
        index: BankIndex,
        *,
        checked: set[tuple[str, str]] | None = None,
        log: BankLog | None = None,
    ) -> None:
        self._store, self._user_id, self._layer = store, user_id, layer
        self._log = log  # a JSONL bank, read by byte offsets
        self._lock, self._index = lock, index
        self._checked = checked  # the banks this thread's `reading` block brought up to date

    def __enter__(self) -> BankIndex:
        key = (self._user_id, self._layer)
        if self._checked is not None and key in self._checked:
            self._lock.acquire()
            return self._index
        while True:
            cursor = self._index.cursor
            if self._log is not None:
                read = self._log.read(cursor, self._index.embedder)
            else:
                changes = self._store.changes(self._user_id, self._layer, cursor)
            self._lock.acquire()
            if self._index.cursor == cursor:
                break
            self._lock.release()  # another thread applied changes meanwhile: read again
        try:
            if self._log is not None:
                self._log.apply(self._index, read)
            else:
                self._index.apply(changes)
        except BaseException:
            self._lock.release()
            raise
        if self._checked is not None:  # only once it is up to date: a failed read is retried
            self._checked.add(key)
        return self._index

    def __exit__(self, *exc: object) -> None:
        self._lock.release()
