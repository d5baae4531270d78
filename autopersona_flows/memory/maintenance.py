"""Scheduled upkeep of a user's memory bank: expire, consolidate, compact.

`maintain_user` runs the steps for one user and returns a `MaintenanceReport`
of ids and counts, never contents, so it can be logged or published as it is. Each
step holds one bank's lock at a time, so the user's other banks stay writable, and
every removal goes through `MemoryStore.delete`: what is removed stays in the change
history. A flow schedules these functions; this module does not import Prefect.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from autopersona_flows.memory.consolidation import check_min_repeats, promote_choices
from autopersona_flows.memory.embedders import Embedder
from autopersona_flows.memory.index import content_digest
from autopersona_flows.memory.protocol import MemoryStore
from autopersona_flows.memory.provenance import Provenance
from autopersona_flows.memory.records import LAYERS, MemoryLayer, MemoryRecord, content_type
from autopersona_flows.memory.retrieval import MemoryRetriever, SearchRequest
from autopersona_flows.memory.text import memory_text
from autopersona_flows.memory.updates import MemoryUpdater
from autopersona_flows.memory.users import check_user_id

__all__ = [
    "Compactable",
    "MaintenanceReport",
    "MemoryMerge",
    "consolidate_duplicates",
    "expire_workspace",
    "maintain_user",
    "retire_expired",
]


@runtime_checkable
class Compactable(Protocol):
    """A store that drops dead log entries on demand, as `JsonlMemoryStore` does.

    Compaction is optional for a `MemoryStore`; `maintain_user` skips it for a
    store that is not `Compactable` (checked with ``isinstance``).
    """

    def compact(self, user_id: str, layer: MemoryLayer | None = None) -> int:
        """Rewrite the user's banks (or one layer's) to their live records.

        Contract: records and the snapshot fingerprint stay as they were; a bank
        with nothing dead is not rewritten. Returns how many entries were dropped.
        """
        ...


class MemoryMerge(BaseModel):
    """Two near-duplicate memories merged into one: the newer kept, the older removed.

    Attributes:
        layer: The layer both belong to.
        kept: The id of the memory that stays, unchanged.
        removed: The id of the memory deleted (it stays in the change history).
    """

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    layer: MemoryLayer
    kept: str
    removed: str


class MaintenanceReport(BaseModel):
    """What `maintain_user` did to one user's bank: ids and counts, never contents.

    Attributes:
        user_id: Whose bank was maintained.
        expired: Ids of the workspace memories removed for their age.
        retired: Ids of the memories of any layer removed because their
            ``valid_until`` had passed (see `retire_expired`).
        merged: The near-duplicate merges, in the order they were made.
        promoted: Ids of the persona memories written for choices repeated across
            past tasks (see `promote_choices`), added or updated.
        compacted: Dead log entries dropped (0 if the store is not `Compactable`).
        memories: Live memories per layer afterwards.
        fingerprint: The user's snapshot fingerprint afterwards.
    """

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    user_id: str
    expired: list[str] = Field(default_factory=list)
    retired: list[str] = Field(default_factory=list)
    merged: list[MemoryMerge] = Field(default_factory=list)
    promoted: list[str] = Field(default_factory=list)
    compacted: Annotated[int, Field(ge=0)] = 0
    memories: dict[MemoryLayer, int]
    fingerprint: str


def _check_threshold(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 < value <= 1.0:
        raise ValueError(f"duplicate_threshold must be a number in (0, 1], got {value!r}")
    return float(value)


def _check_age(value: Any) -> timedelta:
    if not isinstance(value, timedelta) or value <= timedelta(0):
        raise ValueError(
            f"the workspace max age must be a positive datetime.timedelta "
            f"(e.g. timedelta(days=30)), got {value!r}"
        )
    return value


def _check_now(value: Any) -> datetime:
    if value is None:
        return datetime.now(UTC)
    if not isinstance(value, datetime) or value.utcoffset() is None:
        raise ValueError(f"now must be a timezone-aware datetime, got {value!r}")
    return value


def expire_workspace(
    store: MemoryStore, user_id: str, max_age: timedelta, *, now: datetime | None = None
) -> list[str]:
    """Delete the user's workspace memories older than ``max_age`` or past their end.

    A memory expires when it was stated (`MemoryRecord.at`: when it was observed,
    not when it was written, so a backfilled history expires too) before
    ``now - max_age``, or when its ``valid_until`` has passed. Only workspace
    state goes stale with age; memories of any layer whose ``valid_until`` has
    passed are retired by `retire_expired`.

    Args:
        store: The memory store.
        user_id: Whose workspace memories to expire.
        max_age: How long a workspace memory lives after it was observed.
        now: The reference time; the current time by default.

    Returns:
        The ids of the expired memories, oldest first.

    Raises:
        InvalidUserIdError: If ``user_id`` is not a valid user id.
        ValueError: If ``max_age`` is not a positive timedelta or ``now`` is not
            a timezone-aware datetime.
    """
    check_user_id(user_id)
    now = _check_now(now)
    cutoff = now - _check_age(max_age)

    def stale() -> list[str]:
        return [
            r.id
            for r in store.list(user_id, "workspace")
            if r.at < cutoff or (r.valid_until is not None and r.valid_until <= now)
        ]

    if not stale():  # read first: no write lock (nor a new bank folder) for nothing
        return []
    with store.locked(user_id, "workspace"):
        expired = stale()
        for memory_id in expired:
            store.delete(user_id, "workspace", memory_id, **_upkeep("expired"))
    return expired


def retire_expired(store: MemoryStore, user_id: str, *, now: datetime | None = None) -> list[str]:
    """Delete the user's memories, of every layer, whose ``valid_until`` has passed.

    Retrieval already leaves such memories out of current results; retiring them
    moves them to the change history (reason ``"expired"``), where a look back
    with ``as_of`` still finds them for the time they held, and keeps them from
    weighing on the lexical statistics of what is current.

    Args:
        store: The memory store.
        user_id: Whose memories to retire.
        now: The reference time; the current time by default.

    Returns:
        The ids of the retired memories, layer by layer, oldest first.

    Raises:
        InvalidUserIdError: If ``user_id`` is not a valid user id.
        ValueError: If ``now`` is not a timezone-aware datetime.
    """
    check_user_id(user_id)
    now = _check_now(now)

    def ended(layer: MemoryLayer) -> list[str]:
        records = sorted(store.list(user_id, layer), key=_age)
        return [r.id for r in records if r.valid_until is not None and r.valid_until <= now]

    retired = []
    for layer in LAYERS:
        if not ended(layer):  # read first: no write lock (nor a new bank folder) for nothing
            continue
        with store.locked(user_id, layer):
            for memory_id in ended(layer):
                store.delete(user_id, layer, memory_id, **_upkeep("expired"))
                retired.append(memory_id)
    return retired


def consolidate_duplicates(
    store: MemoryStore,
    user_id: str,
    layer: MemoryLayer,
    *,
    embedder: Embedder | None = None,
    duplicate_threshold: float = 0.9,
) -> list[MemoryMerge]:
    """Merge the near-duplicate memories of one of the user's layers, keeping the newer.

    Two memories are near duplicates by the rules of `MemoryUpdater` and
    `HeuristicResolver`: equal content, or a retrieval score (see `Scoring`) of at
    least ``duplicate_threshold``. Memories are visited oldest first (by when
    they were stated, `MemoryRecord.at`, then id): one with a newer near
    duplicate is deleted in favour of the most similar such, else its older near
    duplicates are deleted in its favour, so every merge is of a pair that
    scored as duplicates. Passes repeat under the bank's lock until one merges
    nothing (a removal shifts the lexical statistics of the rest), so a second
    call merges nothing. The stored embeddings are used; each memory's text is
    embedded only as a query.

    Args:
        store: The memory store.
        user_id: Whose memories to consolidate; no other user's are read.
        layer: The layer to consolidate.
        embedder: The store's embedder; `HashingEmbedder` by default.
        duplicate_threshold: Score from which two memories say the same thing.

    Returns:
        The merges made, in order.

    Raises:
        InvalidUserIdError: If ``user_id`` is not a valid user id.
        ValueError: If ``layer`` is unknown or ``duplicate_threshold`` is not in (0, 1].
        EmbeddingMismatchError: If the bank was embedded by another embedder.
    """
    check_user_id(user_id)
    content_type(layer)
    threshold = _check_threshold(duplicate_threshold)
    if len(store.list(user_id, layer)) < 2:  # nothing to merge: no write lock taken
        return []
    retriever = MemoryRetriever(store, embedder)
    merges: list[MemoryMerge] = []
    with store.locked(user_id, layer):
        while made := _merge_pass(store, retriever, user_id, layer, threshold):
            merges += made
    return merges


def _upkeep(reason: str) -> dict[str, Any]:
    """The history entry's reason and provenance for a change the upkeep makes."""
    return {"reason": reason, "provenance": Provenance.maintenance(reason)}


