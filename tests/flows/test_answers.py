"""Listing runs that wait for an answer, and answering them, as a script or CLI would."""

from __future__ import annotations

import os
import threading
import time

import prefect.settings as ps
import pytest

from autopersona_flows.agent import Requirement
from autopersona_flows.errors import AnswerRejectedError
from autopersona_flows.flows import TaskGraph, TaskNode, run_persona_graph
from autopersona_flows.flows.answers import answer_clarification, pending_clarifications


def test_pending_questions_are_listed_and_answered(prefect_harness, kit) -> None:
    graph = TaskGraph(
        [
            TaskNode(
                id="book-flight",
                tool=kit.record,
                requires=[Requirement("seat", options=["window", "aisle"])],
            )
        ]
    )
    seen: dict[str, object] = {}

    def person() -> None:
        try:
            # The first run of a fresh test server can take a while to reach its pause.
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                pending = pending_clarifications()
                if pending:
                    (waiting,) = pending
                    seen["pending"] = waiting
                    with pytest.raises(AnswerRejectedError, match="middle"):
                        answer_clarification(waiting.flow_run_id, "middle")
                    seen["still waiting"] = [p.flow_run_id for p in pending_clarifications()]
                    answer_clarification(str(waiting.flow_run_id), "aisle")
                    return
                time.sleep(0.1)
            raise TimeoutError("no run waited for an answer within 120 s")
        except BaseException as exc:  # surfaced by the test below
            seen["error"] = exc

    thread = threading.Thread(target=person, daemon=True)
    thread.start()
    result = run_persona_graph(
        graph, "ada", "Book my flight", agent=kit.agent, poll_interval=0.5, pause_timeout=180
    )
    thread.join(30)
    assert "error" not in seen, seen.get("error")
    waiting = seen["pending"]
    assert waiting.question.startswith("Which seat should I use for step 'book-flight'")
    assert waiting.options == ["window", "aisle"]
    assert waiting.key.startswith("clarify-book-flight-")
    assert waiting.state == "Paused"
    assert seen["still waiting"] == [waiting.flow_run_id]  # a rejected answer resumes nothing
    assert result["decisions"]["book-flight"]["answer"] == "aisle"
    assert pending_clarifications() == []


def test_the_pending_and_answer_commands(prefect_harness, kit, run_cli) -> None:
    env = {**os.environ, "PREFECT_API_URL": ps.PREFECT_API_URL.value()}

    graph = TaskGraph(
        [
            TaskNode(
                id="pay", tool=kit.record, requires=[Requirement("card", options=["work", "own"])]
            )
        ]
    )
    outcome: dict[str, object] = {}
    runner = threading.Thread(
        target=lambda: outcome.update(
            result=run_persona_graph(
                graph, "ada", "Pay the bill", agent=kit.agent, poll_interval=0.5, pause_timeout=180
            )
        ),
        daemon=True,
    )
    runner.start()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        listed = run_cli("pending", env=env)
        if "Which card" in listed.stdout:
            break
        time.sleep(0.2)
    assert listed.returncode == 0, listed.stderr
    run_id, state, *_ = listed.stdout.split()
    assert state == "Paused"
    assert "[work | own]" in listed.stdout

    refused = run_cli("answer", run_id, "cash", env=env)
    assert refused.returncode == 1  # unlike `prefect api`, a rejected resume is a failure
    assert "rejected" in refused.stderr
    assert "cash" in refused.stderr
    accepted = run_cli("answer", run_id, "own", env=env)
    assert (accepted.returncode, accepted.stdout.strip()) == (0, f"resumed {run_id}")
    runner.join(60)
    assert outcome["result"]["decisions"]["pay"]["answer"] == "own"
    assert run_cli("pending", env=env).stdout.strip() == "no run is waiting for an answer"
