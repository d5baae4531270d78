"""Durability of the JSONL store with real files, real processes and real kills.

Nothing is mocked: child processes run the store through ``sys.executable -c`` with
the small scripts below, get SIGKILLed mid-write, and race each other on one bank.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import orjson
import pytest

from autopersona_flows.errors import MemoryNotFoundError
from autopersona_flows.memory import (
    JsonlMemoryStore,
    MemoryChange,
    MemoryRecord,
    MemorySnapshot,
    PersonaMemory,
)
from autopersona_flows.memory._histories import History
from autopersona_flows.memory.users import user_key

USER = "durable-dana"
TIMEOUT = 60  # seconds a child may take for one step; reached only when something hangs

# -- child scripts -------------------------------------------------------------------------

# After "go", appends forever: single adds alternating with batches of 2..20 records that
# share a topic; each record's preference says "index/size". Once a call has returned it
# prints the call number and the ids it got back: whatever is printed must survive a kill.
CRASH_CHILD = """
import random, sys, time
from autopersona_flows.memory import JsonlMemoryStore, PersonaMemory

root, user, run = sys.argv[1], sys.argv[2], int(sys.argv[3])
if sys.stdin.readline() != "go\\n":
    sys.exit()
rng = random.Random(run)
store = JsonlMemoryStore(root)
store.list(user, "persona")  # parse the bank first, so the kill lands among the writes
print("started", flush=True)
n = 0
while True:
    n += 1
    if n % 2:
        record = store.add(user, PersonaMemory(topic=f"single-{run}-{n}", preference="0/1"))
        print(n, record.id, flush=True)
    else:
        size = rng.randint(2, 20)
        batch = [
            PersonaMemory(topic=f"batch-{run}-{n}", preference=f"{i}/{size}", strategy="x" * 500)
            for i in range(size)
        ]
        records = store.add_many(user, "persona", batch)
        print(n, *(r.id for r in records), flush=True)
    time.sleep(rng.random() / 1000)  # a pause of up to 1 ms keeps each round's bank small
"""

# After "go", keeps the bank small with adds and deletes (of anything live) under a tiny
# compaction threshold, so many kills land in a compaction. Acknowledges each call.
COMPACT_CRASH_CHILD = """
import random, sys, time
from autopersona_flows.memory import JsonlMemoryStore, PersonaMemory

JsonlMemoryStore.compact_min_dead = 4
root, user, run = sys.argv[1], sys.argv[2], int(sys.argv[3])
if sys.stdin.readline() != "go\\n":
    sys.exit()
rng = random.Random(run)
store = JsonlMemoryStore(root)
live = [r.id for r in store.list(user, "persona")]
print("started", flush=True)
while True:
    if len(live) > 12 or (live and rng.random() < 0.45):
        memory_id = live.pop(rng.randrange(len(live)))
        store.delete(user, "persona", memory_id)
        print("del", memory_id, flush=True)
    else:
        live.append(store.add(user, PersonaMemory(topic=f"churn-{run}", preference="0/1")).id)
        print("add", live[-1], flush=True)
"""

# After "go", appends `count` records named NAME-0.. (adds and batches of 2..5) and prints
# the ids it got back as JSON.
APPEND_CHILD = """
import json, random, sys
from autopersona_flows.memory import JsonlMemoryStore, PersonaMemory

root, user, name, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
rng = random.Random(name)
store = JsonlMemoryStore(root)
print("ready", flush=True)
if sys.stdin.readline() != "go\\n":
    sys.exit()
ids = []
while len(ids) < count:
    size = min(count - len(ids), rng.choice([1, 1, 2, 3, 5]))
    items = [PersonaMemory(topic=f"{name}-{len(ids) + k}", preference="p") for k in range(size)]
    if size == 1:
        ids.append(store.add(user, items[0]).id)
    else:
        ids.extend(r.id for r in store.add_many(user, "persona", items))
print(json.dumps(ids), flush=True)
"""

# After "go", adds, updates and deletes its own records on the shared bank with a tiny
# compaction threshold, so compactions by any process land between everyone's writes.
# Every 10 steps it checks its own records in a listing. Prints what it did as JSON.
CHURN_CHILD = """
import json, random, sys
from autopersona_flows.memory import JsonlMemoryStore, PersonaMemory

JsonlMemoryStore.compact_min_dead = 8
root, user, name, steps, bank = sys.argv[1:6]
rng = random.Random(name)
store = JsonlMemoryStore(root)
expected, deleted, updates, generations = {}, [], {}, set()
print("ready", flush=True)
if sys.stdin.readline() != "go\\n":
    sys.exit()
