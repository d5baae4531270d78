"""The maintenance flow: scheduled upkeep of every user's memory bank."""

from __future__ import annotations

from contextlib import suppress
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_table_artifact
from pydantic import Field

from autopersona_flows.flows.runtime import current_runtime
from autopersona_flows.flows.settings import load_settings
from autopersona_flows.memory.maintenance import MaintenanceReport, maintain_user
from autopersona_flows.memory.protocol import MemoryStore
from autopersona_flows.memory.snapshots import MemorySnapshot, write_snapshot
from autopersona_flows.memory.users import check_user_id, user_key

__all__ = ["memory_maintenance"]


@task(name="maintain-user")
def _maintain(
    user_id: str,
    workspace_max_age_days: float | None,
    duplicate_threshold: float,
    snapshots: Path,
) -> dict[str, Any]:
    bank = current_runtime().bank
    report: MaintenanceReport = maintain_user(
        bank.store,
        user_id,
        embedder=bank.embedder,
        duplicate_threshold=duplicate_threshold,
        workspace_max_age=(
            timedelta(days=workspace_max_age_days) if workspace_max_age_days else None
        ),
    )
    snapshot = bank.store.snapshot(user_id)
    path = None if snapshot.is_empty else _export(bank.store, snapshot, snapshots)
    # Ids, counts and the fingerprint only: memory contents never reach the logs.
    get_run_logger().info(
        "user %s: %d expired, %d retired, %d merged, %d promoted, %d dead entries compacted,"
        " fingerprint sha256:%s",
        user_id,
        len(report.expired),
        len(report.retired),
        len(report.merged),
        len(report.promoted),
        report.compacted,
        snapshot.fingerprint,
    )
    # The file's fingerprint: a write between the two reads would make the report's stale.
    return {
        **report.model_dump(mode="json"),
        "fingerprint": snapshot.fingerprint,
        "snapshot": None if path is None else str(path),
    }


def _export(store: MemoryStore, snapshot: MemorySnapshot, snapshots: Path) -> Path | None:
    """Write a user's snapshot file, unless the user was erased meanwhile.

    A user with no memories gets no snapshot: `erase_user` may have just erased them
    (after this task listed them), and nothing of theirs must be written after that.
    An erase between reading the snapshot and writing its file is caught by looking
    again after the write: the file is then removed (the erase removed the rest).
    """
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    folder = snapshots / user_key(snapshot.user_id)
    folder.mkdir(parents=True, exist_ok=True)
    path = write_snapshot(snapshot, folder / f"{stamp}-{snapshot.fingerprint[:16]}.json")
    if not store.snapshot(snapshot.user_id).is_empty:
        return path
    path.unlink(missing_ok=True)
    with suppress(OSError):  # not empty: older snapshots of a user who deleted everything
        folder.rmdir()
    return None


@flow(name="memory-maintenance")
def memory_maintenance(
    user_id: str | None = None,
    workspace_max_age_days: Annotated[float, Field(gt=0)] | None = 90,
    duplicate_threshold: Annotated[float, Field(gt=0, le=1)] = 0.9,
    snapshot_dir: str | None = None,
) -> list[dict[str, Any]]:
    """Expire, consolidate, compact and snapshot the memory of every user (or one).

    Per user, as its own task: workspace memories older than the age are deleted,
    memories whose validity ended are retired to history, near-duplicates are
    merged through the update guards (the newer wording stays), choices repeated
    across past tasks become persona memories, the banks are compacted, and a
    snapshot is exported. A table artifact reports what changed and each
    snapshot's fingerprint; memory contents are never logged.

    Args:
        user_id: Only this user; every user of the store if ``None``.
        workspace_max_age_days: Age after which a workspace memory expires; ``None``
            keeps them all.
        duplicate_threshold: Similarity at which two memories of a layer are one.
        snapshot_dir: Where snapshots go (one folder per user); the ``snapshots``
            setting, or ``$PREFECT_HOME/autopersona/snapshots``, if ``None``.

    Returns:
        One report per user: ``expired``, ``retired``, ``merged`` and ``promoted``
        ids, ``compacted`` entries,
        ``memories`` per layer, the snapshot's ``fingerprint`` and file (``None``
        for a user without memories: no snapshot is written of one).
    """
    store = current_runtime().bank.store
    users = [check_user_id(user_id)] if user_id is not None else store.users()
    snapshots = (
        Path(snapshot_dir).expanduser() if snapshot_dir else load_settings().snapshots_path()
    )
    reports = [
        _maintain.with_options(task_run_name=f"maintain-{user_key(user)}")(
            user, workspace_max_age_days, duplicate_threshold, snapshots
        )
        for user in users
    ]
    create_table_artifact(
        key="autopersona-maintenance",
        table=[
            {
                "user": report["user_id"],
                "expired": len(report["expired"]),
                "retired": len(report["retired"]),
                "merged": len(report["merged"]),
                "promoted": len(report["promoted"]),
                "compacted": report["compacted"],
                "memories": ", ".join(f"{k} {v}" for k, v in report["memories"].items()),
                "fingerprint": f"sha256:{report['fingerprint']}",
                "snapshot": report["snapshot"],
            }
            for report in reports
        ],
        description=f"Memory maintenance of {len(reports)} users",
    )
    return reports
