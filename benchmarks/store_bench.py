"""Benchmark: the cost of one durable add as a persona bank grows.

Run it as ``python benchmarks/store_bench.py`` (``--quick`` for a short smoke test,
``--postgres DSN`` to compare `PostgresMemoryStore` as well).

What is measured
----------------
*Ours* is `JsonlMemoryStore`: each ``add`` appends one line to the bank's JSONL log,
flushes and fsyncs it. One user's persona bank is grown in a fresh temporary folder,
one ``store.add(user, PersonaMemory(...))`` at a time, to each checkpoint size
(1k, 10k and 100k records by default). At each checkpoint a sample of further
single adds (``--sample``, 200 by default) is timed one by one with
`time.perf_counter`; those adds count towards the growth. Only the ``add`` call is
timed; building the `PersonaMemory` content is not.

*Rewrite* is the baseline, `RewriteStore`: it mimics the reference runtime, which
on every add loads the whole JSONL file of the bank, appends the new record and
rewrites the whole file, then fsyncs it (the same durability as ours). Growing it
by rewrite-adds would cost O(n^2), so its file is prefilled directly with the same
shape of records and only a few rewrite-adds are timed at each size
(``--rewrite-sample``, 20 by default, a quarter of that at 50k records and more).

Finally ``add_many`` is timed once on a fresh bank (10k records in batches of 500
by default) and its throughput printed beside the single-add throughput; this line
is informative only.

How to read it
--------------
The table gives, per bank size, the median and p95 cost of one of our adds in
microseconds, the median cost of one rewrite-add, and their ratio. Our add should
be dominated by the fsync and stay flat as the bank grows; the rewrite-add grows
linearly with the bank. Two verdict lines follow:

* ``ratio at 10k``: rewrite median / ours median at 10k records; the bar is > 50x.
* ``flatness``: our median at the largest size / our median at the smallest size;
  at most 1.5 counts as flat. The timed adds are made with the bank's saved index
  kept up to date: a `MemoryRetriever` retrieves after every `BankLog.save_every`-th
  (64th) add (untimed in the add; printed as *index upkeep*), which reads the new
  entries and saves the index files (see `docs/retrieval.md`), so the files are never
  more than 64 entries behind. The upkeep is the reader's: an add writes the bank's
  line and nothing else.

The exit code is 1 if either bar is missed, so the script doubles as a check. The
numbers depend on the disk (fsync latency) of the machine that runs it, which is
why only ratios are checked.

PostgreSQL beside JSONL
-----------------------
With ``--postgres DSN`` (default: ``$AUTOPERSONA_TEST_POSTGRES_DSN``) a last section
puts `PostgresMemoryStore` beside a fresh `JsonlMemoryStore`, in a schema created
for the run and dropped at its end (also on failure). Without a database, or
without psycopg, it prints one line saying why it was skipped; the exit code is
then the one above. Measured, always on both stores in the same run:

* *single adds* at 1k and 10k records: both banks are grown with ``add_many``
  (batches of 1,000), then ``--sample`` single adds are timed one by one,
  alternating between the stores (and which one goes first). Median, p95,
  adds/s (sample / time inside ``add``) and the ratio of the medians;
* *add_many*: ``--batch-total`` records in ``--batch-size`` batches into a fresh
  bank, alternating batches; records/s;
* *4 concurrent writers*: four processes (spawned, each with its own store object
  and, for PostgreSQL, its own connection) each make ``--writer-adds`` single adds
  (100 with ``--quick``, 500 otherwise) once all four are ready, first all into one
  user's persona bank, then each into its own user's. The rate is all adds over
  the span from the first start to the last end.

The ratios read "Postgres / JSONL": above 1 means Postgres takes longer (times)
or stores more per second (rates). At the end every bank of both stores is
counted against what was written to it; a store that lost writes is reported
(``FAIL``) and sets the exit code to 1. No other number here sets the exit code.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import queue
import random
import statistics
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import orjson
from _common import (
    BACKENDS,
    NAMES,
    PostgresSkipped,
    add_postgres_argument,
    alternating,
    close_store,
    open_store,
    parse_sizes,
    percentile,
    postgres_schema,
    print_skipped,
    progress,
    recorded,
)

from autopersona_flows.memory.embedders import HashingEmbedder
from autopersona_flows.memory.jsonl import JsonlMemoryStore
from autopersona_flows.memory.persisted import BankLog
from autopersona_flows.memory.protocol import MemoryStore
from autopersona_flows.memory.records import MemoryRecord, PersonaMemory
from autopersona_flows.memory.retrieval import MemoryRetriever, SearchRequest

USER = "bench-user"
DEFAULT_SIZES = (1_000, 10_000, 100_000)
QUICK_SIZES = (1_000, 10_000)
RATIO_SIZE = 10_000
RATIO_BAR = 50.0
FLAT_BAR = 1.5
LARGE_SIZE = 50_000  # from this size on, the rewrite sample is cut to a quarter

_TOPICS = (
    "citation style", "meeting times", "code review", "email tone", "travel", "diet",
    "reading list", "writing voice", "deadlines", "notifications", "file naming",
    "spreadsheet layout", "programming language", "test coverage", "slide decks",
    "time zone", "budget reports", "summaries", "data privacy", "accessibility",
)  # fmt: skip
_WORDS = (
    "prefers", "always", "never", "short", "detailed", "bullet", "points", "APA",
    "morning", "afternoon", "async", "calls", "Python", "typed", "concise", "formal",
    "friendly", "weekly", "digest", "drafts", "first", "then", "ask", "before", "sending",
    "keep", "under", "one", "page", "with", "sources", "links", "metric", "units",
    "dark", "mode", "plain", "text", "no", "emoji", "tables", "over", "prose", "CSV",
)  # fmt: skip


# -- content -------------------------------------------------------------------------------


def _text(rng: random.Random, lo: int, hi: int, head: str = "") -> str:
    """Words from the vocabulary, between ``lo`` and ``hi`` characters long."""
    target = rng.randint(lo, hi)
    text = head or rng.choice(_WORDS)
    while len(text) < target:
        text = f"{text} {rng.choice(_WORDS)}"
    return text[:hi].rstrip()


def persona_contents(seed: int) -> Iterator[PersonaMemory]:
    """Yield an endless stream of small, varied persona memories (20-80 character fields)."""
    rng = random.Random(seed)
    n = 0
    while True:
        n += 1
        yield PersonaMemory(
            topic=_text(rng, 20, 40, f"{rng.choice(_TOPICS)} #{n}"),
            preference=_text(rng, 20, 80),
            strategy=_text(rng, 20, 80),
        )


# -- the baseline --------------------------------------------------------------------------


class RewriteStore:
    """The reference runtime's strategy: every add rewrites the whole bank file.

    This mimics the reference runtime's whole-file rewrite. On each `add` it reads
    the bank's entire JSONL file, parses every line, appends the new record,
    serializes every record again and writes the whole file back, then fsyncs it
    before returning: the same durability per add as `JsonlMemoryStore`. It is the
    cheap variant of that strategy (orjson on plain dicts, no model validation, no
    locks, an in-place rewrite rather than a temporary file and a rename), so the
    ratio it yields is a lower bound.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.count = 0
        self.path.touch()

    def prefill(self, records: list[MemoryRecord]) -> None:
        """Append ``records`` to the file directly, without the per-add rewrite."""
        with self.path.open("ab") as file:
            file.writelines(record.model_dump_json().encode() + b"\n" for record in records)
        self.count += len(records)

    def add(self, item: MemoryRecord | PersonaMemory) -> MemoryRecord:
        """Load the whole bank, append ``item``, rewrite the file and fsync it."""
        record = item if isinstance(item, MemoryRecord) else MemoryRecord.of(item)
        entries: list[Any] = [orjson.loads(line) for line in self.path.read_bytes().splitlines()]
        entries.append(record.model_dump(mode="json"))
        data = b"".join(orjson.dumps(entry) + b"\n" for entry in entries)
        fd = os.open(self.path, os.O_WRONLY | os.O_TRUNC)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        self.count = len(entries)
        return record


