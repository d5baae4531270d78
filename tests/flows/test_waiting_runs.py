"""A waiting run as those who answer see it: whom it asks, since when, and if anything still waits.

A run paused in a process that died stays Paused; an answer would resume it into a run
nobody runs. These tests kill such a process for real (SIGKILL) and check that
``pending`` says so, ``answer`` refuses, and ``cancel`` ends the run.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from uuid import UUID

import prefect.settings as ps
import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
from prefect.client.schemas.objects import StateType
from prefect.settings.profiles import load_current_profile
from prefect.states import Cancelled, Paused, Suspended

from autopersona_flows.agent import Requirement
from autopersona_flows.cli import main
from autopersona_flows.errors import AnswerRejectedError, RunGoneError
from autopersona_flows.flows import (
    TaskGraph,
    TaskNode,
    answer,
    answer_clarification,
    pending_clarifications,
    run_persona_graph,
)
from autopersona_flows.flows.waiting import Seen, WaitingNote, answer_command, liveness

pytestmark = pytest.mark.usefixtures("prefect_harness")

REPO = Path(__file__).resolve().parents[2]

# A graph run paused in its own process, beating every second (10 s by default), so
# that a test sees its death within seconds.
PAUSED_RUN = """
import sys

import autopersona_flows.flows.waiting as waiting
from autopersona_flows.agent import PersonaAgent, Requirement
from autopersona_flows.flows import TaskGraph, TaskNode, run_persona_graph
from autopersona_flows.memory import JsonlMemoryStore, MemoryRetriever

waiting.HEARTBEAT_SECONDS = 1.0
store = sys.argv[1]
graph = TaskGraph(
    [
        TaskNode(
            id="format-references",
            tool=lambda context: "formatted",
            requires=[Requirement("citation style", options=["APA", "MLA"])],
        )
    ]
)
run_persona_graph(
    graph,
    "grace",
    "Finish my paper",
    agent=PersonaAgent(MemoryRetriever(JsonlMemoryStore(store))),
    pause_mode="pause",
    pause_timeout=600,
    poll_interval=0.5,
)
"""


def until(check, timeout: float = 120.0, every: float = 0.2):
    """``check()``'s first truthy value, polled until ``timeout`` seconds have passed."""
    deadline = time.monotonic() + timeout
    while not (found := check()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"nothing after {timeout} s")
        time.sleep(every)
    return found


def state_of(run_id: UUID) -> StateType:
    with get_client(sync_client=True) as client:
        return client.read_flow_run(run_id).state.type


def test_a_run_whose_process_died_is_listed_as_gone_refused_an_answer_and_cancelled(
    tmp_path, capsys
) -> None:
    env = os.environ | {"PREFECT_API_URL": str(ps.PREFECT_API_URL.value())}
    log = tmp_path / "run.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-c", PAUSED_RUN, str(tmp_path / "store")],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        [waiting] = until(lambda: pending_clarifications("grace"), timeout=180)
        run = str(waiting.flow_run_id)
        # Alive: its process, whom it asks, for which step, and since when.
        assert (waiting.process, waiting.pid, waiting.user_id) == ("alive", process.pid, "grace")
        assert waiting.flow_name == "persona-graph"
        assert waiting.questions[0].node == "format-references"
        assert waiting.waiting_since is not None
        assert datetime.now(UTC) - waiting.waiting_since < timedelta(minutes=5)
        # Its log says how to answer it from a shell, with the API it uses.
        command = until(lambda: re.search(r"Or answer from a shell: (.*)", log.read_text()))[1]
        api = str(ps.PREFECT_API_URL.value())
        assert command == f"PREFECT_API_URL={api} autopersona answer {run} '<APA|MLA>'"
        assert main(["cancel", run]) == 1  # its process still waits for the answer
        assert "still waits in process" in capsys.readouterr().err

        os.kill(process.pid, signal.SIGKILL)
        process.wait(30)
        [gone] = until(
            lambda: [p for p in pending_clarifications("grace") if p.process == "gone"], timeout=60
        )
        assert gone.flow_run_id == waiting.flow_run_id
        assert main(["pending", "--user", "grace"]) == 0
        listed = capsys.readouterr().out
        assert f"{run}  Paused  for grace  persona-graph/" in listed
        assert "PROCESS GONE (last seen" in listed
        assert f"`autopersona cancel {run}`" in listed
        assert "(before: format references)" in listed

        assert main(["answer", run, "MLA"]) == 1
        err = capsys.readouterr().err
        assert f"was paused in process {process.pid}" in err
        assert "nothing would run it after an answer" in err
        with pytest.raises(RunGoneError):
            answer_clarification(run, "MLA")
        assert state_of(waiting.flow_run_id) == StateType.PAUSED  # nothing was sent

        assert main(["cancel", "--gone"]) == 0
        assert f"cancelled {run}" in capsys.readouterr().out
    finally:
        if process.poll() is None:
            process.kill()
        # Never leave a dead run waiting: later tests expect nothing pending.
        for left in pending_clarifications("grace"):
            with get_client(sync_client=True) as client:
                client.set_flow_run_state(left.flow_run_id, Cancelled(), force=True)
    assert state_of(waiting.flow_run_id) == StateType.CANCELLED
    assert pending_clarifications("grace") == []


