"""A person's corrections of a memory, by its id: edit, forget, bury and unbury.

The updater decides what new information does to a bank; these are the other
way in, for someone who read the bank (``autopersona memories``) and found a
memory wrong. Each goes through the store's own write paths under the bank's
lock, so a correction leaves the same trail as any other change:

- `edit_memory` revises the content: the store's update, the old version to the
  change history, the new content embedded before anything is written;
- `forget_memory` deletes the record: the store's delete, the record to the
  history, never retrieved again;
- `bury_memory` keeps the record but leaves it out of retrieval, and so out of
  every decision (`MemoryRecord.buried_at`), until `unbury_memory`.

Every reason recorded in the history says a person made the change, and every
history entry carries an ``edit`` `Provenance` (with the CLI command, if one
made it); an edited memory takes it as its own, since a person is now where its
content came from, while a buried one keeps where it was learned.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from autopersona_flows.errors import CorrectionError, EmbeddingMismatchError, MemoryNotFoundError
from autopersona_flows.memory.embedders import Embedder
from autopersona_flows.memory.ids import MEMORY_ID_PATTERN
from autopersona_flows.memory.protocol import MemoryStore
from autopersona_flows.memory.provenance import Provenance
from autopersona_flows.memory.records import LAYERS, MemoryLayer, MemoryRecord, content_type
from autopersona_flows.memory.updates import embed_records
from autopersona_flows.memory.users import check_user_id

__all__ = ["bury_memory", "edit_memory", "find_memory", "forget_memory", "unbury_memory"]


def find_memory(
    store: MemoryStore, user_id: str, memory_id: str, layer: MemoryLayer | None = None
) -> MemoryRecord:
    """The user's current memory with this id, in ``layer`` or whichever layer holds it.

    Raises:
        CorrectionError: If ``memory_id`` is not a memory id at all.
        MemoryNotFoundError: If the user has no current memory with that id (a
            forgotten one is only in the history).
        ValueError: If ``layer`` is not one of `LAYERS`.
    """
    check_user_id(user_id)
    if not isinstance(memory_id, str) or not MEMORY_ID_PATTERN.match(memory_id):
        raise CorrectionError(
            f"{memory_id!r} is not a memory id (26 characters of Crockford base32, as "
            "`autopersona memories` lists them)"
        )
    layers = LAYERS if layer is None else (content_type(layer).layer,)
    for name in layers:
        try:
            return store.get(user_id, name, memory_id)
        except MemoryNotFoundError:
            continue
    raise MemoryNotFoundError(user_id, " or ".join(layers), memory_id)


def edit_memory(
    store: MemoryStore,
    embedder: Embedder,
    user_id: str,
    memory_id: str,
    changes: Mapping[str, Any],
    *,
    layer: MemoryLayer | None = None,
    reason: str = "",
    command: str | None = None,
) -> MemoryRecord:
    """Revise fields of a memory's content; the old version goes to the history.

    The memory keeps its id, creation time, validity end and burial; what it says
    is stated now. Changes that leave the content as it was write nothing.

    Args:
        store: The memory store.
        embedder: The store's embedder: the new content is embedded with it first,
            so a failing embedder changes nothing.
        user_id: Whose memory.
        memory_id: Its id.
        changes: New values by field name (e.g. ``{"preference": "APA"}``).
        layer: Its layer, if known; every layer is looked in otherwise.
        reason: Why, for the history.
        command: The CLI command making the edit, for its provenance; ``None``
            from Python.

    Returns:
        The memory as it now is.

    Raises:
        CorrectionError: If there are no changes, a field does not exist in the
            memory's layer, or a value is not one the field can hold; nothing is
            written.
        MemoryNotFoundError: If the user has no such memory.
        EmbeddingMismatchError: If the memory was embedded by another embedder.
    """
    if not changes:
        raise CorrectionError("nothing to change: give at least one field and its new value")
    record = find_memory(store, user_id, memory_id, layer)
    model = content_type(record.layer)
    unknown = [name for name in changes if name not in model.model_fields]
    if unknown:
        raise CorrectionError(
            f"a {record.layer} memory has no field {', '.join(map(repr, unknown))}; "
            f"its fields are {', '.join(model.model_fields)}"
        )
    with store.locked(user_id, record.layer):
        record = store.get(user_id, record.layer, memory_id)  # as it is under the lock
        try:
            content = model.model_validate({**record.content.model_dump(), **changes})
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, error['loc'])) or 'content'}: {error['msg']}"
                for error in exc.errors()
            )
            raise CorrectionError(
                f"cannot set {', '.join(changes)} of {record.layer} memory {memory_id}: {problems}"
            ) from None
        if content == record.content:
            return record
        if record.embedding is not None and (record.embedding.model, record.embedding.dim) != (
            embedder.name,
            embedder.dim,
        ):
            raise EmbeddingMismatchError(
                f"{record.layer} memory {memory_id} was embedded by {record.embedding.model!r}, "
                f"not {embedder.name!r}: edit with the store's embedder (--embedder)"
            )
        (embedded,) = embed_records(embedder, [content])
        return store.update(
            user_id,
            record.layer,
            memory_id,
            content,
            embedding=embedded.embedding,
            valid_until=record.valid_until,
            reason=_by_a_person("edited", reason),
            provenance=Provenance.edit(reason, command=command),
        )


def forget_memory(
    store: MemoryStore,
    user_id: str,
    memory_id: str,
    *,
    layer: MemoryLayer | None = None,
    reason: str = "",
    command: str | None = None,
) -> MemoryRecord:
    """Delete a memory: kept in the change history only, never retrieved again.

    Returns:
        The memory as it was.

    Raises:
        CorrectionError: If ``memory_id`` is not a memory id.
        MemoryNotFoundError: If the user has no such memory (or it was forgotten).
    """
    record = find_memory(store, user_id, memory_id, layer)
    return store.delete(
        user_id,
        record.layer,
        memory_id,
        reason=_by_a_person("forgotten", reason),
        provenance=Provenance.edit(reason, command=command),
    )


def bury_memory(
    store: MemoryStore,
    user_id: str,
    memory_id: str,
    *,
    layer: MemoryLayer | None = None,
    reason: str = "",
    command: str | None = None,
) -> MemoryRecord:
    """Keep a memory but leave it out of retrieval and decisions until unburied.

    Burying a buried memory changes nothing.

    Returns:
        The memory as it now is (`MemoryRecord.buried_at` set).

    Raises:
        CorrectionError: If ``memory_id`` is not a memory id.
        MemoryNotFoundError: If the user has no such memory.
    """
    return _set_buried(
        store, user_id, memory_id, layer, buried=True, reason=reason, command=command
    )


def unbury_memory(
    store: MemoryStore,
    user_id: str,
    memory_id: str,
    *,
    layer: MemoryLayer | None = None,
    reason: str = "",
    command: str | None = None,
) -> MemoryRecord:
    """Let a buried memory be retrieved again; one not buried is left as it is.

    Returns:
        The memory as it now is.

    Raises:
        CorrectionError: If ``memory_id`` is not a memory id.
        MemoryNotFoundError: If the user has no such memory.
    """
    return _set_buried(
        store, user_id, memory_id, layer, buried=False, reason=reason, command=command
    )


def _set_buried(
    store: MemoryStore,
    user_id: str,
    memory_id: str,
    layer: MemoryLayer | None,
    *,
    buried: bool,
    reason: str,
    command: str | None,
) -> MemoryRecord:
    record = find_memory(store, user_id, memory_id, layer)
    with store.locked(user_id, record.layer):
        record = store.get(user_id, record.layer, memory_id)
        if (record.buried_at is not None) == buried:
            return record
        # The content, its embedding and the time it was said stay as they were: only
        # whether it may be used changes, and unburying gives back the memory it was.
        return store.update(
            user_id,
            record.layer,
            memory_id,
            record.content,
            embedding=record.embedding,
            at=record.at,
            valid_until=record.valid_until,
            reason=_by_a_person("buried" if buried else "unburied", reason),
            buried=buried,
            provenance=Provenance.edit(reason, command=command),
        )


def _by_a_person(what: str, reason: str) -> str:
    return f"{what} by a person" + (f": {reason}" if reason.strip() else "")