def _age(record: MemoryRecord) -> tuple[datetime, str]:
    return record.at, record.id


def _merge_pass(
    store: MemoryStore,
    retriever: MemoryRetriever,
    user_id: str,
    layer: MemoryLayer,
    threshold: float,
) -> list[MemoryMerge]:
    # A buried memory is the person's to unbury: merging it would delete a live twin
    # in its favour, or it in a live one's.
    records = sorted((r for r in store.list(user_id, layer) if r.buried_at is None), key=_age)
    # Equal content is a duplicate whatever it scores: BM25 normalises by length, so a
    # long memory can score below the threshold against its own text.
    same: dict[str, list[MemoryRecord]] = {}
    for record in records:
        same.setdefault(content_digest(record.content), []).append(record)
    removed: set[str] = set()
    merges = []
    for record in records:
        if record.id in removed:
            continue
        search = SearchRequest(layer=layer, query=memory_text(record.content))
        # Whether two memories say the same thing does not depend on when they were said.
        found = retriever.retrieve(
            user_id,
            [search],
            top_k=len(records),
            min_similarity=threshold,
            recency_half_life=None,
        )
        twins = {  # exact twins first, then by score: the first is the most similar
            twin.id: twin
            for twin in [*same[content_digest(record.content)], *(s.record for s in found)]
            if twin.id != record.id and twin.id not in removed
        }
        newer = [twin for twin in twins.values() if _age(twin) > _age(record)]
        pairs = [(newer[0], record)] if newer else [(record, twin) for twin in twins.values()]
        for kept, old in pairs:
            store.delete(user_id, layer, old.id, **_upkeep(f"near duplicate of {kept.id}"))
            removed.add(old.id)
            merges.append(MemoryMerge(layer=layer, kept=kept.id, removed=old.id))
    return merges


