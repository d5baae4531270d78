"""The memory-review flow: one person's memories as a markdown artifact, for them to review."""

from __future__ import annotations

from datetime import UTC, datetime

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact

from autopersona_flows.flows._sync import blocking
from autopersona_flows.flows.runtime import current_runtime
from autopersona_flows.memory.records import LAYERS, MemoryLayer, MemoryRecord
from autopersona_flows.memory.text import memory_text
from autopersona_flows.memory.users import check_user_id

__all__ = ["memory_review", "review_markdown"]

WARNING = (
    "> **Visible to everyone in this Prefect workspace.** Artifacts are not private: "
    "whoever can open this run can read what follows. Correct or erase memories with "
    "`autopersona edit / forget / bury / erase`."
)
_WIDE = 120  # characters of a memory shown in a cell before it is cut


def _cell(text: str) -> str:
    text = " ".join(text.split()).replace("|", "\\|")
    return text if len(text) <= _WIDE else text[: _WIDE - 1] + "…"


def _state(record: MemoryRecord, now: datetime) -> str:
    if record.buried_at is not None:
        return "buried"
    if record.valid_until is not None and record.valid_until <= now:
        return "expired"
    return ""


def review_markdown(user_id: str, records: dict[MemoryLayer, list[MemoryRecord]]) -> str:
    """The review of ``user_id``'s memories: a warning, then a table per layer."""
    now = datetime.now(UTC)
    total = sum(len(layer) for layer in records.values())
    lines = [f"# What is remembered of {_cell(user_id)}", "", WARNING, ""]
    lines.append(f"{total} memories, as of {now:%Y-%m-%d %H:%M} UTC.")
    for layer, layer_records in records.items():
        lines += ["", f"## {layer.capitalize()} ({len(layer_records)})", ""]
        if not layer_records:
            lines.append("Nothing.")
            continue
        lines += ["| id | memory | since (UTC) | state |", "|---|---|---|---|"]
        for record in sorted(layer_records, key=lambda r: r.at, reverse=True):
            what = _cell(memory_text(record.content))
            lines.append(
                f"| `{record.id}` | {what} | {record.at.astimezone(UTC):%Y-%m-%d %H:%M} "
                f"| {_state(record, now)} |"
            )
    return "\n".join(lines)


@flow(name="memory-review")
def memory_review(user_id: str, layers: list[MemoryLayer] | None = None) -> int:
    """Render one person's memories as a markdown artifact (``memory-review``) to review.

    Artifacts are visible to everyone in the workspace, so the artifact says so at
    its top, and the deployment in ``prefect.yaml`` is paused until someone turns it
    on. The logs carry the count only, never contents.

    Args:
        user_id: Whose memories.
        layers: Which layers (every layer by default).

    Returns:
        How many memories the review shows.
    """
    check_user_id(user_id)
    store = current_runtime().bank.store
    records = {layer: store.list(user_id, layer) for layer in layers or LAYERS}
    blocking(create_markdown_artifact)(
        markdown=review_markdown(user_id, records),
        key="memory-review",
        description="The memories of one person, for review (visible to the workspace)",
    )
    total = sum(len(layer) for layer in records.values())
    get_run_logger().info("memory review of %s: %d memories in the artifact", user_id, total)
    return total