def test_the_logged_command_answers_the_run(kit, tmp_path) -> None:
    graph = TaskGraph(
        [
            TaskNode(
                id="pay", tool=kit.record, requires=[Requirement("card", options=["work", "own"])]
            )
        ]
    )
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(
            run_persona_graph, graph, "ada", "Pay the bill", agent=kit.agent, poll_interval=0.3
        )
        [waiting] = until(lambda: pending_clarifications("ada"))

        def logged() -> str | None:
            with get_client(sync_client=True) as client:
                logs = client.read_logs(
                    LogFilter(flow_run_id=LogFilterFlowRunId(any_=[waiting.flow_run_id]))
                )
            found = [log.message for log in logs if log.message.startswith("Or answer from")]
            return found[0].removeprefix("Or answer from a shell: ") if found else None

        command = until(logged, timeout=60)
        # As a person would: the placeholder replaced, run in a shell that has none of
        # this process's settings but its PATH.
        shell_env = {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
        shell_env["PREFECT_HOME"] = str(tmp_path / "another-home")
        done = subprocess.run(
            [shutil.which("bash") or "/bin/bash", "-c", command.replace("'<work|own>'", "own")],
            env=shell_env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        result = running.result(timeout=120)
    assert [a["answer"] for a in result["decisions"]["pay"]["answers"]] == ["own"]


def test_answer_waits_for_the_persons_run_and_answers_it(kit) -> None:
    graph = TaskGraph(
        [
            TaskNode(
                id="book-flight",
                tool=kit.record,
                requires=[Requirement("seat", options=["window", "aisle"])],
            )
        ]
    )
    with pytest.raises(AnswerRejectedError, match="a run for 'lin' did not ask a question"):
        answer("aisle", user_id="lin", timeout=0.5)
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(
            run_persona_graph, graph, "lin", "Book my flight", agent=kit.agent, poll_interval=0.3
        )
        asked = answer("aisle", user_id="lin", timeout=120)  # sent before the run asks
        result = running.result(timeout=120)
    assert asked.question == "To book your flight, which seat would you like? Window or aisle?"
    assert asked.user_id == "lin"
    assert [a["answer"] for a in result["decisions"]["book-flight"]["answers"]] == ["aisle"]


def _note(every: float | None) -> WaitingNote:
    return WaitingNote(user_id="ada", nodes=["n"], steps=["n"], pid=1, host="h", every=every)


def test_a_paused_run_is_gone_after_missed_heartbeats_or_its_timeout() -> None:
    now = datetime.now(UTC)
    paused = Paused(timeout_seconds=3600, pause_key="clarify-n-0123456789")
    assert liveness(paused, Seen(_note(10.0), now - timedelta(seconds=15)), now) == "alive"
    assert liveness(paused, Seen(_note(10.0), now - timedelta(seconds=45)), now) == "gone"
    assert liveness(paused, None, now) == "unknown"  # paused by a version keeping none
    # Past its pause's timeout, its process gave up (or died) whatever the heartbeat said.
    assert liveness(paused, Seen(_note(10.0), now), now + timedelta(hours=2)) == "gone"
    # A suspended run has no process by design: a worker runs it once answered.
    suspended = Suspended(pause_key="clarify-n-0123456789")
    assert liveness(suspended, None, now) == "suspended"


def test_the_command_names_the_api_only_when_the_profile_does_not(tmp_path) -> None:
    run = "0b4f7a46-7c2a-4a55-9d2c-3d1b8d2f3b11"
    api = str(ps.PREFECT_API_URL.value())
    fields = [("citation_style", ["APA", "MLA"]), ("sharing_channel", [])]
    elsewhere = answer_command(run, fields)
    assert elsewhere == (
        f"PREFECT_API_URL={api} autopersona answer {run} "
        "'citation_style=<APA|MLA>' 'sharing_channel=<your answer>'"
    )
    # A shell of the same profile finds the API itself.
    profiles = tmp_path / "profiles.toml"
    name = load_current_profile().name
    profiles.write_text(f'active = "{name}"\n[profiles.{name}]\nPREFECT_API_URL = "{api}"\n')
    with ps.temporary_settings(updates={ps.PREFECT_PROFILES_PATH: profiles}):
        assert answer_command(run, [("answer", [])]) == f"autopersona answer {run} '<your answer>'"


def test_cancel_names_what_to_cancel(capsys) -> None:
    assert main(["cancel"]) == 2  # a usage error
    assert "name the runs to cancel, or give --gone" in capsys.readouterr().err
    assert main(["cancel", "--gone"]) == 0
    assert capsys.readouterr().out == "no waiting run's process is gone\n"
    assert main(["cancel", "run-42"]) == 1
    assert "'run-42' is not a flow run id" in capsys.readouterr().err
