"""Helpers shared by the benchmark scripts (run as ``python benchmarks/NAME.py``)."""

from __future__ import annotations

import argparse
import math
import sys


def progress(message: str) -> None:
    """Report progress on stderr, keeping stdout for the results."""
    print(message, file=sys.stderr, flush=True)


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0-1) of ``values``, linearly interpolated."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    low, high = math.floor(pos), math.ceil(pos)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def parse_sizes(text: str) -> list[int]:
    """Parse ``--sizes 1000,10000``: positive and strictly increasing."""
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of integers: {text!r}"
        ) from None
    if not sizes or any(size <= 0 for size in sizes) or sizes != sorted(set(sizes)):
        raise argparse.ArgumentTypeError("sizes must be positive and strictly increasing")
    return sizes