# -- measuring -----------------------------------------------------------------------------


def time_adds(
    add: Callable[[PersonaMemory], object], contents: Iterator[PersonaMemory], n: int
) -> list[float]:
    """Run ``n`` adds, timing each call alone; return the costs in microseconds."""
    costs = []
    for _ in range(n):
        content = next(contents)
        start = time.perf_counter()
        add(content)
        costs.append((time.perf_counter() - start) * 1e6)
    return costs


@dataclass
class Row:
    size: int
    ours: list[float]
    rewrite: list[float]
    upkeep: list[float] = field(default_factory=list)  # ms: the retrieve after each timed add

    @property
    def ours_median(self) -> float:
        return statistics.median(self.ours)

    @property
    def rewrite_median(self) -> float:
        return statistics.median(self.rewrite)

    @property
    def ratio(self) -> float:
        return self.rewrite_median / self.ours_median


@dataclass
class Growth:
    """Single adds made to grow our bank: how many, and the time spent inside ``add``."""

    adds: int = 0
    seconds: float = 0.0
    rows: list[Row] = field(default_factory=list)


def run(sizes: list[int], sample: int, rewrite_sample: int, seed: int, root: Path) -> Growth:
    """Grow our bank and prefill the baseline to each size, timing a sample at each."""
    store = JsonlMemoryStore(root / "ours")
    baseline = RewriteStore(root / "rewrite.jsonl")
    ours_contents = persona_contents(seed)
    baseline_contents = persona_contents(seed + 1)
    growth = Growth()
    count = 0

    # A retriever reads the bank after every `BankLog.save_every`-th timed add: each read
    # brings its index up to date and saves the index files, so the adds are timed with
    # the files never more than that many entries behind the bank.
    retriever = MemoryRetriever(store, HashingEmbedder())
    search = [SearchRequest(layer="persona", query="email tone, bullet points")]
    upkeep: list[float] = []

    def add_then_read(content: PersonaMemory) -> None:
        start = time.perf_counter()
        store.add(USER, content)
        middle = time.perf_counter()
        costs.append((middle - start) * 1e6)
        if len(costs) % BankLog.save_every == 0:
            retriever.retrieve(USER, search)
            upkeep.append((time.perf_counter() - middle) * 1e3)

    for size in sizes:
        progress(f"growing our bank from {count:,} to {size:,} records ...")
        while count < size:
            content = next(ours_contents)
            start = time.perf_counter()
            store.add(USER, content)
            growth.seconds += time.perf_counter() - start
            count += 1
        progress(f"  bringing the index up to date at {size:,} records (saved beside the bank) ...")
        retriever.retrieve(USER, search)
        costs: list[float] = []
        upkeep.clear()
        for _ in range(sample):
            add_then_read(next(ours_contents))
        ours = costs
        count += sample
        growth.adds = count
        growth.seconds += sum(ours) / 1e6

        missing = size - baseline.count
        progress(f"prefilling the rewrite baseline with {missing:,} records ...")
        baseline.prefill([MemoryRecord.of(next(baseline_contents)) for _ in range(missing)])
        n = rewrite_sample if size < LARGE_SIZE else max(1, rewrite_sample // 4)
        progress(f"timing {n} rewrite-adds at {size:,} records ...")
        rewrite = time_adds(baseline.add, baseline_contents, n)
        growth.rows.append(Row(size, ours, rewrite, list(upkeep)))

    assert len(store.list(USER, "persona")) == count
    return growth


def add_many_rate(total: int, batch: int, seed: int, root: Path) -> float:
    """Records per second stored by ``add_many`` into a fresh bank, in batches."""
    store = JsonlMemoryStore(root / "batched")
    contents = persona_contents(seed)
    seconds = 0.0
    for done in range(0, total, batch):
        items = [next(contents) for _ in range(min(batch, total - done))]
        start = time.perf_counter()
        store.add_many(USER, "persona", items)
        seconds += time.perf_counter() - start
    assert len(store.list(USER, "persona")) == total
    return total / seconds


# -- report --------------------------------------------------------------------------------


def report(growth: Growth, batched: float, batch_total: int, batch_size: int) -> int:
    """Print the table and the verdicts; return the exit code."""
    header = (
        f"{'size':>9} | {'ours median µs':>14} | {'ours p95 µs':>11} | "
        f"{'rewrite median µs':>17} | {'ratio':>7}"
    )
    print(header)
    print("-" * len(header))
    for row in growth.rows:
        print(
            f"{row.size:>9,} | {row.ours_median:>14,.0f} | {percentile(row.ours, 0.95):>11,.0f} | "
            f"{row.rewrite_median:>17,.0f} | {row.ratio:>6,.0f}x"
        )
    print(
        f"samples: ours {len(growth.rows[0].ours)} adds per size; rewrite "
        + ", ".join(f"{len(row.rewrite)} at {row.size:,}" for row in growth.rows)
    )
    print(
        f"index upkeep: a retrieve after every {BankLog.save_every}th timed add (not in the "
        "add's time) reads the new entries and saves the index files:"
    )
    for row in growth.rows:
        print(
            f"{row.size:>9,}: retrieve + save p50 {statistics.median(row.upkeep):.1f} ms, "
            f"max {max(row.upkeep):.1f} ms ({len(row.upkeep)} saves)"
        )
    print()
    single = growth.adds / growth.seconds
    print(f"add, one at a time:  {single:>9,.0f} records/s ({growth.adds:,} adds)")
    print(
        f"add_many, by {batch_size}:    {batched:>9,.0f} records/s "
        f"({batch_total:,} records; {batched / single:,.0f}x the single-add rate)"
    )
    print()

    failed = False
    by_size = {row.size: row for row in growth.rows}
    if RATIO_SIZE in by_size:
        ratio = by_size[RATIO_SIZE].ratio
        ok = ratio > RATIO_BAR
        failed |= not ok
        verdict = "ok" if ok else "FAIL"
        print(f"ratio at 10k: {ratio:,.0f}x (bar: > {RATIO_BAR:.0f}x) {verdict}")
    else:
        print("ratio at 10k: not measured (10000 is not among --sizes)")
    first, last = growth.rows[0], growth.rows[-1]
    if last.size > first.size:
        flat = last.ours_median / first.ours_median
        ok = flat <= FLAT_BAR
        failed |= not ok
        verdict = "flat" if ok else "NOT flat"
        print(
            f"flatness: our median at {last.size:,} / at {first.size:,} = {flat:.2f}, with the "
            f"index files kept up to date (bar: <= {FLAT_BAR:.1f}) {verdict}"
        )
    return 1 if failed else 0


# -- PostgreSQL beside JSONL ----------------------------------------------------------------

PG_SIZES = (1_000, 10_000)
FILL_BATCH = 1_000
WRITERS = 4
WRITER_BARRIER_TIMEOUT = 120.0  # seconds: every writer opens its store before any adds
BATCHED_USER = "bench-batched"
SHARED_WRITER = "bench-writers"


def grow(store: MemoryStore, contents: Iterator[PersonaMemory], n: int) -> None:
    """Add ``n`` records to our user's persona bank with ``add_many``, in batches."""
    for done in range(0, n, FILL_BATCH):
        batch = [next(contents) for _ in range(min(FILL_BATCH, n - done))]
        store.add_many(USER, "persona", batch)


@dataclass(frozen=True)
class WriterJob:
    """What one writer process does: ``adds`` single adds for ``user`` into a new store."""

    backend: str
    target: str
    user: str
    adds: int
    seed: int


def _writer(job: WriterJob, barrier: Any, results: Any) -> None:
    """One writer process: open its store, wait until all are ready, then add one by one.

    Puts ``(start, end, None)`` on ``results``, or ``(0, 0, traceback)`` if it failed.
    """
    try:
        store = open_store(job.backend, job.target)
        contents = persona_contents(job.seed)
        items = [next(contents) for _ in range(job.adds)]
        store.list(job.user, "persona")  # connect (and set up the schema) before the clock
        barrier.wait(WRITER_BARRIER_TIMEOUT)
        # time.monotonic is CLOCK_MONOTONIC: one clock for every process on the machine.
        start = time.monotonic()
        for item in items:
            store.add(job.user, item)
        end = time.monotonic()
        close_store(store)
        results.put((start, end, None))
    except BaseException:
        barrier.abort()  # the others stop waiting for this one
        results.put((0.0, 0.0, traceback.format_exc()))


def run_writers(jobs: list[WriterJob]) -> float:
    """Run each job in its own process, all at once; return the total adds per second.

    The rate is all adds over the span from the first writer's start to the last one's end.
    """
    context = multiprocessing.get_context("spawn")  # no inherited connections or locks
    barrier = context.Barrier(len(jobs))
    results = context.Queue()
    processes = [context.Process(target=_writer, args=(job, barrier, results)) for job in jobs]
    for process in processes:
        process.start()
    spans = []
    try:
        while len(spans) < len(processes):
            try:
                start, end, error = results.get(timeout=1.0)
            except queue.Empty:
                dead = [p.exitcode for p in processes if p.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeError(f"a writer process died (exit code {dead[0]})") from None
                continue
            if error:
                raise RuntimeError(f"a writer process failed:\n{error}")
            spans.append((start, end))
    finally:
        for process in processes:
            process.join(timeout=10.0)
            if process.is_alive():
                process.terminate()
                process.join()
    seconds = max(end for _, end in spans) - min(start for start, _ in spans)
    return sum(job.adds for job in jobs) / seconds


@dataclass
class PostgresRun:
    """The PostgreSQL section's measurements; the innermost dicts are keyed by backend."""

    where: str
    singles: dict[int, dict[str, list[float]]] = field(default_factory=dict)  # size -> µs
    batched: dict[str, float] = field(default_factory=dict)  # records/s
    writers: dict[str, dict[str, float]] = field(default_factory=dict)  # variant -> adds/s
    counts: dict[str, tuple[int, int]] = field(default_factory=dict)  # (present, written)


def time_single_adds(
    stores: dict[str, MemoryStore], contents: dict[str, Iterator[PersonaMemory]], sample: int
) -> dict[int, dict[str, list[float]]]:
    """Grow each bank to each of `PG_SIZES`, then time ``sample`` adds, alternating stores."""
    singles = {}
    count = 0
    for size in PG_SIZES:
        progress(f"postgres section: growing both banks to {size:,} records with add_many ...")
        for name, store in stores.items():
            grow(store, contents[name], size - count)
        progress(f"postgres section: timing {sample} single adds each at {size:,} ...")
        costs: dict[str, list[float]] = {name: [] for name in stores}
        for i in range(sample):
            for name, store in alternating(stores, i):
                costs[name] += time_adds(partial(store.add, USER), contents[name], 1)
        singles[size] = costs
        count = size + sample
    return singles


def time_add_many(
    stores: dict[str, MemoryStore],
    contents: dict[str, Iterator[PersonaMemory]],
    total: int,
    batch_size: int,
) -> dict[str, float]:
    """Records per second stored by ``add_many`` into a fresh bank, alternating stores."""
    progress(f"postgres section: add_many, {total:,} records in batches of {batch_size} ...")
    seconds = dict.fromkeys(stores, 0.0)
    for i, done in enumerate(range(0, total, batch_size)):
        n = min(batch_size, total - done)
        for name, store in alternating(stores, i):
            items = [next(contents[name]) for _ in range(n)]
            start = time.perf_counter()
            store.add_many(BATCHED_USER, "persona", items)
            seconds[name] += time.perf_counter() - start
    return {name: total / spent for name, spent in seconds.items()}


def compare_postgres(
    dsn: str,
    where: str,
    folder: Path,
    *,
    sample: int,
    batch_total: int,
    batch_size: int,
    writer_adds: int,
    seed: int,
) -> PostgresRun:
    """Measure JSONL and PostgreSQL side by side, then count every record either was given."""
    targets = {"jsonl": str(folder), "postgres": dsn}
    stores = {name: open_store(name, target) for name, target in targets.items()}
    contents = {name: persona_contents(seed + 10 + i) for i, name in enumerate(BACKENDS)}
    written: dict[str, Counter[str]] = {name: Counter() for name in BACKENDS}
    run = PostgresRun(where)
    try:
        run.singles = time_single_adds(stores, contents, sample)
        run.batched = time_add_many(stores, contents, batch_total, batch_size)
        for name in BACKENDS:
            written[name][USER] = PG_SIZES[-1] + sample
            written[name][BATCHED_USER] = batch_total

        variants = {
            "one user, one layer": [SHARED_WRITER] * WRITERS,
            f"{WRITERS} users, one each": [f"bench-writer-{i}" for i in range(WRITERS)],
        }
        for variant, users in variants.items():
            run.writers[variant] = {}
            for name in BACKENDS:
                progress(f"postgres section: {WRITERS} {name} writer processes, {variant} ...")
                jobs = [
                    WriterJob(name, targets[name], user, writer_adds, seed + 100 + i)
                    for i, user in enumerate(users)
                ]
                run.writers[variant][name] = run_writers(jobs)
                for user in users:
                    written[name][user] += writer_adds

        for name, store in stores.items():
            present = sum(len(store.list(user, "persona")) for user in written[name])
            run.counts[name] = (present, sum(written[name].values()))
    finally:
        for store in stores.values():
            close_store(store)
    return run


def report_postgres(run: PostgresRun, *, batch_size: int, writer_adds: int) -> int:
    """Print the PostgreSQL section; return 1 if a store lost (or invented) records."""
    print()
    print(f"PostgreSQL beside JSONL ({run.where}, in a fresh schema)")
    print(
        "single adds: both banks grown with add_many, then single adds timed one by one, "
        "alternating between the stores"
    )
    header = (
        f"{'size':>9} | {'JSONL median µs':>15} | {'JSONL p95 µs':>12} | {'JSONL adds/s':>12} | "
        f"{'PG median µs':>12} | {'PG p95 µs':>9} | {'PG adds/s':>9} | {'PG/JSONL time':>13}"
    )
    print(header)
    print("-" * len(header))
    for size, costs in run.singles.items():
        jsonl, pg = costs["jsonl"], costs["postgres"]
        print(
            f"{size:>9,} | {statistics.median(jsonl):>15,.0f} | "
            f"{percentile(jsonl, 0.95):>12,.0f} | {len(jsonl) * 1e6 / sum(jsonl):>12,.0f} | "
            f"{statistics.median(pg):>12,.0f} | "
            f"{percentile(pg, 0.95):>9,.0f} | {len(pg) * 1e6 / sum(pg):>9,.0f} | "
            f"{statistics.median(pg) / statistics.median(jsonl):>12.1f}x"
        )
    samples = len(next(iter(run.singles.values()))["jsonl"])
    print(f"samples: {samples} adds per size and store; PG/JSONL time: ratio of the medians")
    print()
    jsonl, pg = run.batched["jsonl"], run.batched["postgres"]
    print(
        f"add_many, by {batch_size}: JSONL {jsonl:,.0f} records/s, Postgres {pg:,.0f} records/s "
        f"(PG/JSONL rate {pg / jsonl:.2f}x)"
    )
    print()
    print(
        f"{WRITERS} concurrent writer processes (spawned; each its own store object), "
        f"{writer_adds:,} single adds each, persona layer (one writer: adds/s above):"
    )
    header = (
        f"{'writers':>20} | {'JSONL adds/s':>12} | {'Postgres adds/s':>15} | {'PG/JSONL rate':>13}"
    )
    print(header)
    print("-" * len(header))
    for variant, rates in run.writers.items():
        jsonl, pg = rates["jsonl"], rates["postgres"]
        print(f"{variant:>20} | {jsonl:>12,.0f} | {pg:>15,.0f} | {pg / jsonl:>12.2f}x")
    print()
    lost = False
    for name, (present, expected) in run.counts.items():
        missing = expected - present
        lost |= missing != 0
        verdict = "ok"
        if missing > 0:
            verdict = f"FAIL: {missing:,} writes lost"
        elif missing < 0:
            verdict = f"FAIL: {-missing:,} more records than written"
        print(f"records present, {NAMES[name]}: {present:,} of {expected:,} written {verdict}")
    return 1 if lost else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Time one durable add as a persona bank grows, against a whole-file rewrite."
    )
    parser.add_argument(
        "--sizes",
        type=parse_sizes,
        default=None,
        help="comma-separated bank sizes (default: 1000,10000,100000)",
    )
    parser.add_argument("--sample", type=int, default=None, help="our timed adds per size (200)")
    parser.add_argument(
        "--rewrite-sample",
        type=int,
        default=None,
        help=f"timed rewrite-adds per size (20; a quarter of it from {LARGE_SIZE:,} records)",
    )
    parser.add_argument(
        "--batch-total", type=int, default=None, help="records stored by add_many (10000)"
    )
    parser.add_argument("--batch-size", type=int, default=500, help="add_many batch size (500)")
    parser.add_argument(
        "--writer-adds",
        type=int,
        default=None,
        help=f"single adds by each of the {WRITERS} writer processes in the PostgreSQL section "
        "(500; 100 with --quick)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated contents")
    parser.add_argument(
        "--quick", action="store_true", help="smoke test: sizes 1000,10000 and small samples"
    )
    add_postgres_argument(parser)
    args = parser.parse_args(argv)

    sizes = args.sizes or list(QUICK_SIZES if args.quick else DEFAULT_SIZES)
    sample = args.sample or (50 if args.quick else 200)
    rewrite_sample = args.rewrite_sample or (5 if args.quick else 20)
    batch_total = args.batch_total or (2_000 if args.quick else 10_000)
    writer_adds = args.writer_adds or (100 if args.quick else 500)
    if min(sample, rewrite_sample, batch_total, args.batch_size, writer_adds) < 1:
        parser.error("samples, --batch-total, --batch-size and --writer-adds must be positive")

    with tempfile.TemporaryDirectory(prefix="store-bench-") as tmp:
        root = Path(tmp)
        growth = run(sizes, sample, rewrite_sample, args.seed, root)
        progress(f"timing add_many: {batch_total:,} records in batches of {args.batch_size} ...")
        batched = add_many_rate(batch_total, args.batch_size, args.seed + 2, root)
    code = report(growth, batched, batch_total, args.batch_size)

    # The PostgreSQL section comes after the verdicts above; only lost writes add to the exit code.
    try:
        with (
            postgres_schema(args.postgres, "store_bench") as (dsn, where),
            tempfile.TemporaryDirectory(prefix="store-bench-pg-") as tmp,
        ):
            run_pg = compare_postgres(
                dsn,
                where,
                Path(tmp),
                sample=sample,
                batch_total=batch_total,
                batch_size=args.batch_size,
                writer_adds=writer_adds,
                seed=args.seed,
            )
    except PostgresSkipped as reason:
        print()
        print_skipped(reason)
        return code
    return max(code, report_postgres(run_pg, batch_size=args.batch_size, writer_adds=writer_adds))


if __name__ == "__main__":
    sys.exit(recorded("store_bench", main))