for step in range(int(steps)):
    with open(bank, "rb") as file:
        generations.add(json.loads(file.readline())["generation"])
    mine, roll = sorted(expected), rng.random()
    if len(mine) > 2 and roll < 0.35:
        memory_id, pref = rng.choice(mine), f"{name}-v{step}"
        store.update(user, "persona", memory_id, PersonaMemory(topic=name, preference=pref))
        expected[memory_id] = pref
        updates[memory_id] = updates.get(memory_id, 0) + 1
    elif len(mine) > 2 and roll < (0.75 if len(mine) > 12 else 0.5):
        memory_id = rng.choice(mine)
        store.delete(user, "persona", memory_id)
        del expected[memory_id]
        deleted.append(memory_id)
    else:
        items = [PersonaMemory(topic=name, preference=f"{name}-new{step}")] * rng.choice([1, 3])
        added = store.add_many(user, "persona", items)
        expected.update((r.id, r.content.preference) for r in added)
    if step % 10 == 0:
        seen = {r.id: r.content.preference for r in store.list(user, "persona")}
        wrong = {k: (v, seen.get(k)) for k, v in expected.items() if seen.get(k) != v}
        assert not wrong, f"step {step}: own records missing or stale: {wrong}"
print(json.dumps({"expected": expected, "deleted": deleted, "updates": updates,
                  "generations": len(generations)}), flush=True)
"""

# After "go", updates and deletes records of the bank (adding more when few are left) with
# compaction off, so that the bank's log keeps every change it ever made. Acknowledges each.
CHANGE_CRASH_CHILD = """
import random, sys
from autopersona_flows.memory import JsonlMemoryStore, PersonaMemory

JsonlMemoryStore.compact_min_dead = 10**9
root, user, run = sys.argv[1], sys.argv[2], int(sys.argv[3])
if sys.stdin.readline() != "go\\n":
    sys.exit()
rng = random.Random(run)
store = JsonlMemoryStore(root)
live = [r.id for r in store.list(user, "persona")]
print("started", flush=True)
n = 0
while True:
    n += 1
    if len(live) < 4:
        live.append(store.add(user, PersonaMemory(topic=f"t-{run}", preference="0")).id)
        print("add", live[-1], flush=True)
    elif rng.random() < 0.7:
        memory_id = rng.choice(live)
        store.update(user, "persona", memory_id, PersonaMemory(topic=f"t-{run}", preference=str(n)),
                     reason=f"run {run} call {n}")
        print("update", memory_id, flush=True)
    else:
        memory_id = live.pop(rng.randrange(len(live)))
        store.delete(user, "persona", memory_id, reason=f"run {run} call {n}")
        print("delete", memory_id, flush=True)
"""

# Serves one long-lived store instance: on "list" prints the persona bank as JSON
# [[id, topic, preference], ...]; on "add TOPIC" adds a record and prints its id.
SERVE_CHILD = """
import json, sys
from autopersona_flows.memory import JsonlMemoryStore, PersonaMemory

root, user = sys.argv[1], sys.argv[2]
store = JsonlMemoryStore(root)
print("ready", flush=True)
for line in sys.stdin:
    command, _, topic = line.strip().partition(" ")
    if command == "list":
        records = store.list(user, "persona")
        print(json.dumps([[r.id, r.content.topic, r.content.preference] for r in records]))
    elif command == "add":
        print(store.add(user, PersonaMemory(topic=topic, preference="from-child")).id)
    sys.stdout.flush()
"""


# -- helpers -------------------------------------------------------------------------------

Proc = subprocess.Popen[str]


class _Children:
    """Spawns child interpreters; any still alive when the test ends are killed."""

    def __init__(self) -> None:
        self.procs: list[Proc] = []

    def spawn(self, script: str, *args: object) -> Proc:
        proc = subprocess.Popen(
            [sys.executable, "-c", script, *map(str, args)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            for pipe in (proc.stdin, proc.stdout, proc.stderr):
                if pipe is not None:
                    with contextlib.suppress(OSError):
                        pipe.close()


@pytest.fixture
def children() -> Iterator[_Children]:
    kids = _Children()
    yield kids
    kids.close()


def _fail_with_stderr(proc: Proc, what: str) -> NoReturn:
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    assert proc.stderr is not None
    pytest.fail(f"{what}; the child's stderr:\n{proc.stderr.read()}")


def _send(proc: Proc, line: str) -> None:
    assert proc.stdin is not None
    proc.stdin.write(line + "\n")
    proc.stdin.flush()


def _read_line(proc: Proc) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.endswith("\n"):
        _fail_with_stderr(proc, f"the child stopped talking (last output {line!r})")
    return line[:-1]


def _expect_line(proc: Proc, expected: str) -> None:
    line = _read_line(proc)
    if line != expected:
        _fail_with_stderr(proc, f"the child said {line!r} instead of {expected!r}")


def _start_together(procs: list[Proc]) -> None:
    """Wait until every child is ready, then release them all at once."""
    for proc in procs:
        _expect_line(proc, "ready")
    for proc in procs:
        _send(proc, "go")


def _results(procs: list[Proc]) -> list[Any]:
    """Wait for each child to exit cleanly; return the JSON each printed last."""
    results = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            _fail_with_stderr(proc, "a child hung")
        assert proc.returncode == 0, f"a child failed:\n{err}"
        results.append(orjson.loads(out.splitlines()[-1]))
    return results


def _bank_path(root: Path, user: str = USER) -> Path:
    return root / "users" / user_key(user) / "persona.jsonl"


def _file_entries(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A bank file's header and complete entry lines, parsed as plain JSON."""
    lines = path.read_bytes().split(b"\n")[:-1]  # whatever follows the last newline is torn
    header, *entries = map(orjson.loads, lines)
    return header, entries