def maintain_user(
    store: MemoryStore,
    user_id: str,
    *,
    embedder: Embedder | None = None,
    duplicate_threshold: float = 0.9,
    workspace_max_age: timedelta | None = None,
    now: datetime | None = None,
    choices_min_repeats: int | None = 3,
) -> MaintenanceReport:
    """Expire stale workspace, retire what ended, merge near duplicates, promote, compact.

    Every argument is checked before anything is changed. A user without
    memories is not an error (a job going through `MemoryStore.users` may meet
    one that was just emptied): the report then has zero counts, and nothing is
    written, not even an empty bank.

    Args:
        store: The memory store; compacted only if it is `Compactable`.
        user_id: Whose bank to maintain.
        embedder: The store's embedder, for consolidation; `HashingEmbedder` by default.
        duplicate_threshold: See `consolidate_duplicates`.
        workspace_max_age: Expire workspace memories older than this (see
            `expire_workspace`); ``None`` expires nothing.
        now: The reference time for expiry, retirement and promotion; the current
            time by default.
        choices_min_repeats: Promote a choice repeated in this many past tasks of
            one kind to a persona memory (see `promote_choices`); ``None`` does not.

    Returns:
        What was done, as ids and counts.

    Raises:
        InvalidUserIdError: If ``user_id`` is not a valid user id.
        ValueError: If ``duplicate_threshold``, ``workspace_max_age``, ``now`` or
            ``choices_min_repeats`` is invalid.
        EmbeddingMismatchError: If the bank was embedded by another embedder.
    """
    check_user_id(user_id)
    _check_threshold(duplicate_threshold)
    now = _check_now(now)
    if choices_min_repeats is not None:
        check_min_repeats(choices_min_repeats)
    expired = []
    if workspace_max_age is not None:
        expired = expire_workspace(store, user_id, _check_age(workspace_max_age), now=now)
    retired = retire_expired(store, user_id, now=now)
    merged = [
        merge
        for layer in LAYERS
        for merge in consolidate_duplicates(
            store, user_id, layer, embedder=embedder, duplicate_threshold=duplicate_threshold
        )
    ]
    promoted = []
    if choices_min_repeats is not None:
        updater = MemoryUpdater(store, embedder)
        promoted = [
            decision.record.id
            for decision in promote_choices(
                updater, user_id, min_repeats=choices_min_repeats, now=now
            )
            if decision.operation != "noop" and decision.record is not None
        ]
    compacted = store.compact(user_id) if isinstance(store, Compactable) else 0
    snapshot = store.snapshot(user_id)  # one consistent read for both counts and fingerprint
    return MaintenanceReport(
        user_id=user_id,
        expired=expired,
        retired=retired,
        merged=merged,
        promoted=promoted,
        compacted=compacted,
        memories=dict(snapshot.counts),
        fingerprint=snapshot.fingerprint,
    )
