"""Benchmark: does memory keep up with a person, and how fast is a history ingested?

Run it as ``python benchmarks/memory_over_time.py``.

Part 1 runs the memory-over-time benchmark (``tests/data/memory_time/cases.jsonl``,
see `evaluate_timeline`) per category: the share of checks whose current value
is found first (``new first``), whose first result is an old value (``stale``),
for which an old value is still current somewhere (``stale live``), and of ended
facts still returned (``expired``), with no recency weighed, with retrieval's
default half life (`RECENCY_HALF_LIFE`) and with a 30-day one, side by side.

Part 2 measures ingestion throughput on real conversation logs: the LoCoMo
conversations (``../shared/data/locomo10.json``, ``--data`` to point elsewhere;
skipped, saying so, without it), each turn a `ChatMessage` of its session's
date, the first speaker as the person, cut by `chat_sessions` and ingested with
`ingest_task_history`. Three ways in one run, as ratios of the first:

* ``trajectories only``: `RuleExtractor(read_text=False)` (nothing read out of
  the text: what ingestion did before extraction);
* ``rule extractor``: the default, statements read out of what the person wrote;
* ``+ promote_choices``: the default, then consolidation of repeated choices.

The bar is 1,000 messages a second on two cores for the default.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from _common import progress, recorded

from autopersona_flows.agent.evaluation.timeline import evaluate_timeline, read_timeline_cases
from autopersona_flows.memory import (
    ChatMessage,
    JsonlMemoryStore,
    MemoryUpdater,
    RuleExtractor,
    chat_sessions,
    ingest_task_history,
)
from autopersona_flows.memory.consolidation import promote_choices
from autopersona_flows.memory.encoders import shared_encoder
from autopersona_flows.memory.retrieval import RECENCY_HALF_LIFE

ROOT = Path(__file__).resolve().parent.parent
CASES = ROOT / "tests" / "data" / "memory_time" / "cases.jsonl"
LOCOMO = ROOT.parent / "shared" / "data" / "locomo10.json"
_DATE = re.compile(
    r"(?P<time>\d{1,2}:\d{2} [ap]m) on (?P<day>\d{1,2}) (?P<month>\w+),? (?P<year>\d{4})"
)


def timeline_table() -> None:
    cases = read_timeline_cases(CASES)
    progress(f"{len(cases)} histories from {CASES.relative_to(ROOT)}")
    columns = {
        "no recency": evaluate_timeline(cases),
        f"the default ({RECENCY_HALF_LIFE.days} days)": evaluate_timeline(
            cases, recency_half_life=RECENCY_HALF_LIFE
        ),
        "30 days": evaluate_timeline(cases, recency_half_life=timedelta(days=30)),
    }
    header = f"{'new first':>9} {'stale':>6} {'live':>6} {'expired':>8}"
    print(
        f"memory over time, by recency half life: {' | '.join(columns)} (one block of columns each)"
    )
    print(f"{'category':<10} {'checks':>6} " + "   ".join([header] * len(columns)))
    first = next(iter(columns.values()))
    for name in [*first.categories, "all"]:
        cells = []
        for report in columns.values():
            s = report.overall if name == "all" else report.categories[name]
            expired = "-" if s.expired is None else f"{s.expired:.3f}"
            cells.append(f"{s.new_first:>9.3f} {s.stale:>6.3f} {s.stale_live:>6.3f} {expired:>8}")
        checks = first.overall.checks if name == "all" else first.categories[name].checks
        print(f"{name:<10} {checks:>6} " + "   ".join(cells))
    print()


def _when(text: str) -> datetime:
    match = _DATE.search(text)
    if match is None:
        raise SystemExit(f"cannot read the session date {text!r}")
    parsed = datetime.strptime(
        f"{match['day']} {match['month']} {match['year']} {match['time']}", "%d %B %Y %I:%M %p"
    )
    return parsed.replace(tzinfo=UTC)


def conversations(path: Path) -> list[tuple[str, list[ChatMessage]]]:
    data = json.loads(path.read_text())
    result = []
    for sample in data:
        talk = sample["conversation"]
        person = talk["speaker_a"]
        messages = []
        for key in sorted(k for k in talk if re.fullmatch(r"session_\d+", k)):
            start = _when(talk[f"{key}_date_time"])
            for i, turn in enumerate(talk[key]):
                messages.append(
                    ChatMessage(
                        role="user" if turn["speaker"] == person else "assistant",
                        text=turn["text"],
                        at=start + timedelta(seconds=30 * i),
                    )
                )
        result.append((sample["sample_id"], messages))
    return result


def ingest(talks: list[tuple[str, list[ChatMessage]]], way: str) -> tuple[float, dict[str, int]]:
    extractor = RuleExtractor(read_text=way != "trajectories only")
    counts: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as folder:
        store = JsonlMemoryStore(Path(folder))
        # The model loaded (a worker loads it once), its cache of vectors empty: a later
        # way must not skip the encoding an earlier one paid for.
        encoder = shared_encoder()
        encoder.embed(["warm up"])
        encoder.clear_cache()
        updater = MemoryUpdater(store, encoder)
        started = time.perf_counter()
        for user, messages in talks:
            for session in chat_sessions(user, messages):
                result = ingest_task_history(store, updater, session, extractor=extractor)
                for key, count in result.counts().items():
                    counts[key] = counts.get(key, 0) + count
            if way == "+ promote_choices":
                for decision in promote_choices(updater, user):
                    key = f"persona:{decision.operation}"
                    counts[key] = counts.get(key, 0) + 1
        return time.perf_counter() - started, counts


def throughput_table(path: Path) -> int:
    if not path.exists():
        print(f"ingestion throughput: skipped, no LoCoMo data at {path}")
        return 0
    talks = conversations(path)
    total = sum(len(messages) for _, messages in talks)
    progress(f"{total} messages of {len(talks)} conversations from {path}")
    rows = []
    for way in ("trajectories only", "rule extractor", "+ promote_choices"):
        progress(f"ingesting: {way} ...")
        seconds, counts = ingest(talks, way)
        rows.append((way, seconds, counts))
    base = rows[0][1]
    print(f"ingestion of {total} chat messages  {'msg/s':>8} {'time ratio':>10}  writes")
    for way, seconds, counts in rows:
        summary = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        print(f"{way:<30} {total / seconds:>8.0f} {seconds / base:>9.2f}x  {summary}")
    default = total / rows[1][1]
    print(f"default extractor: {default:.0f} messages/s (bar: 1,000)")
    return 0 if default >= 1000 else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=LOCOMO, help="LoCoMo's locomo10.json")
    args = parser.parse_args()
    timeline_table()
    return throughput_table(args.data)


if __name__ == "__main__":
    sys.exit(recorded("memory_over_time", main))
