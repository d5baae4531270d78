"""A learned answer says which flow run, node and question taught it, on a real Prefect run."""

from __future__ import annotations

from pathlib import Path

import pytest
from prefect.flow_runs import resume_flow_run

from autopersona_flows.agent import PersonaAgent, Requirement
from autopersona_flows.flows import PendingClarification, TaskGraph, TaskNode, run_persona_graph
from autopersona_flows.memory import MemoryBank, open_store
from autopersona_flows.memory.provenance import Provenance

pytestmark = pytest.mark.usefixtures("prefect_harness")

USER = "ada"
QUESTION = "Which citation style should the paper use?"
CITATION = Requirement("citation style", options=["APA", "MLA"], question=QUESTION)


@pytest.fixture(params=["jsonl", "postgres"])
def address(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "jsonl":
        return str(tmp_path / "store")
    return request.getfixturevalue("postgres_schema")


def test_a_learned_answer_records_the_run_node_and_question(
    address: str, kit, watch_for_pause
) -> None:
    graph = TaskGraph(
        [TaskNode(id="draft", instruction="Draft", tool=kit.record, requires=[CITATION])]
    )

    def answer(waiting: PendingClarification) -> None:
        resume_flow_run(waiting.flow_run_id, run_input={"answer": "APA"})

    watcher = watch_for_pause(answer)
    agent = PersonaAgent(MemoryBank(address))
    run_persona_graph(
        graph, USER, "Finish my paper", agent=agent, pause_timeout=60, poll_interval=0.5
    )
    flow_run_id = watcher.finish()

    (memory,) = open_store(address).list(USER, "persona")  # a fresh store object
    assert memory.content.preference == "APA"  # type: ignore[union-attr]
    assert memory.provenance == Provenance.clarification(
        QUESTION, node="draft", flow_run_id=str(flow_run_id)
    )
