"""The ingestion flow: a JSONL file of completed tasks into the users' memory banks."""

from __future__ import annotations

import hashlib
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, cast
from uuid import UUID

from prefect import flow, task
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.context import FlowRunContext
from pydantic import Field

from autopersona_flows.errors import IngestionError
from autopersona_flows.flows.cache_policies import NodeCachePolicy
from autopersona_flows.flows.runtime import current_runtime
from autopersona_flows.flows.serializers import OrjsonSerializer
from autopersona_flows.memory.ingestion import read_task_records
from autopersona_flows.memory.records import RawTaskRecord

__all__ = ["ingest_history"]

_MICROSECOND = timedelta(microseconds=1)


@task(
    name="ingest-batch",
    cache_policy=NodeCachePolicy(kind="ingest"),
    persist_result=True,
    result_serializer=OrjsonSerializer(),
)
def _ingest_batch(
    episode_id: str, node_id: str, inputs: dict[str, Any], records: list[RawTaskRecord]
) -> dict[str, int]:
    # Keyed on (flow run, file digest, slice), not on the records: when Prefect
    # retries the run, the batches already written come back from the cache.
    totals: Counter[str] = Counter()
    for result in current_runtime().bank.ingest(records):
        totals.update(result.counts())
    return dict(totals)


def _read(file: Path) -> tuple[str, str, list[RawTaskRecord]]:
    """The file's digest, the episode its batches are keyed by, and its tasks, each timed.

    Raises:
        IngestionError: If the file cannot be read or a line is not a valid task.
    """
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise IngestionError(f"cannot read {file}: {exc.strerror}") from exc
    digest = hashlib.sha256(data).hexdigest()
    context = FlowRunContext.get()
    run = context.flow_run if context else None
    created = (run.created if run else None) or datetime.now(UTC)
    records = [
        record if record.at else record.model_copy(update={"at": created + index * _MICROSECOND})
        for index, record in enumerate(read_task_records(data.splitlines(), file))
    ]
    return digest, str(run.id) if run else digest, records


def _progress(description: str) -> UUID:
    """A new progress artifact of the ingestion, at 0%."""
    # A sync flow, where Prefect's async_dispatch runs the sync variant: the artifact's id,
    # not the coroutine its annotation also allows.
    return cast(
        "UUID",
        create_progress_artifact(0.0, key="autopersona-ingestion", description=description),
    )


@flow(name="ingest-task-history")
def ingest_history(
    path: str, batch_size: Annotated[int, Field(ge=1, le=10_000)] = 50
) -> dict[str, Any]:
    """Ingest a JSONL file of completed tasks (`RawTaskRecord` per line).

    The whole file is validated before anything is written, so a bad line near the
    end leaves every bank untouched. Tasks are written in batches, each a Prefect
    task, and a progress artifact follows them. A retry of the same flow run skips
    the batches it already wrote, and a batch that failed half-way stores nothing
    twice: a task without its own time (`RawTaskRecord.at`) is stated at the flow
    run's creation plus its line's index in microseconds, so the retry meets the
    very tasks it wrote (same content, same time) and resolves them to no-ops, and
    the file's order stays the order things were said. A separate run of the
    file is new tasks. The store and embedder are the runtime's
    (`AutopersonaSettings` in a deployment).

    Args:
        path: The file, as the worker sees it.
        batch_size: Tasks per batch.

    Returns:
        ``tasks``, the ``users`` written to, and ``operations`` counted as
        ``"layer:operation"`` (e.g. ``{"persona:update": 3}``).

    Raises:
        IngestionError: If the file cannot be read or a line is not a valid task,
            naming the file and the line.
    """
    file = Path(path).expanduser()
    digest, episode, records = _read(file)
    storage = current_runtime().result_storage
    run_batch = _ingest_batch.with_options(result_storage=storage) if storage else _ingest_batch

    progress = _progress(f"Ingesting {len(records)} tasks from {file.name}")
    totals: Counter[str] = Counter()
    for number, start in enumerate(range(0, len(records), batch_size)):
        stop = min(start + batch_size, len(records))
        totals.update(
            run_batch(
                episode_id=episode,
                node_id=f"batch-{number}",
                inputs={"file": digest, "start": start, "stop": stop},
                records=records[start:stop],
            )
        )
        update_progress_artifact(progress, 100.0 * stop / len(records))
    if not records:
        update_progress_artifact(progress, 100.0)
    return {
        "tasks": len(records),
        "users": sorted({record.user_id for record in records}),
        "operations": dict(sorted(totals.items())),
    }
