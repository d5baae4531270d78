"""Step locks: replays of one episode at once run a tool once; a killed holder frees its lock."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from prefect.filesystems import LocalFileSystem
from prefect.locking.protocol import LockManager

from autopersona_flows.errors import StepLockTimeoutError
from autopersona_flows.flows import TaskGraph, TaskNode, run_persona_graph
from autopersona_flows.flows.locks import FileLockManager, step_locks
from autopersona_flows.testing._support import run_threads

REPO = Path(__file__).resolve().parents[2]
KEY = "autopersona-run-book-0123456789abcdef"

HOLD_THEN_WAIT = """
import sys, time
from pathlib import Path
from autopersona_flows.flows.locks import FileLockManager

assert FileLockManager(Path(sys.argv[1])).acquire_lock(sys.argv[2], holder="other process")
print("held", flush=True)
time.sleep(600)
"""


def test_it_is_a_prefect_lock_manager() -> None:
    assert isinstance(FileLockManager(), LockManager)


def test_holders_exclude_each_other_until_released(tmp_path: Path) -> None:
    locks = FileLockManager(tmp_path)
    assert not locks.is_locked(KEY)
    assert locks.acquire_lock(KEY, holder="a")
    assert locks.acquire_lock(KEY, holder="a", acquire_timeout=0)  # held already
    assert (locks.is_locked(KEY), locks.is_lock_holder(KEY, "a")) == (True, True)
    assert not locks.is_lock_holder(KEY, "b")
    assert not locks.acquire_lock(KEY, holder="b", acquire_timeout=0.2)
    assert not locks.wait_for_lock(KEY, timeout=0.2)
    # Another manager of the same folder (another task's) is excluded too.
    assert not FileLockManager(tmp_path).acquire_lock(KEY, holder="c", acquire_timeout=0.2)
    with pytest.raises(ValueError, match="No lock held by b"):
        locks.release_lock(KEY, holder="b")

    locks.release_lock(KEY, holder="a")
    assert not locks.is_locked(KEY)
    assert locks.wait_for_lock(KEY, timeout=0)
    assert list(tmp_path.iterdir()) == []  # no lock file is left behind
    assert locks.acquire_lock(KEY, holder="b", acquire_timeout=0)
    locks.release_lock(KEY, holder="b")


def test_waiting_threads_take_the_lock_one_at_a_time(tmp_path: Path) -> None:
    locks = FileLockManager(tmp_path)
    inside = 0
    most = 0
    guard = threading.Lock()

    def hold(holder: str) -> None:
        nonlocal inside, most
        for _ in range(20):
            assert locks.acquire_lock(KEY, holder=holder, acquire_timeout=30)
            with guard:
                inside += 1
                most = max(most, inside)
            with guard:
                inside -= 1
            locks.release_lock(KEY, holder=holder)

    run_threads(*(lambda name=f"t{i}": hold(name) for i in range(4)))
    assert most == 1
    assert not locks.is_locked(KEY)


@pytest.mark.slow
def test_a_lock_is_held_across_processes_and_freed_when_its_holder_is_killed(
    tmp_path: Path,
) -> None:
    locks = FileLockManager(tmp_path)
    with subprocess.Popen(
        [sys.executable, "-c", HOLD_THEN_WAIT, str(tmp_path), KEY],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    ) as holder:
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline().strip() == "held"
            assert locks.is_locked(KEY)
            assert not locks.acquire_lock(KEY, holder="here", acquire_timeout=0.3)
        finally:
            os.kill(holder.pid, signal.SIGKILL)
            holder.wait(30)
    # Prefect's FileSystemLockManager would stay locked forever now; the kernel
    # released this one with its process, and the stale file is reused.
    assert not locks.is_locked(KEY)
    assert locks.acquire_lock(KEY, holder="here", acquire_timeout=5)
    locks.release_lock(KEY, holder="here")


def test_a_caller_without_a_timeout_fails_loudly_after_the_setting_naming_the_holder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PREFECT_INTEGRATIONS_AUTOPERSONA_STEP_LOCK_TIMEOUT", "0.3")
    locks = FileLockManager(tmp_path)
    assert locks.acquire_lock(KEY, holder="stuck")
    # Prefect's transactions and result reads pass no timeout: they used to wait forever.
    for wait in (
        lambda: locks.acquire_lock(KEY, holder="replay"),
        lambda: locks.wait_for_lock(KEY),
    ):
        with pytest.raises(StepLockTimeoutError) as caught:
            wait()
        message = str(caught.value)
        assert f"process {os.getpid()}" in message
        assert "held since" in message
        assert "PREFECT_INTEGRATIONS_AUTOPERSONA_STEP_LOCK_TIMEOUT" in message
        assert caught.value.key == KEY
    # A caller that gives its own timeout is answered as Prefect's protocol says.
    assert not locks.acquire_lock(KEY, holder="replay", acquire_timeout=0.1)
    locks.release_lock(KEY, holder="stuck")
    assert locks.acquire_lock(KEY, holder="replay")
    locks.release_lock(KEY, holder="replay")


def test_locks_live_beside_local_results_and_in_prefect_home_otherwise(tmp_path: Path) -> None:
    assert step_locks(tmp_path).folder == (tmp_path / ".locks").resolve()
    block = LocalFileSystem(basepath=str(tmp_path / "block"))
    assert step_locks(block).folder == (tmp_path / "block" / ".locks").resolve()
    assert step_locks(tmp_path) is step_locks(tmp_path)
    assert step_locks(None).folder.parts[-2:] == ("autopersona", "locks")


def test_two_replays_of_one_episode_at_once_run_each_tool_once(prefect_harness, kit) -> None:
    graph = TaskGraph(
        [
            TaskNode(id="book", tool=kit.lingers),  # waits for a second call, up to 8 s
            TaskNode(id="confirm", tool=kit.record, depends_on=["book"]),
        ]
    )
    start = threading.Barrier(2, timeout=30)

    def replay() -> dict:
        start.wait()
        return run_persona_graph(
            graph,
            "ada",
            "Book the trip",
            agent=kit.agent,
            episode_id="trip-9",
            result_storage=kit.results,
        )

    first, second = run_threads(replay, replay)

    assert kit.calls == {"book": 1, "confirm": 1}
    assert first["outputs"] == second["outputs"]
    # Each step ran in one of the two runs and came from the cache in the other.
    assert sum(r["metrics"]["tool_executions"] for r in (first, second)) == 2
    assert sum(r["metrics"]["cache_hits"] for r in (first, second)) == 2
    assert list((kit.results / ".locks").iterdir()) == []


def test_a_replay_waiting_on_a_stuck_tool_fails_loudly_and_runs_nothing(
    prefect_harness, kit, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PREFECT_INTEGRATIONS_AUTOPERSONA_STEP_LOCK_TIMEOUT", "1")
    graph = TaskGraph([TaskNode(id="book", tool=kit.waits_at_barrier)])
    stuck = kit.barrier(2, timeout=60)  # the tool and this test

    def run() -> dict:
        return run_persona_graph(
            graph, "ada", "Book", agent=kit.agent, episode_id="trip-10", result_storage=kit.results
        )

    first = threading.Thread(target=run)
    first.start()
    try:
        while kit.calls["book"] == 0:  # the first run's tool is running, holding its step
            threading.Event().wait(0.05)
        with pytest.raises(StepLockTimeoutError, match="held since"):
            run()
        assert kit.calls["book"] == 1  # the replay ran nothing
    finally:
        stuck.wait()  # the stuck tool goes on
        first.join(60)
