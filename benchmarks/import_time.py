"""Benchmark: what importing each layer of autopersona-flows costs, beside importing its floor.

Run it as ``python benchmarks/import_time.py`` (``--quick`` for 7 rounds), and with
``--against TREE`` to measure another checkout side by side in the same run, e.g. the
code before a change: ``git worktree add /tmp/before HEAD~3`` (or
``git archive HEAD~3 autopersona_flows | tar -x -C /tmp/before``), then
``python benchmarks/import_time.py --against /tmp/before``.

What is measured
----------------
Each import runs in a fresh interpreter (``python -P -c``, this Python, the tree on
``PYTHONPATH``, started in an empty folder so nothing else is found first) that
times the import statement alone with `time.perf_counter`; the interpreter's own
start-up is left out. The statements:

* the *floor*, ``import pydantic, numpy``: what the memory layer's records are
  built on, so no import of the layer that uses them can cost less;
* ``import autopersona_flows.memory``, ``import autopersona_flows``,
  ``import autopersona_flows.agent`` and ``import autopersona_flows.flows``;
* *memory, first use*: ``from autopersona_flows.memory import JsonlMemoryStore,
  MemoryRetriever, MemoryUpdater``, what a user of the memory layer imports first.
  The package imports a name's module on first use, so this, not the bare import,
  is what such a user pays.

Every statement (and tree) runs once unmeasured, then ``--rounds`` times (11),
round-robin, in the order reversed every other round, so a busy spell of the
machine falls on all of them alike. The unmeasured run compiles the bytecode, into
a temporary folder (``PYTHONPYCACHEPREFIX``; ``PYTHONDONTWRITEBYTECODE`` is lifted
for these interpreters), so compiling is never timed, as for an installed package.

How to read it
--------------
The table gives the median milliseconds of each import, its interquartile range,
and the median as a multiple of the floor's median (the floor of the same tree's
run, i.e. of the same interpreter and moment). With ``--against``, the other
tree's medians follow, with the ratio of the two (above 1: this tree is faster).
Absolute times depend on the machine and its load; the first line prints the CPU
count and the load average. The exit code is 1 if ``import autopersona_flows.memory``
takes more than ``--bar`` milliseconds (150) at the median in this tree.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import alternating, percentile, progress, recorded

ROOT = Path(__file__).resolve().parent.parent
FLOOR = "pydantic, numpy (floor)"
STATEMENTS = {
    FLOOR: "import pydantic, numpy",
    "autopersona_flows.memory": "import autopersona_flows.memory",
    "memory, first use": (
        "from autopersona_flows.memory import JsonlMemoryStore, MemoryRetriever, MemoryUpdater"
    ),
    "autopersona_flows": "import autopersona_flows",
    "autopersona_flows.agent": "import autopersona_flows.agent",
    "autopersona_flows.flows": "import autopersona_flows.flows",
}
TIMED = "import time\nstarted = time.perf_counter()\n{}\nprint(time.perf_counter() - started)\n"


def time_import(statement: str, tree: Path, folder: str) -> float:
    """Milliseconds ``statement`` takes in a fresh interpreter that finds ``tree`` first."""
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONPYCACHEPREFIX": f"{folder}/pycache"}
    for name in ("PYTHONDONTWRITEBYTECODE", "PYTHONSTARTUP"):
        env.pop(name, None)
    done = subprocess.run(
        [sys.executable, "-P", "-c", TIMED.format(statement)],
        capture_output=True,
        text=True,
        cwd=folder,
        env=env,
        timeout=300,
        check=True,
    )
    return float(done.stdout.strip().splitlines()[-1]) * 1000


def measure(trees: dict[str, Path], rounds: int) -> dict[tuple[str, str], list[float]]:
    """Times per (tree, statement), round-robin over every pair, after one unmeasured run."""
    pairs = {(t, s): (trees[t], STATEMENTS[s]) for t in trees for s in STATEMENTS}
    times: dict[tuple[str, str], list[float]] = {pair: [] for pair in pairs}
    with tempfile.TemporaryDirectory() as folder:
        for tree, statement in pairs.values():
            time_import(statement, tree, folder)
        for i in range(rounds):
            progress(f"round {i + 1} of {rounds} ...")
            for pair, (tree, statement) in alternating(pairs, i):
                times[pair].append(time_import(statement, tree, folder))
    return times


def check_tree(path: Path) -> Path:
    if not (path / "autopersona_flows" / "__init__.py").is_file():
        raise argparse.ArgumentTypeError(f"{path} holds no autopersona_flows package")
    return path.resolve()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=None, help="timed runs per import (11)")
    parser.add_argument("--quick", action="store_true", help="7 rounds")
    parser.add_argument(
        "--against",
        type=lambda text: check_tree(Path(text)),
        metavar="TREE",
        help="another checkout (a folder holding autopersona_flows/) to measure beside this one",
    )
    parser.add_argument("--bar", type=float, default=150.0, help="ms for the memory import")
    args = parser.parse_args(argv)
    rounds = args.rounds or (7 if args.quick else 11)
    trees = {"this": ROOT} | ({"against": args.against} if args.against else {})

    print(
        f"cpus: {os.cpu_count()}, load average: {os.getloadavg()[0]:.2f}; "
        f"python {sys.version.split()[0]}; this tree: {ROOT}"
        + (f"; against: {args.against}" if args.against else "")
    )
    times = measure(trees, rounds)

    def median(tree: str, name: str) -> float:
        return percentile(times[tree, name], 0.5)

    print()
    print(f"== import in a fresh interpreter, ms (median of {rounds}, interleaved)")
    header = f"{'import':26} | {'median':>7} {'q25-q75':>13} {'x floor':>7}"
    if args.against:
        header += f" | {'against':>7} {'x floor':>7} | {'against/this':>12}"
    print(header)
    for name in STATEMENTS:
        values = times["this", name]
        spread = f"{percentile(values, 0.25):.0f}-{percentile(values, 0.75):.0f}"
        row = f"{name:26} | {median('this', name):7.1f} {spread:>13} "
        row += f"{median('this', name) / median('this', FLOOR):6.2f}x"
        if args.against:
            other = median("against", name)
            row += f" | {other:7.1f} {other / median('against', FLOOR):6.2f}x"
            row += f" | {other / median('this', name):11.2f}x"
        print(row)

    memory = median("this", "autopersona_flows.memory")
    ok = memory <= args.bar
    print()
    print(
        f"import autopersona_flows.memory: {memory:.1f} ms at the median "
        f"(bar: <= {args.bar:.0f} ms) {'ok' if ok else 'MISSED'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(recorded("import_time", main))
