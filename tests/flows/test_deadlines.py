"""Nobody answers in time, or a run may ask no more: declared defaults, or a clear failure."""

from __future__ import annotations

import threading
import time

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
from prefect.client.schemas.sorting import ArtifactSort

from autopersona_flows.agent import Requirement
from autopersona_flows.errors import ClarificationBudgetError, ClarificationTimeoutError
from autopersona_flows.flows import (
    TaskGraph,
    TaskNode,
    answer_clarification,
    pending_clarifications,
    run_persona_graph,
)

pytestmark = pytest.mark.usefixtures("prefect_harness")

USER = "ada"
QUERY = "Print my paper"
CITATION = Requirement("citation style", options=["APA", "MLA"], default="APA")
PAPER = Requirement("paper size", question="Which paper size should it be printed on?")
SIZED = Requirement("paper size", question="Which paper size?", default="A4")
QUICK = {"poll_interval": 0.2, "pause_timeout": 2}


def graph(kit, *requires: Requirement) -> TaskGraph:
    return TaskGraph(
        [
            TaskNode(id="fetch", tool=kit.record),
            TaskNode(id="print", tool=kit.record, depends_on=["fetch"], requires=list(requires)),
        ]
    )


def latest_artifact(key_prefix: str) -> str:
    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(sort=ArtifactSort.UPDATED_DESC, limit=50)
    return next(a.data for a in artifacts if (a.key or "").startswith(key_prefix))


def test_nobody_answering_in_time_runs_with_the_declared_default_never_learned(kit) -> None:
    options = {"agent": kit.agent, "episode_id": "deadline", "on_timeout": "default", **QUICK}
    result = run_persona_graph(graph(kit, CITATION), USER, QUERY, **options)

    [printing] = kit.contexts["print"]
    value = printing.requirement("citation style")
    assert (value.value, value.source, value.memory_id) == ("APA", "default", None)
    assert result["metrics"]["clarifications"] == 1
    assert result["decisions"]["print"]["answers"][0] | {"question": ""} == {
        "question": "",
        "requirement": "citation style",
        "answer": "APA",
        "default": True,
    }
    assert kit.store.list(USER, "persona") == []  # a default is not the person's preference
    assert "Ran with the declared default: **APA**" in latest_artifact("clarify-")
    with get_client(sync_client=True) as client:
        [table] = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["persona-decisions"])),
            sort=ArtifactSort.UPDATED_DESC,
            limit=1,
        )
    assert "APA (default: nobody answered)" in str(table.data)

    # The replay runs with the same default: nothing asked, nothing run again.
    replay = run_persona_graph(graph(kit, CITATION), USER, QUERY, **options)
    assert replay["metrics"]["clarifications"] == 0
    assert replay["metrics"]["tool_executions"] == 0
    assert replay["outputs"] == result["outputs"]


def test_a_requirement_without_a_default_still_fails_the_run_saying_so(kit) -> None:
    with pytest.raises(ClarificationTimeoutError, match=r"has no default to run with"):
        run_persona_graph(
            graph(kit, PAPER), USER, QUERY, agent=kit.agent, on_timeout="default", **QUICK
        )
    assert kit.calls == {}


def test_past_the_question_budget_a_default_is_used_and_without_one_nothing_runs(kit) -> None:
    asked: list[list[str]] = []

    def person() -> None:
        until = time.monotonic() + 30
        while not (waiting := pending_clarifications()) and time.monotonic() < until:
            time.sleep(0.1)
        asked.append([q.question for q in waiting[0].questions])
        answer_clarification(waiting[0].flow_run_id, "MLA")

    thread = threading.Thread(target=person, daemon=True)
    thread.start()
    citation = Requirement("citation style", options=["APA", "MLA"])
    result = run_persona_graph(
        graph(kit, citation, SIZED), USER, QUERY, agent=kit.agent, question_budget=1, **QUICK
    )
    thread.join(10)

    assert len(asked) == 1
    assert len(asked[0]) == 1  # one question asked; the other, past the budget, defaulted
    printing = kit.contexts["print"][0]
    assert printing.requirement("citation style").value == "MLA"
    assert printing.requirement("citation style").source == "answered"
    assert (
        printing.requirement("paper size").value,
        printing.requirement("paper size").source,
    ) == (
        "A4",
        "default",
    )
    assert result["metrics"]["clarifications"] == 1

    kit.calls.clear()
    with pytest.raises(ClarificationBudgetError, match=r"budget is spent.*Which paper size should"):
        run_persona_graph(
            graph(kit, PAPER), "bo", QUERY, agent=kit.agent, question_budget=0, **QUICK
        )
    assert kit.calls == {}
    assert pending_clarifications() == []


def test_after_a_default_the_run_is_running_again_and_asks_its_next_question(kit) -> None:
    at_node = Requirement("paper size", options=["A4", "Letter"], default="A4", ask="at_node")
    two = TaskGraph(
        [
            TaskNode(
                id="cite", instruction="Format the citations", tool=kit.record, requires=[CITATION]
            ),
            TaskNode(
                id="refs",
                instruction="Write the bibliography",
                tool=kit.record,
                requires=[CITATION],
                depends_on=["cite"],
            ),
            TaskNode(
                id="print",
                instruction="Print the paper",
                tool=kit.record,
                requires=[at_node],
                depends_on=["refs"],
            ),
        ]
    )
    result = run_persona_graph(two, USER, QUERY, agent=kit.agent, on_timeout="default", **QUICK)
    assert kit.calls == {"cite": 1, "refs": 1, "print": 1}
    assert result["outputs"]["refs"]["answer"] == "APA"
    assert result["outputs"]["print"]["answer"] == "A4"
    # The defaulted citation style is not asked again at `refs`: two waits, not three.
    assert result["metrics"]["clarifications"] == 2
    assert pending_clarifications() == []
