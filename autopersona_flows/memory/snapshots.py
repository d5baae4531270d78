"""Consistent per-user snapshots, their fingerprints, and their files on disk."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from autopersona_flows import _json
from autopersona_flows.errors import SnapshotError
from autopersona_flows.memory._files import atomic_write
from autopersona_flows.memory.provenance import Provenance
from autopersona_flows.memory.records import LAYERS, MemoryLayer, MemoryRecord, UtcDatetime

__all__ = ["MemoryChange", "MemorySnapshot", "read_snapshot", "write_snapshot"]


def _blank(value: object) -> bool:
    return not value


class MemoryChange(BaseModel):
    """One entry of a bank's change history: a record that was superseded or deleted.

    Attributes:
        operation: ``"update"`` or ``"delete"``.
        at: When it happened (UTC).
        before: The record as it was.
        after: The record that replaced it, for an update.
        reason: Why, if the writer said (e.g. "no longer holds").
        provenance: What made the change: the clarification, ingestion,
            consolidation or person's command, with the flow run if one did.
            ``None`` if the writer did not say (and for a change recovered after an
            interrupted write, like ``reason``).
    """

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    operation: Literal["update", "delete"]
    at: UtcDatetime
    before: MemoryRecord
    after: MemoryRecord | None = None
    reason: Annotated[str, Field(exclude_if=_blank)] = ""  # left out while empty: old bytes stay
    provenance: Annotated[Provenance | None, Field(exclude_if=_blank)] = None  # so is this


class MemorySnapshot(BaseModel):
    """Every memory of one user, read as one consistent view.

    Records are listed per layer in id order, so the same data gives the same
    snapshot and `fingerprint` whichever store or process produced it. Build one
    with `MemorySnapshot.of`; validating one (e.g. from a file) checks that its
    counts and fingerprint match its memories.

    Attributes:
        schema_version: The snapshot format version.
        user_id: Whose memories these are.
        counts: Records per layer.
        fingerprint: SHA-256 of the canonical JSON of ``user_id`` and ``memories``.
        memories: The records of each layer.
    """

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    schema_version: Literal[1] = 1
    user_id: str
    counts: dict[MemoryLayer, int]
    fingerprint: str
    memories: dict[MemoryLayer, list[MemoryRecord]]

    @classmethod
    def of(cls, user_id: str, memories: Mapping[MemoryLayer, Sequence[MemoryRecord]]) -> Self:
        """Build the snapshot of ``memories``, computing counts and the fingerprint."""
        ordered = {
            layer: sorted(memories.get(layer, ()), key=lambda record: record.id) for layer in LAYERS
        }
        return cls(
            user_id=user_id,
            counts={layer: len(records) for layer, records in ordered.items()},
            fingerprint=_fingerprint(user_id, ordered),
            memories=ordered,
        )

    @property
    def is_empty(self) -> bool:
        """Whether the user has no memories at all."""
        return not any(self.counts.values())

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if set(self.memories) != set(LAYERS):
            raise ValueError(f"memories must list every layer {LAYERS}")
        for layer, records in self.memories.items():
            if self.counts.get(layer) != len(records):
                raise ValueError(f"counts[{layer!r}] does not match its {len(records)} memories")
            if any(record.layer != layer for record in records):
                raise ValueError(f"memories[{layer!r}] holds a record of another layer")
            ids = [record.id for record in records]
            if ids != sorted(set(ids)):
                raise ValueError(f"memories[{layer!r}] must be in id order without duplicates")
        if self.fingerprint != _fingerprint(self.user_id, self.memories):
            raise ValueError("fingerprint does not match the memories: the snapshot was altered")
        return self


def _fingerprint(user_id: str, memories: Mapping[MemoryLayer, Sequence[MemoryRecord]]) -> str:
    return _json.digest(
        {
            "user_id": user_id,
            "memories": {
                layer: [record.model_dump(mode="json") for record in records]
                for layer, records in memories.items()
            },
        }
    )


def write_snapshot(snapshot: MemorySnapshot, dest: str | Path) -> Path:
    """Write ``snapshot`` to ``dest`` atomically: a reader sees the old file or the new one.

    The folders of ``dest`` that do not exist yet are created.

    Returns:
        The path written.

    Raises:
        SnapshotError: If ``dest``'s folder cannot be made or written (e.g. a file is
            in the way).
    """
    dest = Path(dest)
    try:
        atomic_write(dest, _json.dumps(snapshot.model_dump(mode="json")) + b"\n")
    except OSError as exc:
        raise SnapshotError(f"cannot write snapshot {dest}: {exc.strerror or exc}") from exc
    return dest


def read_snapshot(path: str | Path) -> MemorySnapshot:
    """Read and verify a snapshot file written by `write_snapshot`.

    Raises:
        SnapshotError: If the file cannot be read, is not JSON, or does not hold a
            valid snapshot (including one whose fingerprint does not match).
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SnapshotError(f"cannot read snapshot {path}: {exc.strerror}") from exc
    try:
        return MemorySnapshot.model_validate_json(data)
    except ValidationError as exc:
        raise SnapshotError(f"{path} is not a valid snapshot:\n{exc}") from exc
