"""Listing runs that wait for an answer, and answering them, as a script or CLI would."""

from __future__ import annotations

import os
import threading
import time
from uuid import UUID, uuid4

import orjson
import prefect.settings as ps
import pytest
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import StateType
from prefect.input.run_input import keyset_from_paused_state
from prefect.states import Paused, Running

from autopersona_flows.agent import Requirement
from autopersona_flows.errors import AnswerRejectedError
from autopersona_flows.flows import TaskGraph, TaskNode, run_persona_graph
from autopersona_flows.flows.answers import answer_clarification, pending_clarifications

SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string", "enum": ["work", "own"]}},
    "required": ["answer"],
}


def read_state(run_id: UUID) -> StateType:
    with get_client(sync_client=True) as client:
        return client.read_flow_run(run_id).state.type


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
    try:
        result = run_persona_graph(
            graph, "ada", "Book my flight", agent=kit.agent, poll_interval=0.5, pause_timeout=180
        )
    finally:
        thread.join(30)
        if "error" in seen:  # the cause of a timed-out run, so raised instead of it
            raise seen["error"]
    waiting = seen["pending"]
    assert waiting.question == "To book your flight, which seat would you like? Window or aisle?"
    assert waiting.options == ["window", "aisle"]
    assert waiting.key.startswith("clarify-book-flight-")
    assert waiting.state == "Paused"
    assert seen["still waiting"] == [waiting.flow_run_id]  # a rejected answer resumes nothing
    assert [a["answer"] for a in result["decisions"]["book-flight"]["answers"]] == ["aisle"]
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
    assert [a["answer"] for a in outcome["result"]["decisions"]["pay"]["answers"]] == ["own"]
    assert run_cli("pending", env=env).stdout.strip() == "no run is waiting for an answer"


@flow
def _never_run() -> None:
    """Only gives the hand-made runs below a flow."""


def _paused_without_form() -> tuple[UUID, dict[str, str]]:
    """A run in the instant between Prefect's Paused state and the saving of its form."""
    with get_client(sync_client=True) as client:
        run = client.create_flow_run(_never_run)
        client.set_flow_run_state(run.id, Running(), force=True)
        state = Paused(timeout_seconds=60, pause_key="clarify-pay-0123456789abcdef")
        state.state_details.run_input_keyset = keyset_from_paused_state(state)
        client.set_flow_run_state(run.id, state, force=True)
    return run.id, state.state_details.run_input_keyset


def test_a_run_whose_form_is_not_saved_yet_is_not_listed_and_an_answer_waits_for_it(
    prefect_harness,
) -> None:
    run_id, keyset = _paused_without_form()
    assert run_id not in [p.flow_run_id for p in pending_clarifications()]

    def save_form() -> None:
        time.sleep(1.0)
        with get_client(sync_client=True) as client:
            client.create_flow_run_input(run_id, keyset["description"], "Pay with which card?")
            client.create_flow_run_input(run_id, keyset["schema"], orjson.dumps(SCHEMA).decode())

    saver = threading.Thread(target=save_form, daemon=True)
    saver.start()
    answer_clarification(run_id, "own")  # sent before the form exists
    saver.join(30)
    assert read_state(run_id) == StateType.RUNNING  # resumed
    with get_client(sync_client=True) as client:
        assert orjson.loads(client.read_flow_run_input(run_id, keyset["response"])) == {
            "answer": "own"
        }


def test_answers_to_runs_that_cannot_take_one_are_typed_errors(prefect_harness) -> None:
    with pytest.raises(AnswerRejectedError, match="not a flow run id"):
        answer_clarification("run-42", "own")
    with pytest.raises(AnswerRejectedError, match="there is no flow run"):
        answer_clarification(uuid4(), "own")
    with get_client(sync_client=True) as client:
        run = client.create_flow_run(_never_run)
    with pytest.raises(AnswerRejectedError, match="not waiting for an answer"):
        answer_clarification(run.id, "own")
