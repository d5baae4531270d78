"""End to end on a real server: UI-style runs of the deployments in ``prefect.yaml``.

One story, in order (each test builds on the one before; they share the stack):
Ada's history is ingested by the ingestion deployment; a run of the reading-group
deployment suspends on the citation style, refuses an answer that is not an
option, resumes in a new process and completes with every tool run exactly once;
the answer is in Ada's persona memory, so the next run asks nothing; the nightly
maintenance deployment reports the snapshot fingerprint of her bank.
"""

from __future__ import annotations

import time
from uuid import UUID

import orjson
import pytest
from _runs import TOOLS, start, state_names, tool_calls, wait_for
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter
from prefect.flow_runs import resume_flow_run

from autopersona_flows.flows import pending_clarifications
from autopersona_flows.flows.events import CLARIFICATION_ANSWERED
from autopersona_flows.memory import open_store
from autopersona_flows.memory.snapshots import read_snapshot
from examples.reading_group import HISTORY, worklog

pytestmark = pytest.mark.e2e


def test_the_deployments_are_registered_with_the_nightly_schedule(stack) -> None:
    with get_client(sync_client=True) as client:
        nightly = client.read_deployment_by_name("memory-maintenance/nightly")
        runner = client.read_deployment_by_name("persona-graph-runner/reading-group")
        client.read_deployment_by_name("ingest-task-history/from-file")
    (schedule,) = nightly.schedules
    assert (schedule.schedule.cron, schedule.active) == ("0 3 * * *", True)
    assert runner.parameters["user_id"] == "ada"
    # Its run form may name tools from the example module only.
    assert runner.job_variables["env"] == {
        "PREFECT_INTEGRATIONS_AUTOPERSONA_TOOL_MODULES": "examples"
    }
    # The run form is typed: the graph is a GraphSpec, not a free JSON field.
    assert "GraphSpec" in orjson.dumps(runner.parameter_openapi_schema).decode()


def test_history_is_ingested_by_the_ingestion_deployment(stack) -> None:
    history = stack.root / "history.jsonl"
    history.write_bytes(b"".join(r.model_dump_json().encode() + b"\n" for r in HISTORY))

    run = wait_for(start("ingest-task-history/from-file", {"path": str(history)}), "Completed")

    with get_client(sync_client=True) as client:
        progress = client.read_latest_artifacts()
    by_key = {artifact.key: artifact for artifact in progress}
    assert by_key["autopersona-ingestion"].data == 100.0
    topics = {m.content.topic for m in open_store(stack.store).list("ada", "persona")}
    assert topics == {"summary length", "tone", "sharing channel"}
    assert run.state.is_completed()


def test_a_ui_run_suspends_asks_rejects_a_bad_answer_and_resumes_without_repeating_tools(
    stack,
) -> None:
    run_id = start("persona-graph-runner/reading-group")
    run = wait_for(run_id, "Suspended")

    # The question, as the resume dialog shows it: the run input's description ...
    (waiting,) = [p for p in pending_clarifications() if p.flow_run_id == run_id]
    assert waiting.state == "Suspended"
    assert waiting.question == (
        "To format the references, which citation style would you like? APA, MLA or Chicago?"
    )
    assert waiting.options == ["APA", "MLA", "Chicago"]
    keyset = run.state.state_details.run_input_keyset
    with get_client(sync_client=True) as client:
        description = orjson.loads(client.read_flow_run_input(run_id, keyset["description"]))
        artifacts = client.read_artifacts()
    assert waiting.question in description
    # ... and the clarification artifact of the run.
    (artifact,) = [a for a in artifacts if a.key == waiting.key and a.flow_run_id == run_id]
    assert waiting.question in artifact.data
    # Asked before any work: no tool has run yet.
    assert tool_calls(stack) == {}

    with pytest.raises(RuntimeError, match="Validation failed"):
        resume_flow_run(run_id, run_input={"answer": "Harvard"})
    assert wait_for(run_id, "Suspended").state.name == "Suspended"

    resume_flow_run(run_id, run_input={"answer": "APA"})
    wait_for(run_id, "Completed")
    # The answer leaves its trail in the resumed process, which read it back from the
    # run's input: the artifact's answered version, the log line, the event (logs and
    # events reach the server a little later).
    shown, logs, answered = answer_trail(run_id, waiting.key)
    assert len(shown) == 2  # asked, then answered: the question is not shown again
    assert sum("Answer: **APA**" in a.data for a in shown) == 1
    assert any(m.startswith("Answered") and "'APA'" in m for m in logs)
    assert len(answered) == 1

    assert tool_calls(stack) == dict.fromkeys(TOOLS, 1)  # across both processes
    # All of them in the resumed process: the first one only asked.
    processes = {line["tool"]: line["pid"] for line in worklog(stack.worklog)}
    assert len(set(processes.values())) == 1
    assert "Resuming" in state_names(run_id)
    persona = open_store(stack.store).list("ada", "persona")
    assert ("citation style", "APA") in {(m.content.topic, m.content.preference) for m in persona}


def answer_trail(run_id: UUID, key: str, timeout: float = 30) -> tuple[list, list[str], list]:
    """The run's clarification artifacts, log messages and answered events, once all came."""
    until = time.monotonic() + timeout
    while True:
        with get_client(sync_client=True) as client:
            shown = [a for a in client.read_artifacts() if a.key == key]
            logs = [
                log.message
                for log in client.read_logs(
                    LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id]))
                )
            ]
            answered = client.read_events(
                EventFilter(
                    event=EventNameFilter(name=[CLARIFICATION_ANSWERED]),
                    resource=EventResourceFilter(id=[f"prefect.flow-run.{run_id}"]),
                ),
                limit=50,
            ).events
        arrived = len(shown) >= 2 and answered and any(m.startswith("Answered") for m in logs)
        if arrived or time.monotonic() > until:
            return shown, logs, answered
        time.sleep(0.5)


def test_the_next_run_asks_nothing(stack) -> None:
    run_id = start("persona-graph-runner/reading-group")
    wait_for(run_id, "Completed")

    assert "Suspended" not in state_names(run_id)
    assert tool_calls(stack) == dict.fromkeys(TOOLS, 2)


def test_the_maintenance_deployment_reports_the_snapshot_fingerprint(stack) -> None:
    run_id = start("memory-maintenance/nightly")
    wait_for(run_id, "Completed")

    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts()
    (report,) = [a for a in artifacts if a.key == "autopersona-maintenance"]
    (row,) = orjson.loads(report.data)
    fingerprint = open_store(stack.store).snapshot_fingerprint("ada")
    assert (row["user"], row["fingerprint"]) == ("ada", f"sha256:{fingerprint}")
    snapshot = read_snapshot(row["snapshot"])
    assert snapshot.fingerprint == fingerprint
    assert snapshot.user_id == "ada"
    assert "plain and friendly" not in report.data  # counts and ids, never contents


def test_the_review_deployment_is_paused_until_someone_turns_it_on(stack) -> None:
    with get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name("memory-review/review")
    assert deployment.paused
    assert deployment.parameters == {"user_id": "ada"}