def _history_lines(root: Path) -> list[bytes]:
    """The complete lines of the persona bank's history file."""
    data = (_bank_path(root).parent / "persona.history.jsonl").read_bytes()
    return data.split(b"\n")[:-1]


def _generation(root: Path) -> str:
    header, _ = _file_entries(_bank_path(root))
    return header["generation"]


def _persona(topic: str, preference: str = "0/1") -> PersonaMemory:
    return PersonaMemory(topic=topic, preference=preference)


def _topics(records: list[MemoryRecord]) -> list[str]:
    return [record.content.topic for record in records]


def _check_batches_whole(records: list[MemoryRecord]) -> None:
    """Every record says "index/size" of its topic: each topic must be all there."""
    per_topic = Counter(_topics(records))
    for record in records:
        size = int(record.content.preference.split("/")[1])
        topic = record.content.topic
        assert per_topic[topic] == size, f"{topic}: {per_topic[topic]} of its {size} records"


# -- 1. crash safety -----------------------------------------------------------------------

CRASH_ROUNDS = 30
CRASH_TRIM_ABOVE = 1000  # records; past this, the bank is cut down to its last calls


def _kill_while_writing(proc: Proc, delay: float) -> list[str]:
    """Release the crash child, SIGKILL it ``delay`` seconds after it starts writing."""
    _send(proc, "go")
    _expect_line(proc, "started")
    lines: list[str] = []
    # Drain stdout meanwhile: a child blocked on a full pipe would not be writing.
    reader = threading.Thread(target=lines.extend, args=(proc.stdout,))
    reader.start()
    time.sleep(delay)
    if proc.poll() is not None:
        _fail_with_stderr(proc, "the crash child died on its own")
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=TIMEOUT)
    reader.join(timeout=TIMEOUT)
    assert proc.returncode == -signal.SIGKILL
    return [line for line in lines if line.endswith("\n")]  # a cut line acknowledged nothing


@pytest.mark.slow
def test_sigkill_mid_append_loses_no_acknowledged_write(
    tmp_path: Path, children: _Children
) -> None:
    rng = random.Random(8128)
    root = tmp_path / "store"
    bank = _bank_path(root)
    watcher = JsonlMemoryStore(root)  # lives through every round, refreshing incrementally
    known: set[str] = set()  # every id present after the previous round; none may vanish
    upcoming = children.spawn(CRASH_CHILD, root, USER, 0)
    for run in range(CRASH_ROUNDS):
        proc = upcoming
        if run + 1 < CRASH_ROUNDS:  # the next child starts up while this one runs
            upcoming = children.spawn(CRASH_CHILD, root, USER, run + 1)
        lines = _kill_while_writing(proc, rng.uniform(0.05, 0.4))
        acked = {int(n): ids for n, *ids in map(str.split, lines)}  # call number -> its ids
        assert acked, f"round {run}: the child acknowledged nothing before the kill"

        store = JsonlMemoryStore(root)  # a fresh reader after the crash
        records = store.list(USER, "persona")
        assert watcher.list(USER, "persona") == records
        present = {record.id: record for record in records}
        acked_ids = {memory_id for ids in acked.values() for memory_id in ids}
        assert not known - present.keys(), f"round {run}: records of earlier rounds vanished"
        assert not acked_ids - present.keys(), f"round {run}: acknowledged records missing"
        for n, ids in acked.items():
            kind = "single" if n % 2 else "batch"
            assert {present[memory_id].content.topic for memory_id in ids} == {f"{kind}-{run}-{n}"}

        # Besides what was acknowledged, only the call in flight at the kill may have landed,
        # and a batch only as a whole.
        extra = [present[memory_id] for memory_id in present.keys() - known - acked_ids]
        in_flight = max(acked) + 1
        assert set(_topics(extra)) <= {f"single-{run}-{in_flight}", f"batch-{run}-{in_flight}"}
        _check_batches_whole(records)

        # No record line was written twice (in the file, not just in the parsed view).
        _, entries = _file_entries(bank)
        written = Counter(entry["id"] for entry in entries if "op" not in entry)
        assert written.most_common(1)[0][1] == 1, f"round {run}: a record line was duplicated"

        # The store is still writable, and that write cuts away any torn tail.
        added = store.add(USER, _persona(f"parent-{run}"))
        assert bank.read_bytes().endswith(added.model_dump_json().encode() + b"\n")
        assert watcher.list(USER, "persona") == [*records, added]
        known = {*present, added.id}

        if len(known) > CRASH_TRIM_ABOVE:  # keep parsing cheap: keep the last dozen calls only
            recent = {
                f"{kind}-{run}-{n}"
                for kind in ("single", "batch")
                for n in range(in_flight - 12, in_flight + 1)
            }
            keep = [record for record in records if record.content.topic in recent]
            store.restore(MemorySnapshot.of(USER, {"persona": keep}), replace=True)
            known = {record.id for record in keep}

    assert {record.id for record in JsonlMemoryStore(root).list(USER, "persona")} == known


