"""What a person reads of a run: the question once, the form preselecting the default, and
each node's constraints its own.

Real runs on the session's Prefect test server: the form is read back as the resume dialog
reads it, refused as the server refuses it, and the decisions table as the UI shows it.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

import orjson
import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    ArtifactFilterKey,
    LogFilter,
    LogFilterFlowRunId,
)
from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter
from prefect.flow_runs import resume_flow_run
from prefect.input import keyset_from_paused_state
from prefect.states import Paused
from prefect.utilities.schema_tools.validation import ValidationError, validate

from autopersona_flows.agent import ClarifyDecision, PersonaRequest, Requirement
from autopersona_flows.flows import PendingClarification, TaskGraph, TaskNode, run_persona_graph
from autopersona_flows.flows.answers import answer_clarification
from autopersona_flows.flows.clarification import clarification_form, questions_form
from autopersona_flows.flows.events import CLARIFICATION_REQUESTED
from autopersona_flows.testing import answering

USER = "ada"
FAST = {"poll_interval": 0.5, "pause_timeout": 120}
SEAT = Requirement("seat", options=["window", "aisle"], default="aisle")
QUESTION = "To book the flight, which seat would you like? Window or aisle?"


def eventually(read: Any, timeout: float = 20.0) -> Any:
    """What ``read`` returns once it is truthy: logs and events reach the server later."""
    import time

    until = time.monotonic() + timeout
    while not (found := read()) and time.monotonic() < until:
        time.sleep(0.2)
    assert found, f"nothing arrived within {timeout} s"
    return found


def log_messages(run_id: UUID) -> list[str]:
    with get_client(sync_client=True) as client:
        logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])))
    return [log.message for log in logs]


def requested_events(run_id: UUID) -> list[Any]:
    with get_client(sync_client=True) as client:
        page = client.read_events(
            EventFilter(
                event=EventNameFilter(name=[CLARIFICATION_REQUESTED]),
                resource=EventResourceFilter(id=[f"prefect.flow-run.{run_id}"]),
            ),
            limit=50,
        )
    return page.events


def decisions_table(run_id: UUID) -> list[dict[str, str]]:
    with get_client(sync_client=True) as client:
        [table] = client.read_artifacts(
            artifact_filter=ArtifactFilter(
                key=ArtifactFilterKey(any_=["persona-decisions"]),
                flow_run_id=ArtifactFilterFlowRunId(any_=[run_id]),
            )
        )
    rows: list[dict[str, str]] = orjson.loads(table.data)
    return rows


@pytest.mark.usefixtures("prefect_harness")
def test_the_question_says_its_options_once_and_the_dialog_preselects_the_default(
    kit, watch_for_pause
) -> None:
    graph = TaskGraph(
        [
            TaskNode(
                id="book_flight", instruction="Book the flight", tool=kit.record, requires=[SEAT]
            )
        ]
    )
    seen: dict[str, Any] = {}

    def person(waiting: PendingClarification) -> None:
        seen["question"] = waiting.question
        keyset = keyset_from_paused_state(Paused(pause_key=waiting.key))
        with get_client(sync_client=True) as client:
            schema = orjson.loads(client.read_flow_run_input(waiting.flow_run_id, keyset["schema"]))
        seen["schema"] = schema
        # The dialog starts on the declared default; the server still wants an answer.
        with pytest.raises(RuntimeError, match="'answer' is a required property"):
            resume_flow_run(waiting.flow_run_id, run_input={})
        answer_clarification(waiting.flow_run_id, "window")

    watcher = watch_for_pause(person)
    result = run_persona_graph(graph, USER, "Fly me to Oslo", agent=kit.agent, **FAST)
    run_id = watcher.finish()

    assert seen["question"] == QUESTION
    answer = seen["schema"]["properties"]["answer"]
    assert (answer["enum"], answer["default"]) == (["window", "aisle"], "aisle")
    assert seen["schema"]["required"] == ["answer"]
    assert result["outputs"]["book_flight"]["answer"] == "window"
    # The log line and the notification's message say the options once: in the question.
    waiting_line = next(
        m for m in eventually(lambda: log_messages(run_id)) if m.startswith("Waiting")
    )
    assert QUESTION in waiting_line
    assert waiting_line.lower().count("aisle") == 1
    [event] = eventually(lambda: requested_events(run_id))
    message = event.payload["message"]
    assert QUESTION in message
    assert message.lower().count("aisle") == 1


def seat_decision(requirement: Requirement, question: str = QUESTION) -> ClarifyDecision:
    return ClarifyDecision(
        question=question,
        requirement=requirement.name,
        options=list(requirement.options),
        request=PersonaRequest(user_id=USER, query="Fly me to Oslo", requirements=[requirement]),
    )


def test_a_default_is_preselected_in_every_form_only_where_it_is_a_valid_answer() -> None:
    size = Requirement("paper size", default="A4")  # free text: the text box starts with it
    text = clarification_form(seat_decision(size, "What paper size would you like?"))
    assert text.model_json_schema()["properties"]["answer"]["default"] == "A4"
    stray = Requirement("seat", options=["window", "aisle"], default="middle")
    schema = clarification_form(seat_decision(stray)).model_json_schema()
    assert "default" not in schema["properties"]["answer"]  # not an option: nothing preselected
    both = questions_form([seat_decision(SEAT), seat_decision(size, "What paper size?")])
    fields = both.model_json_schema()["properties"]
    assert (fields["seat"]["default"], fields["paper_size"]["default"]) == ("aisle", "A4")


def test_the_server_refuses_a_form_left_empty_naming_the_answer_not_an_internal_field() -> None:
    # Prefect's server validates a resume with this function and shows its message in the
    # dialog (a toast): it words the refusal itself; what the schema decides is the name.
    schema = clarification_form(seat_decision(SEAT)).model_json_schema(by_alias=True)
    validate({"answer": "aisle"}, schema, raise_on_error=True)
    with pytest.raises(ValidationError, match=r"^Validation failed\. .*'answer' is a required"):
        validate({}, schema, raise_on_error=True)
    with pytest.raises(ValidationError, match="'middle' is not one of"):
        validate({"answer": "middle"}, schema, raise_on_error=True)


@pytest.mark.usefixtures("prefect_harness")
def test_an_answer_learned_for_one_node_is_no_constraint_of_the_others(kit) -> None:
    graph = TaskGraph(
        [
            TaskNode(id="gather_sources", instruction="Find the papers", tool=kit.record),
            TaskNode(
                id="draft",
                instruction="Draft the summary",
                tool=kit.record,
                depends_on=["gather_sources"],
            ),
            TaskNode(
                id="share",
                instruction="Share the summary with the group",
                tool=kit.record,
                depends_on=["draft"],
                requires=[Requirement("sharing channel")],
            ),
        ]
    )
    query = "Summarise the retrieval papers and share them"  # every node's request
    with answering({"sharing channel": "email the reading group"}) as person:
        first = run_persona_graph(graph, USER, query, agent=kit.agent, **FAST)
    second = run_persona_graph(graph, USER, query, agent=kit.agent, **FAST)  # from memory
    assert [q.answer for q in person.asked] == ["email the reading group"]

    for result in (first, second):
        texts = {
            node: [c["text"] for c in summary["constraints"]]
            for node, summary in result["decisions"].items()
        }
        assert texts["share"] == ["sharing channel: email the reading group"]
        assert texts["gather_sources"] == texts["draft"] == []
    for context in [*kit.contexts["gather_sources"], *kit.contexts["draft"]]:
        assert "reading group" not in context.guidance
    # The run's table, as the UI shows it.
    rows = {row["node"]: row for row in decisions_table(person.asked[0].flow_run_id)}
    assert "reading group" in rows["share"]["constraints"]
    assert rows["gather_sources"]["constraints"] == rows["draft"]["constraints"] == ""
