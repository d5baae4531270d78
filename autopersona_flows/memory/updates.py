"""Memory updates: resolve new information against what is stored.

`MemoryUpdater.update` retrieves the memories most similar to the new content,
asks a `Resolver` whether to add it, update or delete one of them, or do nothing,
checks the answer, and applies it, all under the bank's lock. The guards do not
trust the resolver (an LLM, typically), and every one of them comes from a bug
seen in the wild:

- an exact duplicate is a no-op without asking the resolver;
- a ``target_id`` must be one of the candidates the resolver was shown;
- an unknown operation, an update without content, or content of another layer
  is a `ResolverError`, and nothing is written;
- a delete never loses the new information: the contradicted memory moves to the
  change history and the new content is stored in its place;
- a statement bounded in time (``valid_until``) never replaces one that is not:
  it is stored beside it, and the standing one holds again once it ends; a later
  standing statement on its slot ends it then;
- what was said earlier never replaces what was said later: content stated
  (``at=``) before the memory it would update or delete is stored as a past
  memory instead, valid until the later one was said, so a history loaded out of
  order ends as one loaded in order;
- a learned answer replacing one on its slot keeps where that one was learned;
- every write carries the ``provenance`` it was given: a new or revised memory
  as its own, a history entry as what made the change (content left as it was,
  a restatement or an ended span, keeps the memory's own).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, ValidationError

from autopersona_flows.errors import EmbedderError, ResolverError
from autopersona_flows.memory.embedders import Embedder, check_vectors, default_embedder
from autopersona_flows.memory.encoders import shared_encoder
from autopersona_flows.memory.protocol import MemoryStore
from autopersona_flows.memory.provenance import Provenance
from autopersona_flows.memory.records import (
    Embedding,
    LayerContent,
    MemoryLayer,
    MemoryRecord,
    PersonaMemory,
    WorkspaceMemory,
    as_content,
)
from autopersona_flows.memory.retrieval import (
    MemoryRetriever,
    ScoredMemory,
    SearchRequest,
    check_top_k,
)
from autopersona_flows.memory.slots import adds_value, ended_things, ends, replaces, same_slot
from autopersona_flows.memory.text import memory_text, normalise
from autopersona_flows.memory.users import check_user_id

__all__ = [
    "FunctionResolver",
    "HeuristicResolver",
    "MemoryUpdater",
    "Resolver",
    "UpdateDecision",
    "embed_records",
]

Operation = Literal["add", "update", "delete", "noop"]


class UpdateDecision(BaseModel):
    """What to do with new content, and (after `MemoryUpdater.update`) what was done.

    Attributes:
        operation: ``add`` it as a new memory; ``update`` the target with it;
            ``delete`` the target it contradicts (the new content is stored too);
            ``noop``: it is already known.
        target_id: The candidate updated, deleted, or duplicated (by noop).
        content: The resulting content: required for ``update``; for ``add`` and
            ``delete`` it defaults to the new content.
        reason: Why, in a few words (shown in logs and UIs).
        record: Set by the updater: the memory now holding the information (the
            added or updated record, or the existing one for a noop).
    """

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    operation: Operation
    target_id: str | None = None
    content: LayerContent | None = None
    reason: str = ""
    record: MemoryRecord | None = None


@runtime_checkable
class Resolver(Protocol):
    """Decides how new content relates to the most similar stored memories.

    Contract: return an `UpdateDecision` (or a dict that validates as one) whose
    ``target_id``, if any, is the id of one of ``candidates``. ``candidates`` are
    the user's memories of ``layer`` most similar to ``new_content``, best first.
    """

    def __call__(
        self, layer: MemoryLayer, new_content: LayerContent, candidates: list[ScoredMemory]
    ) -> UpdateDecision:
        """Decide what to do with ``new_content``."""
        ...


class FunctionResolver:
    """Adapt a callable ``(layer, new_content, candidates) -> UpdateDecision | dict``."""

    def __init__(self, fn: Callable[[MemoryLayer, LayerContent, list[ScoredMemory]], Any]) -> None:
        self._fn = fn

    def __repr__(self) -> str:
        return f"FunctionResolver({self._fn!r})"

    def __call__(
        self, layer: MemoryLayer, new_content: LayerContent, candidates: list[ScoredMemory]
    ) -> UpdateDecision:
        """Call the function; `MemoryUpdater` validates what it returns."""
        return self._fn(layer, new_content, candidates)


class HeuristicResolver:
    """The default resolver, with no LLM.

    - A persona memory on the same slot (`same_slot`: the same attribute of the
      same thing, however the topic is worded) with the same preference is a noop;
      with a different one it is updated (the newest preference wins, the old one
      goes to the change history), unless it adds to the slot ("also", `adds_value`).
    - A persona memory saying that what another one is about stopped ("I quit
      coffee" against a "coffee order", `ends`) updates that one.
    - A persona memory announcing a change ("43 these days") updates the most
      similar one it may replace in other words (`replaces`), and one that such
      a memory may have replaced updates it (what was said later then wins, by
      the updater's guard on time).
    - A workspace memory of the same task as a stored one is its newer state: it
      updates that one.
    - Otherwise a candidate scoring at least ``duplicate_threshold`` makes it a
      noop (a near duplicate).
    - Otherwise the content is added.

    Args:
        duplicate_threshold: Retrieval score (see `Scoring`) from which a candidate
            counts as saying the same thing.
    """

    def __init__(self, duplicate_threshold: float = 0.9) -> None:
        if not 0.0 < duplicate_threshold <= 1.0:
            raise ValueError(f"duplicate_threshold must lie in (0, 1], got {duplicate_threshold}")
        self.duplicate_threshold = duplicate_threshold

    def __repr__(self) -> str:
        return f"HeuristicResolver(duplicate_threshold={self.duplicate_threshold})"

    def __call__(
        self, layer: MemoryLayer, new_content: LayerContent, candidates: list[ScoredMemory]
    ) -> UpdateDecision:
        """Decide by slot for persona memories, by task for workspace, by score for all."""
        if isinstance(new_content, PersonaMemory):
            decision = self._persona(new_content, candidates)
            if decision is not None:
                return decision
        if isinstance(new_content, WorkspaceMemory) and new_content.task is not None:
            for candidate in candidates:
                old = candidate.record.content
                if isinstance(old, WorkspaceMemory) and old.task == new_content.task:
                    return UpdateDecision(
                        operation="update",
                        target_id=candidate.record.id,
                        content=new_content,
                        reason="a newer state of the same task",
                    )
        if candidates and candidates[0].score >= self.duplicate_threshold:
            return UpdateDecision(
                operation="noop",
                target_id=candidates[0].record.id,
                reason=f"near duplicate (score {candidates[0].score:.2f})",
            )
        return UpdateDecision(operation="add", reason="new information")

    @staticmethod
    def _persona(new: PersonaMemory, candidates: list[ScoredMemory]) -> UpdateDecision | None:
        # A standing memory on the slot is what a new value replaces; a bounded one
        # ("my temp number until the 31st") is ended beside it (`_end_bounded`),
        # whichever ranks first.
        ordered = sorted(candidates, key=lambda c: c.record.valid_until is not None)
        olds = [(c.record.id, c.record.content) for c in ordered]
        persona = [(i, old) for i, old in olds if isinstance(old, PersonaMemory)]
        for memory_id, old in persona:
            if not same_slot(new.topic, old.topic):
                continue
            if new.request and old.request and not _same_situation(new.request, old.request):
                continue  # answered for another request: both hold, each for its own
            if normalise(old.preference) == normalise(new.preference):
                return UpdateDecision(
                    operation="noop", target_id=memory_id, reason="same preference"
                )
            if adds_value(new.preference):
                continue
            ended = ends(new.preference, old.topic)
            return UpdateDecision(
                operation="update",
                target_id=memory_id,
                content=new,
                reason=f"no longer holds: {new.preference!r}"
                if ended
                else f"newer value for {old.topic!r}: {new.preference!r}",
            )
        for memory_id, old in persona:
            if ends(new.preference, old.topic):
                return UpdateDecision(
                    operation="update",
                    target_id=memory_id,
                    content=new,
                    reason=f"no longer holds: {new.preference!r}",
                )
        index = _ended_by_meaning(new, [old for _, old in persona])
        if index is not None:
            memory_id = persona[index][0]
            return UpdateDecision(
                operation="update",
                target_id=memory_id,
                content=new,
                reason=f"no longer holds, in other words: {new.preference!r}",
            )
        for memory_id, old in persona:
            if replaces(new.topic, new.preference, old.topic, old.preference) or replaces(
                old.topic, old.preference, new.topic, new.preference
            ):
                return UpdateDecision(
                    operation="update",
                    target_id=memory_id,
                    content=new,
                    reason=f"changed, in other words: {new.preference!r}",
                )
        return None


_SAME_SITUATION = 0.7
"""The cosine from which two requests an answer was given for are one situation: "the
client pitch in Leeds" and "the client pitch in York" are; a hen do is not."""


def _same_situation(new: str, old: str) -> bool:
    """Whether answers given for these two requests are for one situation.

    For one, the newer replaces the older as a change of mind; for two, both are kept.
    """
    if normalise(new) == normalise(old):
        return True
    encoder = shared_encoder()
    first, second = encoder.embed([new, old])
    return float(first @ second) >= _SAME_SITUATION


_ENDS = 0.35
"""The cosine from which what a statement says stopped ("eating meat") covers an older
preference ("dinner order: steak frites"): the same thing, in other words."""
_ENDS_MARGIN = 0.15
"""How much nearer it must be than any other preference: an end is never guessed."""


def _ended_by_meaning(new: PersonaMemory, olds: list[PersonaMemory]) -> int | None:
    """The older preference whose value a statement of an end covers in meaning, if one.

    "I stopped eating meat" under "diet" ends "dinner order: steak frites": no word
    is shared, the meaning is (the shipped sentence encoder). Only values that are not
    themselves an end, and only the closest.
    """
    things = ended_things(new.preference)
    values = [
        (i, f"{old.topic}: {old.preference}")
        for i, old in enumerate(olds)
        if not ended_things(old.preference)
    ]
    if not things or not values:
        return None
    encoder = shared_encoder()
    near = (encoder.embed([text for _, text in values]) @ encoder.embed(things).T).max(axis=1)
    order = near.argsort()[::-1]
    best = float(near[order[0]])
    runner_up = float(near[order[1]]) if len(order) > 1 else 0.0
    # Only a clear one: what ended is near it, and nearer than to any other value.
    if best >= _ENDS and best - runner_up >= _ENDS_MARGIN:
        return values[int(order[0])][0]
    return None


def embed_records(
    embedder: Embedder, contents: Sequence[LayerContent], **fields: Any
) -> list[MemoryRecord]:
    """Wrap contents in new records carrying their embeddings (one `embed` call).

    ``fields`` set the rest of each record (e.g. ``stated_at``).
    """
    texts = [memory_text(content) for content in contents]
    if not texts:
        return []
    vectors = check_vectors(embedder, texts, embedder.embed(texts))
    return [
        MemoryRecord.of(content, embedding=Embedding.of(embedder.name, vector), **fields)
        for content, vector in zip(contents, vectors, strict=True)
    ]


class MemoryUpdater:
    """Writes new information into a bank through a resolver and its guards.

    Args:
        store: The memory store.
        embedder: Embeds what is written; must be the store's embedder.
        resolver: Decides add / update / delete / noop; `HeuristicResolver` by default.
        top_k: How many similar memories each search contributes to what the
            resolver is shown (persona content searches by full text and by topic).
        retriever: The retriever to find candidates with; one over ``store`` and
            ``embedder`` is made if not given (share one to share its indexes).
    """

    def __init__(
        self,
        store: MemoryStore,
        embedder: Embedder | None = None,
        resolver: Resolver | Callable[..., Any] | None = None,
        top_k: int = 3,
        *,
        retriever: MemoryRetriever | None = None,
    ) -> None:
        self.store = store
        self.embedder = embedder or (retriever.embedder if retriever else default_embedder())
        self.resolver = resolver if resolver is not None else HeuristicResolver()
        self.top_k = check_top_k(top_k)
        self.retriever = retriever or MemoryRetriever(store, self.embedder)
        if self.retriever.store is not store:
            # Two store objects on one folder hold separate locks: the updater's bank
            # lock would block the retriever's read in the same thread forever.
            raise ValueError("the retriever must read the updater's store object")
        theirs, ours = self.retriever.embedder, self.embedder
        if (theirs.name, theirs.dim) != (ours.name, ours.dim):
            raise EmbedderError(
                f"the retriever embeds with {theirs.name!r}, the updater with {ours.name!r}: "
                "they must be the same"
            )

    def __repr__(self) -> str:
        return f"MemoryUpdater({self.store!r}, {self.embedder!r}, {self.resolver!r})"

    def add(
        self,
        user_id: str,
        content: LayerContent,
        *,
        at: datetime | None = None,
        valid_until: datetime | None = None,
        provenance: Provenance | None = None,
    ) -> MemoryRecord:
        """Store content as a new memory with its embedding, without resolving it.

        Args:
            user_id: Whose bank.
            content: What to store.
            at: When it was stated or observed, if not now (`MemoryRecord.stated_at`).
            valid_until: When it stops holding, if it does.
            provenance: Where it came from (`MemoryRecord.provenance`).
        """
        when = _When.of(at, valid_until, provenance)
        (record,) = embed_records(
            self.embedder,
            [content],
            stated_at=when.at,
            valid_until=when.until,
            provenance=provenance,
        )
        return self.store.add(user_id, record)

    def update(
        self,
        user_id: str,
        layer: MemoryLayer,
        content: LayerContent | dict[str, Any],
        *,
        at: datetime | None = None,
        valid_until: datetime | None = None,
        provenance: Provenance | None = None,
    ) -> UpdateDecision:
        """Resolve ``content`` against the user's ``layer`` and apply the decision.

        The resolver is shown the memories most similar to ``content`` that had not
        expired when it was said.

        Args:
            user_id: Whose bank.
            layer: The layer of ``content``.
            content: The new information.
            at: When it was stated or observed, if not now: recency and supersession
                go by it, so a history may be loaded in any order.
            valid_until: When it stops holding, if it does ("until March").
            provenance: Where it came from: a memory it adds or revises records it
                as its own, and every history entry the update makes as its cause.

        Returns:
            The decision as applied, with ``record`` set to the memory that now
            holds the information.

        Raises:
            ResolverError: If the resolver's decision is invalid; nothing is written.
        """
        check_user_id(user_id)
        content = as_content(content, layer)
        when = _When.of(at, valid_until, provenance)
        with self.store.locked(user_id, layer):
            existing = self.retriever.find_exact(user_id, layer, content)
            if existing is not None:
                return self._restated(user_id, existing, when)
            searches = [SearchRequest(layer=layer, query=memory_text(content))]
            if isinstance(content, PersonaMemory):
                # The topic alone finds the preference this one may replace even when
                # the full text ranks other memories higher; what it says ended
                # ("caffeine") finds what that ends, under another topic.
                searches += [
                    SearchRequest(layer=layer, query=text)
                    for text in (content.topic, *ended_things(content.preference))
                ]
            # What still held when the content was said, whenever it was said itself:
            # a backfilled statement meets both what it may replace and what came later.
            said = when.at or datetime.now(UTC)
            # What the new content may replace or repeat, however long ago it was said.
            bundle = self.retriever.retrieve(
                user_id, searches, top_k=self.top_k, include_past=True, recency_half_life=None
            )
            candidates = [
                candidate
                for candidate in bundle.layer(layer)
                if candidate.record.valid_until is None or said < candidate.record.valid_until
            ]
            decision = self._checked(layer, content, candidates)
            return self._apply(user_id, layer, content, decision, candidates, when=when)

    def _checked(
        self, layer: MemoryLayer, content: LayerContent, candidates: list[ScoredMemory]
    ) -> UpdateDecision:
        answer = self.resolver(layer, content, list(candidates))
        if isinstance(answer, dict):
            try:
                if isinstance(answer.get("content"), dict):  # e.g. parsed from an LLM's JSON
                    answer = {**answer, "content": as_content(answer["content"], layer)}
                answer = UpdateDecision.model_validate(answer)
            except ValidationError as exc:
                raise ResolverError(f"the resolver returned an invalid decision:\n{exc}") from exc
        if not isinstance(answer, UpdateDecision):
            raise ResolverError(
                f"the resolver must return an UpdateDecision, got {type(answer).__name__}"
            )
        try:  # an instance may have been built with model_copy or model_construct
            answer = UpdateDecision.model_validate(answer.model_dump())
        except ValidationError as exc:
            raise ResolverError(f"the resolver returned an invalid decision:\n{exc}") from exc
        shown = [candidate.record.id for candidate in candidates]
        if answer.operation in ("update", "delete") and answer.target_id is None:
            raise ResolverError(f"a {answer.operation} decision needs a target_id")
        if answer.operation == "add" and answer.target_id is not None:
            raise ResolverError("an add decision takes no target_id")
        if answer.target_id is not None and answer.target_id not in shown:
            raise ResolverError(
                f"target_id {answer.target_id!r} is not one of the candidates shown {shown}"
            )
        if answer.operation == "update" and answer.content is None:
            raise ResolverError("an update decision must carry the resulting content")
        if answer.content is not None and answer.content.layer != layer:
            raise ResolverError(
                f"the decision's content is a {answer.content.layer} memory, not {layer}"
            )
        return answer

    def _apply(
        self,
        user_id: str,
        layer: MemoryLayer,
        content: LayerContent,
        decision: UpdateDecision,
        candidates: list[ScoredMemory],
        *,
        when: _When,
    ) -> UpdateDecision:
        result = decision.content or content
        if decision.operation == "noop":
            target = next((c.record for c in candidates if c.record.id == decision.target_id), None)
            return decision.model_copy(update={"record": target})
        existing = self.retriever.find_exact(user_id, layer, result)
        if existing is not None and decision.operation == "add":
            return decision.model_copy(
                update={
                    "operation": "noop",
                    "target_id": existing.id,
                    "record": existing,
                    "reason": "exact duplicate of the resolved content",
                }
            )
        if decision.operation in ("update", "delete"):
            target = next(c.record for c in candidates if c.record.id == decision.target_id)
            if when.at is not None and when.at < target.at:
                return self._past(user_id, result, decision, target, when)
            if when.until is not None and target.valid_until is None:
                # "My temp number until the 30th": the standing one holds again after.
                decision = decision.model_copy(
                    update={
                        "operation": "add",
                        "target_id": None,
                        "reason": f"holds until {when.until.isoformat()}, beside memory "
                        f"{target.id} ({decision.reason})",
                    }
                )
            else:
                result = _carried(result, target.content)
        # Embed first: if the embedder fails, nothing has been changed yet.
        (embedded,) = embed_records(
            self.embedder,
            [result],
            stated_at=when.at,
            valid_until=when.until,
            provenance=when.source,
        )
        match decision.operation:
            case "update":
                record = self.store.update(
                    user_id,
                    layer,
                    str(decision.target_id),
                    result,
                    embedding=embedded.embedding,
                    **when.keywords(decision.reason),
                )
            case "delete":
                self.store.delete(
                    user_id,
                    layer,
                    str(decision.target_id),
                    **when.keywords(decision.reason, at=False),
                )
                record = self.store.add(user_id, embedded)
            case "add":
                record = self.store.add(user_id, embedded)
            case other:  # unreachable after validation; never write on an unknown operation
                raise ResolverError(f"unknown operation {other!r}")
        if when.until is None:
            self._end_bounded(user_id, record, candidates, when.source)
        return decision.model_copy(update={"content": result, "record": record})

    def _end_bounded(
        self,
        user_id: str,
        record: MemoryRecord,
        candidates: list[ScoredMemory],
        source: Provenance | None,
    ) -> None:
        """A standing statement ends the bounded ones it follows on its slot.

        "My number is 555-0777" after "my temp number until the 31st": the temporary
        one held until the standing one was said.
        """
        content = record.content
        if not isinstance(content, PersonaMemory):
            return
        for candidate in candidates:
            old = candidate.record
            if (
                old.id != record.id
                and isinstance(old.content, PersonaMemory)
                and old.valid_until is not None
                and old.at < record.at < old.valid_until
                and same_slot(old.content.topic, content.topic)
            ):
                self.store.update(
                    user_id,
                    "persona",
                    old.id,
                    old.content,
                    embedding=old.embedding,
                    **_When(old.at, record.at, source).keywords(f"ended by memory {record.id}"),
                )

    def _restated(self, user_id: str, existing: MemoryRecord, when: _When) -> UpdateDecision:
        """The same content said again: a noop, unless it now holds for another span.

        Restated without the end it had ("off dairy until March", then "off dairy"),
        or with another, the memory takes the new span, so it does not expire on
        the old one; said before the stored one, it changes nothing.
        """
        later = when.at is None or when.at >= existing.at
        if existing.valid_until == when.until or not later:
            return UpdateDecision(
                operation="noop", target_id=existing.id, reason="exact duplicate", record=existing
            )
        reason = "restated, now holding " + (
            f"until {when.until.isoformat()}" if when.until else "with no end"
        )
        record = self.store.update(
            user_id,
            existing.layer,
            existing.id,
            existing.content,
            embedding=existing.embedding,
            **_When(when.at or datetime.now(UTC), when.until, when.source).keywords(reason),
        )
        return UpdateDecision(
            operation="update", target_id=existing.id, reason=reason, record=record
        )

    def _past(
        self,
        user_id: str,
        content: LayerContent,
        decision: UpdateDecision,
        later: MemoryRecord,
        when: _When,
    ) -> UpdateDecision:
        """Keep content stated before the memory it would replace, as a past memory.

        It held until the first thing said after it on that memory: the memory now,
        or one of its earlier versions.
        """
        assert when.at is not None
        after = [later.at] + [
            change.before.at
            for change in self.store.history(user_id, later.layer, later.id)
            if change.before.at > when.at
        ]
        until = min([*after, when.until] if when.until else after)
        (record,) = embed_records(
            self.embedder,
            [content],
            stated_at=when.at,
            valid_until=until,
            provenance=when.source,
        )
        self.store.add(user_id, record)
        return UpdateDecision(
            operation="add",
            content=content,
            reason=f"stated before memory {later.id} ({decision.reason}): kept as past",
            record=record,
        )


@dataclass(frozen=True)
class _When:
    """When new content was stated, until when it holds (checked), and where it came from."""

    at: datetime | None
    until: datetime | None
    source: Provenance | None = None

    @classmethod
    def of(
        cls, at: datetime | None, until: datetime | None, source: Provenance | None = None
    ) -> _When:
        for name, value in (("at", at), ("valid_until", until)):
            if value is not None and (not isinstance(value, datetime) or value.utcoffset() is None):
                raise ValueError(f"{name} must be a timezone-aware datetime, got {value!r}")
        if at is not None and until is not None and until <= at:
            raise ValueError(
                f"valid_until ({until.isoformat()}) is not after at ({at.isoformat()})"
            )
        if source is not None and not isinstance(source, Provenance):
            raise TypeError(f"provenance must be a Provenance, got {type(source).__name__}")
        return cls(at, until, source)

    def keywords(self, reason: str, *, at: bool = True) -> dict[str, Any]:
        """The keywords of `MemoryStore.update` (or, without ``at``, ``delete``) that are set.

        A store written to the protocol before event time or provenance takes a
        write that carries none of them.
        """
        given: dict[str, Any] = {"reason": reason, "provenance": self.source}
        if at:
            given |= {"at": self.at, "valid_until": self.until}
        return {name: value for name, value in given.items() if value}


def _carried(new: LayerContent, old: LayerContent) -> LayerContent:
    """A learned answer replacing one on its slot keeps where that one was learned.

    Its other names and the nodes it was asked at (`PersonaMemory.aliases` and
    ``contexts``) stay with the topic, so that no node asks again what it was told.
    """
    if not (
        isinstance(new, PersonaMemory)
        and isinstance(old, PersonaMemory)
        and new.contexts
        and same_slot(new.topic, old.topic)
    ):
        return new
    topic = new.topic.strip()
    aliases = [a for a in dict.fromkeys([*new.aliases, *old.aliases]) if a.strip() != topic]
    contexts = list(dict.fromkeys([*new.contexts, *old.contexts]))
    return new.model_copy(update={"aliases": aliases, "contexts": contexts})