COMPACT_CRASH_ROUNDS = 12


@pytest.mark.slow
def test_sigkill_mid_compaction_loses_no_acknowledged_write(
    tmp_path: Path, children: _Children
) -> None:
    rng = random.Random(496)
    root = tmp_path / "store"
    folder = _bank_path(root).parent
    live: set[str] = set()  # the bank's ids as last checked
    deleted: set[str] = set()
    generations: set[str] = set()
    upcoming = children.spawn(COMPACT_CRASH_CHILD, root, USER, 0)
    for run in range(COMPACT_CRASH_ROUNDS):
        proc = upcoming
        if run + 1 < COMPACT_CRASH_ROUNDS:  # the next child starts up while this one runs
            upcoming = children.spawn(COMPACT_CRASH_CHILD, root, USER, run + 1)
        lines = _kill_while_writing(proc, rng.uniform(0.05, 0.25))
        expected = set(live)
        for op, memory_id in map(str.split, lines):
            if op == "add":
                expected.add(memory_id)
            else:
                expected.remove(memory_id)
                deleted.add(memory_id)

        store = JsonlMemoryStore(root)
        present = {record.id for record in store.list(USER, "persona")}
        # Only the call in flight at the kill may differ: one add or one delete more.
        assert len(present ^ expected) <= 1, f"round {run}: {present ^ expected}"
        assert not present & deleted, f"round {run}: an acknowledged delete came back"
        deleted |= expected - present
        generations.add(_generation(root))

        added = store.add(USER, _persona(f"parent-{run}"))
        assert JsonlMemoryStore(root).get(USER, "persona", added.id) == added
        live = present | {added.id}

    assert len(generations) > COMPACT_CRASH_ROUNDS // 2  # most rounds compacted the bank
    history = [MemoryChange.model_validate_json(line) for line in _history_lines(root)]
    assert deleted <= {change.before.id for change in history if change.operation == "delete"}
    # A kill inside a compaction may leave its temporary file behind, never a second bank.
    assert {path.name for path in folder.iterdir() if not path.name.endswith(".tmp")} == {
        "persona.jsonl",
        "persona.history.jsonl",
        "persona.lock",
    }


def _changes_in_the_bank(root: Path) -> list[tuple[str, str, str]]:
    """Every update and delete the bank's log holds, replayed: (operation, id, at)."""
    _, entries = _file_entries(_bank_path(root))
    live: set[str] = set()
    changes = []
    for entry in entries:
        if entry.get("op") == "delete":
            live.remove(entry["id"])
            changes.append(("delete", entry["id"], entry["at"]))
        elif "op" not in entry:
            if entry["id"] in live:
                changes.append(("update", entry["id"], entry["updated_at"]))
            live.add(entry["id"])
    return changes


def _as_listed(changes: list[MemoryChange]) -> list[tuple[str, str, str]]:
    return [(c.operation, c.before.id, orjson.loads(c.model_dump_json())["at"]) for c in changes]


CHANGE_CRASH_ROUNDS = 20  # a kill falls between the two writes in about 1 round of 3


