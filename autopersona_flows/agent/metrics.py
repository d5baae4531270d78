"""Runtime metrics of the PersonaAgent: counters and timings, safe across threads."""

from __future__ import annotations

import statistics
import threading
from collections import Counter, defaultdict
from typing import Any

__all__ = ["RuntimeMetrics"]


class RuntimeMetrics:
    """Counts decisions and times their parts.

    Counters: ``decisions``, ``finals``, ``clarifications``, ``learned_answers``
    (and ``policy_errors``). Timings, in seconds: ``retrieval`` and ``policy``.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._timings: defaultdict[str, list[float]] = defaultdict(list)

    def __repr__(self) -> str:
        return f"RuntimeMetrics({dict(self._counts)})"

    def count(self, name: str, amount: int = 1) -> None:
        """Add ``amount`` to the counter ``name``."""
        with self._lock:
            self._counts[name] += amount

    def time(self, name: str, seconds: float) -> None:
        """Record one duration under ``name``."""
        with self._lock:
            self._timings[name].append(seconds)

    def snapshot(self) -> dict[str, Any]:
        """Return the counters and, per timing, its count, total, mean, p50 and max (JSON)."""
        with self._lock:
            counts = dict(self._counts)
            timings = {name: list(values) for name, values in self._timings.items()}
        return {
            "counts": {name: counts.get(name, 0) for name in _COUNTERS} | counts,
            "timings": {
                name: {
                    "count": len(values),
                    "total_s": sum(values),
                    "mean_s": statistics.fmean(values),
                    "p50_s": statistics.median(values),
                    "max_s": max(values),
                }
                for name, values in timings.items()
            },
        }


_COUNTERS = ("decisions", "finals", "clarifications", "learned_answers")
