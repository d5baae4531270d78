"""What a graph run reports: its typed result, and the tables it leaves in the Prefect UI."""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from prefect.artifacts import create_table_artifact

from autopersona_flows.flows._sync import blocking

__all__ = ["Background", "GraphResult", "RunMetrics", "StepCounter", "write_tables"]


@dataclass
class StepCounter:
    """What a run did, counted as it happens (what came from the cache does not count).

    Attributes:
        decisions: The agent's decisions.
        clarifications: The questions asked.
    """

    decisions: int = 0
    clarifications: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def decided(self) -> None:
        """Count one more decision."""
        with self._lock:
            self.decisions += 1

    def asked(self, count: int) -> None:
        """Count ``count`` more questions."""
        with self._lock:
            self.clarifications += count


@dataclass(frozen=True)
class RunMetrics:
    """What a graph run did.

    Attributes:
        nodes: The graph's nodes.
        decisions: The agent's decisions made (read back from a kept step: none).
        clarifications: The questions asked.
        tool_executions: The tools' executions, retries included (cached: none).
        cache_hits: The nodes whose result came from the cache.
        seconds: The run's time, in its flow body.
    """

    nodes: int
    decisions: int
    clarifications: int
    tool_executions: int
    cache_hits: int
    seconds: float


@dataclass(frozen=True)
class GraphResult:
    """A graph run's result; a flow returns its `dump`.

    Attributes:
        outputs: Each node's tool output, by node.
        decisions: What each node ran with (see `summarise`), by node.
        metrics: What the run did.
    """

    outputs: dict[str, Any]
    decisions: dict[str, dict[str, Any]]
    metrics: RunMetrics

    def dump(self) -> dict[str, Any]:
        """``{"outputs": ..., "decisions": ..., "metrics": {...}}``, plain values."""
        metrics = asdict(self.metrics)
        return {"outputs": self.outputs, "decisions": self.decisions, "metrics": metrics}


def write_tables(decisions: dict[str, dict[str, Any]], operations: list[dict[str, str]]) -> None:
    """The run's ``persona-decisions`` table, and its ``persona-memory-ops`` if memory changed."""
    blocking(create_table_artifact)(  # sync in `apersona_graph` too: a worker thread
        key="persona-decisions",
        table=[
            {
                "node": node_id,
                "action": summary["action"],
                # The answer before its (long) question: in view at 1280 px too.
                "answer": " / ".join(
                    a["answer"] + (" (default: nobody answered)" if a.get("default") else "")
                    for a in summary.get("answers", [])
                ),
                "question": " / ".join(a["question"] for a in summary.get("answers", [])),
                "constraints": "; ".join(c["text"] for c in summary["constraints"]),
                "memory ids": ", ".join(c["memory_id"] for c in summary["constraints"]),
                "scores": ", ".join(str(c["score"]) for c in summary["constraints"]),
            }
            for node_id, summary in decisions.items()
        ],
        description="What the PersonaAgent decided before each node",
    )
    if operations:
        blocking(create_table_artifact)(
            key="persona-memory-ops",
            table=operations,
            description="What this run changed in the person's memory (ids, never contents)",
        )


class Background:
    """``fn(*args)`` in a thread of its own, in the caller's context (its flow run).

    Used as a context manager: the block runs beside it, and leaving the block waits
    for it, whether the block failed or not, so nothing of the run is still being
    written once the run has ended. What it raised is raised there, unless the block
    raised: a node's failure is the run's.
    """

    def __init__(self, fn: Callable[..., None], *args: Any) -> None:
        self._error: BaseException | None = None
        context = contextvars.copy_context()
        self._thread = threading.Thread(
            target=context.run, args=(self._call, fn, *args), name="persona-tables"
        )

    def _call(self, fn: Callable[..., None], *args: Any) -> None:
        try:
            fn(*args)
        except BaseException as exc:  # raised in the caller on leaving the block
            self._error = exc

    def __enter__(self) -> Background:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        self._thread.join()
        if self._error is not None and kind is None:
            raise self._error
