"""Ingestion: completed tasks into the three layers of a user's bank."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from autopersona_flows._validation import valid_lines
from autopersona_flows.errors import IngestionError
from autopersona_flows.memory.extraction import ExtractedMemory, Extractor, RuleExtractor
from autopersona_flows.memory.protocol import MemoryStore
from autopersona_flows.memory.provenance import Provenance
from autopersona_flows.memory.records import (
    PersonaMemory,
    RawTaskRecord,
    TrajectoryMemory,
    WorkspaceMemory,
)
from autopersona_flows.memory.updates import MemoryUpdater, UpdateDecision

__all__ = [
    "IngestionResult",
    "ingest_task_history",
    "read_task_records",
    "refine_persona",
    "refine_trajectory",
    "refine_workspace",
]


def refine_trajectory(record: RawTaskRecord) -> TrajectoryMemory:
    """The request, its key actions, outcome and insight."""
    return TrajectoryMemory(
        query=record.query, trace=record.trace, outcome=record.outcome, insight=record.insight
    )


def refine_workspace(record: RawTaskRecord) -> WorkspaceMemory | None:
    """The task's workspace state and interactions, or ``None`` if it recorded none."""
    if record.task is None and not record.interaction and record.state is None:
        return None
    return WorkspaceMemory(task=record.task, interaction=record.interaction, state=record.state)


def refine_persona(record: RawTaskRecord) -> list[PersonaMemory]:
    """The preferences and constraints the task revealed."""
    return list(record.persona)


class IngestionResult(BaseModel):
    """What ingesting one task did, layer by layer.

    Attributes:
        user_id: Whose bank it went into.
        operations: Every operation in order: the trajectory's ``add``, then the
            workspace and persona items as their updates resolved them. Each
            decision's ``record`` is the memory now holding that information.
    """

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    user_id: str
    operations: list[UpdateDecision] = Field(default_factory=list)

    def counts(self) -> dict[str, int]:
        """Count operations as ``"layer:operation"``, e.g. ``{"persona:update": 1}``."""
        return dict(
            Counter(
                f"{decision.record.layer if decision.record else '?'}:{decision.operation}"
                for decision in self.operations
            )
        )


def ingest_task_history(
    store: MemoryStore,
    updater: MemoryUpdater,
    record: RawTaskRecord,
    *,
    extractor: Extractor | None = None,
) -> IngestionResult:
    """Store one completed task: its trajectory as is, the rest through the updater.

    Every memory is stated at the task's time (`RawTaskRecord.at`), so tasks may
    be ingested in any order: a later one still wins over an earlier one; and a
    task with a time that is already stored (a history ingested again) adds no
    second trajectory. Every memory written records the task's provenance (its
    file and line, `RawTaskRecord.provenance`), or a bare ``ingestion``.

    Args:
        store: The store to write to; must be the updater's store.
        updater: Resolves workspace and persona items against the bank (so a
            repeated preference is a no-op and a changed one an update).
        record: The task.
        extractor: Reads the persona memories out of the task; `RuleExtractor`
            (the listed items and first-person statements) by default.

    Raises:
        ValueError: If ``updater`` writes to another store.
        IngestionError: If the extractor returns anything but `ExtractedMemory`
            items, or one ending before the task happened; nothing is written.
    """
    if updater.store is not store:
        raise ValueError("the updater writes to another store than the one given")
    persona = _extracted(extractor or RuleExtractor(), record)
    user, at = record.user_id, record.at
    source = record.provenance or Provenance.ingestion()
    operations = [_trajectory(updater, record, source)]
    workspace = refine_workspace(record)
    if workspace is not None:
        operations.append(updater.update(user, "workspace", workspace, at=at, provenance=source))
    operations += [
        updater.update(
            user, "persona", item.content, at=at, valid_until=item.valid_until, provenance=source
        )
        for item in persona
    ]
    return IngestionResult(user_id=record.user_id, operations=operations)


def _trajectory(
    updater: MemoryUpdater, record: RawTaskRecord, source: Provenance
) -> UpdateDecision:
    """Add the task's trajectory, unless this very task (same content, same time) is stored.

    Ingesting a history twice then adds nothing the second time, while the same
    request made on another day stays a task of its own.
    """
    content = refine_trajectory(record)
    if record.at is not None:
        with updater.store.locked(record.user_id, "trajectory"):
            for same in updater.retriever.find_all(record.user_id, "trajectory", content):
                if same.at == record.at:
                    return UpdateDecision(
                        operation="noop",
                        target_id=same.id,
                        reason="task already stored",
                        record=same,
                    )
            stored = updater.add(record.user_id, content, at=record.at, provenance=source)
    else:
        stored = updater.add(record.user_id, content, provenance=source)
    return UpdateDecision(operation="add", reason="task trajectory", record=stored)


def _extracted(extractor: Extractor, record: RawTaskRecord) -> list[ExtractedMemory]:
    items = extractor.extract(record)
    if not isinstance(items, list):
        raise IngestionError(f"{extractor!r} returned {type(items).__name__}, not a list")
    for index, item in enumerate(items):
        if not isinstance(item, ExtractedMemory):
            raise IngestionError(
                f"{extractor!r} returned a {type(item).__name__} at {index}, not an ExtractedMemory"
            )
        happened = record.at or datetime.now(UTC)
        if item.valid_until is not None and item.valid_until <= happened:
            raise IngestionError(
                f"{extractor!r}: item {index} ends ({item.valid_until.isoformat()}) before the "
                f"task happened ({happened.isoformat()})"
            )
    return items


def read_task_records(lines: Iterable[bytes], source: str | Path) -> list[RawTaskRecord]:
    """Parse JSONL lines into task records, validating every line first.

    Each record's `RawTaskRecord.provenance` is ``source`` and its line. A line is
    one JSON object: ``user_id`` and ``query`` (text) are required; ``trace`` and
    ``interaction`` are lists of steps; ``outcome``, ``task`` and ``state`` any
    JSON; ``insight`` text; ``persona`` a list of ``{"topic", "preference",
    "strategy"}``; ``at`` an ISO 8601 time with a zone (see `RawTaskRecord`).

    Raises:
        IngestionError: If any line is not valid JSON or not a valid
            `RawTaskRecord`, listing every bad line by ``source``, line and field;
            no record is returned, so nothing of the file is ingested.
    """
    return [
        record.model_copy(update={"provenance": Provenance.ingestion(str(source), line_no)})
        for line_no, record in valid_lines(lines, source, RawTaskRecord, "task")
    ]