@pytest.mark.slow
def test_sigkill_between_a_change_and_its_history_entry_loses_and_invents_nothing(
    tmp_path: Path, children: _Children, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The history lists exactly the updates and deletes the bank holds, after any kill.

    An entry for a change that never landed (the history written first) or a change
    without its entry would both break the equality; the bank's log is the truth.
    """
    monkeypatch.setattr(JsonlMemoryStore, "compact_min_dead", 10**9)  # keep the whole log
    rng = random.Random(1729)
    root = tmp_path / "store"
    recovered = 0  # rounds whose kill fell between a change and its history entry
    upcoming = children.spawn(CHANGE_CRASH_CHILD, root, USER, 0)
    for run in range(CHANGE_CRASH_ROUNDS):
        proc = upcoming
        if run + 1 < CHANGE_CRASH_ROUNDS:
            upcoming = children.spawn(CHANGE_CRASH_CHILD, root, USER, run + 1)
        # A round whose child is killed before its first change (a loaded machine) still
        # checks the files; `recovered` below says whether the kills fell where it matters.
        _kill_while_writing(proc, rng.uniform(0.05, 0.3))

        in_bank = _changes_in_the_bank(root)
        in_file = [MemoryChange.model_validate_json(line) for line in _history_lines(root)]
        assert _as_listed(in_file) == in_bank[: len(in_file)], f"round {run}: an invented entry"
        listed = JsonlMemoryStore(root).history(USER, "persona")
        assert _as_listed(listed) == in_bank, f"round {run}: history() is not the bank's changes"
        assert listed[: len(in_file)] == in_file
        recovered += len(in_file) < len(in_bank)
        assert len(in_bank) - len(in_file) <= 1  # only the change in flight at the kill

        # The next write records a change left out, once: then the file says it all.
        JsonlMemoryStore(root).add(USER, _persona(f"parent-{run}"))
        in_file = [MemoryChange.model_validate_json(line) for line in _history_lines(root)]
        assert _as_listed(in_file) == in_bank
        assert in_file == JsonlMemoryStore(root).history(USER, "persona")
        # Each entry keeps its writer's reason, but one recovered: that reason was never written.
        assert sum(not c.reason for c in in_file) == recovered

    assert recovered, "no kill fell between a change and its history entry: raise the rounds"


# Makes one update or delete and dies the moment the bank entry is written, before the
# history entry: as a kill in that instant would.
DIE_BEFORE_HISTORY_CHILD = """
import os, sys
from autopersona_flows.memory import JsonlMemoryStore, PersonaMemory
from autopersona_flows.memory._histories import History

root, user, operation, memory_id = sys.argv[1:5]
History.append = lambda self, change: os._exit(9)
store = JsonlMemoryStore(root)
if operation == "update":
    store.update(user, "persona", memory_id, PersonaMemory(topic="t", preference="new"), reason="r")
else:
    store.delete(user, "persona", memory_id, reason="r")
"""


@pytest.mark.parametrize("operation", ["update", "delete"])
def test_a_change_whose_writer_died_before_its_history_entry_is_listed_then_recorded(
    tmp_path: Path, operation: str
) -> None:
    root = tmp_path / "store"
    store = JsonlMemoryStore(root)
    first = store.add(USER, _persona("t", "old"))
    store.update(USER, "persona", first.id, _persona("t", "older"), reason="kept")
    before = store.get(USER, "persona", first.id)
    child = subprocess.run(
        [sys.executable, "-c", DIE_BEFORE_HISTORY_CHILD, str(root), USER, operation, first.id],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert child.returncode == 9, child.stderr
    assert len(_history_lines(root)) == 1  # the child never wrote its entry

    for view in (store, JsonlMemoryStore(root)):  # a warm view and a fresh one alike
        kept, recovered = view.history(USER, "persona", first.id)
        assert (kept.reason, recovered.operation, recovered.before) == ("kept", operation, before)
        assert recovered.reason == ""  # never written anywhere: the one thing lost
        if operation == "update":
            assert recovered.after == view.get(USER, "persona", first.id)
            assert recovered.after.content.preference == "new"
        else:
            assert view.list(USER, "persona") == []
    listed = store.history(USER, "persona")

    JsonlMemoryStore(root).add(USER, _persona("next"))  # any write records it, once
    assert [MemoryChange.model_validate_json(line) for line in _history_lines(root)] == listed
    assert store.history(USER, "persona") == JsonlMemoryStore(root).history(USER, "persona")
    assert store.history(USER, "persona") == listed


def test_a_history_write_that_fails_after_the_change_landed_is_retried_not_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(JsonlMemoryStore, "compact_min_dead", 1)
    store = JsonlMemoryStore(tmp_path / "store")
    record = store.add(USER, _persona("t", "0"))
    store.update(USER, "persona", record.id, _persona("t", "1"), reason="one")
    real_append = History.append

    def disk_full(self: History, change: MemoryChange) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(History, "append", disk_full)
    updated = store.update(USER, "persona", record.id, _persona("t", "2"), reason="two")
    assert "will retry" in caplog.text
    assert store.get(USER, "persona", record.id) == updated  # it landed, and says so
    assert [c.reason for c in store.history(USER, "persona")] == ["one", "two"]
    # Two dead entries against one record would compact the bank now, dropping the
    # superseded version the history still needs: compaction waits.
    _, entries = _file_entries(_bank_path(tmp_path / "store"))
    assert len(entries) == 3

    monkeypatch.setattr(History, "append", real_append)
    # The next write records the waiting entry first, reason and all; then it compacts.
    store.update(USER, "persona", record.id, _persona("t", "3"), reason="three")
    reasons = [c.reason for c in JsonlMemoryStore(tmp_path / "store").history(USER, "persona")]
    assert reasons == ["one", "two", "three"]
    _, entries = _file_entries(_bank_path(tmp_path / "store"))
    assert len(entries) == 1


def _torn_tails() -> dict[str, bytes]:
    """What a writer killed mid-append can leave at the end of a bank, by description."""
    lines = [
        MemoryRecord(layer="persona", content=_persona("torn", f"{i}/3")).model_dump_json().encode()
        for i in range(3)
    ]
    head = b'{"op":"batch","count":3}'
    return {
        "half-a-record": lines[0][: len(lines[0]) // 2],
        "a-record-without-its-newline": lines[0],
        "half-a-batch-header": head[:10],
        "a-batch-header-alone": head + b"\n",
        "a-batch-header-and-1-of-3": head + b"\n" + lines[0] + b"\n",
        "a-batch-header-and-2.5-of-3": b"\n".join([head, *lines[:2], lines[2][:40]]),
    }


TORN_TAILS = _torn_tails()


@pytest.mark.parametrize("tail", TORN_TAILS.values(), ids=TORN_TAILS.keys())
def test_torn_tail_is_invisible_and_cut_by_the_next_write(tmp_path: Path, tail: bytes) -> None:
    root = tmp_path / "store"
    cached = JsonlMemoryStore(root)
    cached.add(USER, _persona("before"))
    cached.add_many(USER, "persona", [_persona("before-batch", f"{i}/2") for i in range(2)])
    expected = cached.list(USER, "persona")
    bank = _bank_path(root)
    intact = bank.read_bytes()

    with bank.open("ab") as file:  # a writer died here, part way through its append
        file.write(tail)

    fresh = JsonlMemoryStore(root)
    assert fresh.list(USER, "persona") == expected  # a new reader sees complete entries only
    assert cached.list(USER, "persona") == expected  # so does one refreshing incrementally
    for line in tail.split(b"\n")[:-1]:
        if memory_id := orjson.loads(line).get("id"):
            with pytest.raises(MemoryNotFoundError):
                fresh.get(USER, "persona", memory_id)
    assert bank.read_bytes() == intact + tail  # reading repairs nothing

    added = fresh.add(USER, _persona("after"))
    assert bank.read_bytes() == intact + added.model_dump_json().encode() + b"\n"
    assert cached.list(USER, "persona") == [*expected, added]
    assert JsonlMemoryStore(root).list(USER, "persona") == [*expected, added]


def test_each_torn_tail_is_cut_before_the_next_batch(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = JsonlMemoryStore(root)
    bank = _bank_path(root)
    expected: list[MemoryRecord] = []
    lines: list[Any] = []  # what the file must hold in the end, torn tails all gone
    for n, tail in enumerate(TORN_TAILS.values()):
        batch = store.add_many(USER, "persona", [_persona(f"ok-{n}", "0/2")] * 2)
        expected += batch
        lines += [{"op": "batch", "count": 2}, *(orjson.loads(r.model_dump_json()) for r in batch)]
        with bank.open("ab") as file:
            file.write(tail)
        assert store.list(USER, "persona") == expected
        assert JsonlMemoryStore(root).list(USER, "persona") == expected
    expected.append(JsonlMemoryStore(root).add(USER, _persona("last")))
    lines.append(orjson.loads(expected[-1].model_dump_json()))
    assert store.list(USER, "persona") == expected
    assert _file_entries(bank)[1] == lines


def test_a_refilled_torn_tail_of_the_same_size_and_mtime_is_not_lost(tmp_path: Path) -> None:
    root = tmp_path / "store"
    a, b = JsonlMemoryStore(root), JsonlMemoryStore(root)
    a.add(USER, _persona("first"))
    bank = _bank_path(root)
    record = MemoryRecord(layer="persona", content=_persona("acknowledged"))
    with bank.open("ab") as file:  # a writer died, leaving exactly one entry's worth of bytes
        file.write(b"x" * len(record.model_dump_json().encode() + b"\n"))
    a.list(USER, "persona")  # a caches the bank, torn tail included
    tick = bank.stat().st_mtime_ns
    b.add(USER, record)  # b cuts the tail and appends: the size is what a saw
    os.utime(bank, ns=(tick, tick))  # both writes fell in one timestamp tick (coarse clocks)
    a.add(USER, _persona("later"))
    assert record in JsonlMemoryStore(root).list(USER, "persona")


# -- 2. many processes on one bank ---------------------------------------------------------

WRITERS = 4
PER_WRITER = 150


@pytest.mark.slow
def test_concurrent_processes_append_every_record_once(tmp_path: Path, children: _Children) -> None:
    root = tmp_path / "store"
    names = [f"writer{k}" for k in range(WRITERS)]
    procs = [children.spawn(APPEND_CHILD, root, USER, name, PER_WRITER) for name in names]
    _start_together(procs)
    reported = _results(procs)

    records = JsonlMemoryStore(root).list(USER, "persona")
    assert len(records) == WRITERS * PER_WRITER
    assert {record.id for record in records} == {i for ids in reported for i in ids}
    assert sorted(_topics(records)) == sorted(
        f"{name}-{i}" for name in names for i in range(PER_WRITER)
    )
    for name, ids in zip(names, reported, strict=True):
        assert len(set(ids)) == PER_WRITER
        assert ids == sorted(ids), f"{name}'s ids are not increasing"
    _, entries = _file_entries(_bank_path(root))
    written = Counter(entry["id"] for entry in entries if "op" not in entry)
    assert len(written) == WRITERS * PER_WRITER
    assert set(written.values()) == {1}
    assert _bank_path(root).read_bytes().endswith(b"\n")


CHURNERS = 4
CHURN_STEPS = 150


@pytest.mark.slow
def test_concurrent_updates_deletes_and_compactions_reconcile(
    tmp_path: Path, children: _Children
) -> None:
    root = tmp_path / "store"
    store = JsonlMemoryStore(root)
    seed = store.add(USER, _persona("seed"))  # the bank exists before the children start
    first_generation = _generation(root)
    names = [f"churner{k}" for k in range(CHURNERS)]
    bank = _bank_path(root)
    procs = [children.spawn(CHURN_CHILD, root, USER, name, CHURN_STEPS, bank) for name in names]
    _start_together(procs)
    reports = _results(procs)

    expected = {seed.id: seed.content.preference}
    for report in reports:
        assert not expected.keys() & report["expected"].keys()
        expected.update(report["expected"])
    added = {*expected, *(i for report in reports for i in report["deleted"])}
    deleted = {i for report in reports for i in report["deleted"]}

    records = JsonlMemoryStore(root).list(USER, "persona")
    assert len(records) == len(expected)
    assert {record.id for record in records} == added - deleted == expected.keys()
    assert {record.id: record.content.preference for record in records} == expected
    assert store.list(USER, "persona") == records  # the parent's instance, refreshed

    # Compactions happened while the children wrote, and kept the log within its bound.
    assert _generation(root) != first_generation
    assert max(report["generations"] for report in reports) > 2
    _, entries = _file_entries(bank)
    assert len(entries) - len(records) <= max(8, len(records))

    # Every update and delete left its history entry: one file read, checked per id ...
    assert (bank.parent / "persona.history.jsonl").read_bytes().endswith(b"\n")
    changes = [MemoryChange.model_validate_json(line) for line in _history_lines(root)]
    operations: dict[str, list[str]] = {}
    for change in changes:
        operations.setdefault(change.before.id, []).append(change.operation)
    updates = {i: n for report in reports for i, n in report["updates"].items()}
    for memory_id in added:
        want = ["update"] * updates.get(memory_id, 0) + ["delete"] * (memory_id in deleted)
        assert operations.get(memory_id, []) == want, memory_id
    # ... and through history() for a sample, whose versions must chain up.
    for memory_id in sorted(updates)[:: max(1, len(updates) // 15)]:
        history = store.history(USER, "persona", memory_id)
        assert [change.operation for change in history] == operations[memory_id]
        for older, newer in itertools.pairwise(history):
            assert older.after == newer.before
        if memory_id not in deleted:
            assert history[-1].after == store.get(USER, "persona", memory_id)


# -- 3. threads ----------------------------------------------------------------------------


def test_threads_and_two_instances_in_one_process(tmp_path: Path) -> None:
    root = tmp_path / "store"
    shared, other, reader = (JsonlMemoryStore(root) for _ in range(3))
    errors: list[BaseException] = []
    done = threading.Event()
    start = threading.Barrier(8 + 4 + 1)

    def guarded(work: Any) -> Any:
        def run(*args: Any) -> None:
            try:
                start.wait()
                work(*args)
            except BaseException as exc:  # reported by the main thread
                errors.append(exc)

        return run

    @guarded
    def adds(t: int) -> None:  # 8 threads on one instance: 100 single adds each
        for i in range(100):
            shared.add(USER, _persona(f"single-{t}-{i}"))

    @guarded
    def batches(t: int) -> None:  # 4 threads on a second instance: 25 batches of 4 each
        for i in range(25):
            batch = [_persona(f"batch-{t}-{i}", f"{k}/4") for k in range(4)]
            other.add_many(USER, "persona", batch)

    @guarded
    def watch() -> None:  # a third instance reads all along: batches whole, counts growing
        seen = 0
        while not done.is_set():
            records = reader.list(USER, "persona")
            _check_batches_whole(records)
            assert len(records) >= seen
            seen = len(records)
            # A warm read of an unchanged bank makes no system call, so without a
            # pause this loop would hold the GIL against the writers, whose every
            # system call then waits out the interpreter's switch interval.
            time.sleep(0.001)

    # Daemon threads: a deadlock fails the test instead of hanging the whole run.
    watcher = threading.Thread(target=watch, daemon=True)
    writers = [threading.Thread(target=adds, args=(t,), daemon=True) for t in range(8)]
    writers += [threading.Thread(target=batches, args=(t,), daemon=True) for t in range(4)]
    for thread in [watcher, *writers]:
        thread.start()
    deadline = time.monotonic() + TIMEOUT
    for thread in writers:
        thread.join(timeout=max(0, deadline - time.monotonic()))
    done.set()
    watcher.join(timeout=5)
    assert not errors, errors
    assert not any(thread.is_alive() for thread in [watcher, *writers]), "threads deadlocked"

    records = JsonlMemoryStore(root).list(USER, "persona")
    assert len(records) == 800 + 400
    assert sorted(_topics(records)) == sorted(
        [f"single-{t}-{i}" for t in range(8) for i in range(100)]
        + [f"batch-{t}-{i}" for t in range(4) for i in range(25) for _ in range(4)]
    )
    _check_batches_whole(records)
    for store in (shared, other, reader):
        assert store.list(USER, "persona") == records
    _, entries = _file_entries(_bank_path(root))
    assert len(entries) == 1200 + 100  # every record once, plus one header per batch


# -- 4. one store, many readers ------------------------------------------------------------


def _child_view(proc: Proc) -> list[list[str]]:
    _send(proc, "list")
    return orjson.loads(_read_line(proc))


def _view(records: list[MemoryRecord]) -> list[list[str]]:
    return [[r.id, r.content.topic, r.content.preference] for r in records]


def _update_until_compacted(store: JsonlMemoryStore, record: MemoryRecord) -> MemoryRecord:
    """Update ``record`` through ``store`` until that compacts the bank; return the last version."""
    generation = _generation(store.root)
    for n in range(20):
        record = store.update(USER, "persona", record.id, _persona(record.content.topic, f"v{n}"))
        if _generation(store.root) != generation:
            return record
    pytest.fail("20 updates did not compact the bank")


def test_writes_are_visible_to_other_instances_and_processes(
    tmp_path: Path, children: _Children, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "store"
    monkeypatch.setattr(JsonlMemoryStore, "compact_min_dead", 2)  # the child keeps 1024
    a, b = JsonlMemoryStore(root), JsonlMemoryStore(root)
    child = children.spawn(SERVE_CHILD, root, USER)
    _expect_line(child, "ready")
    assert _child_view(child) == []

    def everyone_sees(expected: list[MemoryRecord]) -> None:
        assert a.list(USER, "persona") == expected
        assert b.list(USER, "persona") == expected
        assert JsonlMemoryStore(root).list(USER, "persona") == expected
        assert _child_view(child) == _view(expected)

    first = a.add(USER, _persona("first"))
    everyone_sees([first])
    batch = a.add_many(USER, "persona", [_persona("batch", f"{i}/3") for i in range(3)])
    everyone_sees([first, *batch])
    _send(child, "add from-child")
    from_child = a.get(USER, "persona", _read_line(child))
    everyone_sees([first, *batch, from_child])
    first = b.update(USER, "persona", first.id, _persona("first", "changed"))
    assert a.get(USER, "persona", first.id) == first
    b.delete(USER, "persona", batch[0].id)
    everyone_sees([first, *batch[1:], from_child])

    # a compacts the bank, while b and the child hold views of the old file ...
    second = _update_until_compacted(a, batch[1])
    _, entries = _file_entries(_bank_path(root))
    assert len(entries) == 4  # nothing but the live records
    live = [first, second, batch[2], from_child]
    everyone_sees(live)

    # ... and once more, then b and the child write on top of it without having read it.
    second = _update_until_compacted(a, second)
    live[1] = second
    from_b = b.add(USER, _persona("from-b"))
    _send(child, "add from-child-again")
    live += [from_b, a.get(USER, "persona", _read_line(child))]
    everyone_sees(live)

    # Now b compacts under a and the child, and a writes on top of it.
    live[0] = _update_until_compacted(b, first)
    from_a = a.add(USER, _persona("from-a"))
    b.delete(USER, "persona", from_child.id)
    live = [*live[:3], *live[4:], from_a]
    everyone_sees(live)


def test_first_writes_of_many_instances_race_on_creating_the_folders(tmp_path: Path) -> None:
    # Each round: a fresh store, 16 instances whose first write creates the same folders.
    for round_ in range(30):
        root = tmp_path / f"store-{round_}"
        stores = [JsonlMemoryStore(root) for _ in range(16)]
        start = threading.Barrier(len(stores))
        errors: list[BaseException] = []

        def first_write(
            store: JsonlMemoryStore,
            n: int,
            start: threading.Barrier = start,
            errors: list[BaseException] = errors,
        ) -> None:
            try:
                start.wait()
                store.add(USER, _persona(f"first-{n}"))
            except BaseException as exc:  # reported by the main thread
                errors.append(exc)

        threads = [
            threading.Thread(target=first_write, args=(store, n), daemon=True)
            for n, store in enumerate(stores)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=TIMEOUT)
        assert not errors, errors
        assert len(JsonlMemoryStore(root).list(USER, "persona")) == len(stores)
