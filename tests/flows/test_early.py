"""Asking early: what a graph needs and memory lacks is asked before its first tool runs."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from prefect.flow_runs import resume_flow_run

from autopersona_flows.agent import PersonaAgent, Requirement
from autopersona_flows.flows import (
    PendingClarification,
    TaskGraph,
    TaskNode,
    pending_clarifications,
    run_persona_graph,
)
from autopersona_flows.flows.early import early_requirements
from autopersona_flows.memory import MemoryRetriever, PersonaMemory

pytestmark = pytest.mark.usefixtures("prefect_harness")

USER = "ada"
QUERY = "Finish my paper on retrieval and share it"
CITATION = Requirement("citation style", options=["APA", "MLA"])
CHANNEL = Requirement("sharing channel", question="Where should the paper be shared?")
REVIEWER = Requirement(
    "reviewer", question="Who should review the draft?", ask="at_node", options=["Bo", "Cy"]
)
FAST = {"poll_interval": 0.3, "pause_timeout": 60}
ANSWERS = {"citation": "MLA", "shared": "the team channel", "review": "Bo"}


class Answering(threading.Thread):
    """Plays the person: answers each question, noting which tools had run by then."""

    def __init__(self, kit: Any) -> None:
        super().__init__(daemon=True)
        self.kit = kit
        self.asked: list[tuple[str, dict[str, int]]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        seen: set[tuple[Any, str]] = set()
        while not self.stop.wait(0.1):
            for waiting in pending_clarifications():
                if (waiting.flow_run_id, waiting.key) not in seen:
                    seen.add((waiting.flow_run_id, waiting.key))
                    self.answer(waiting)

    def answer(self, waiting: PendingClarification) -> None:
        self.asked.append(([q.question for q in waiting.questions], dict(self.kit.calls)))
        answers = {
            q.field: next(a for word, a in ANSWERS.items() if word in q.question.lower())
            for q in waiting.questions
        }
        resume_flow_run(waiting.flow_run_id, run_input=answers)

    def __enter__(self) -> Answering:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.join(10)


def paper_graph(kit: Any) -> TaskGraph:
    return TaskGraph(
        [
            TaskNode(id="fetch", tool=kit.record),
            TaskNode(id="draft", tool=kit.record, depends_on=["fetch"], requires=[CITATION]),
            TaskNode(id="review", tool=kit.record, depends_on=["draft"], requires=[REVIEWER]),
            TaskNode(
                id="cite", tool=kit.record, depends_on=["review"], requires=[CITATION, CHANNEL]
            ),
            TaskNode(id="share", tool=kit.record, depends_on=["cite"], requires=[CHANNEL]),
        ]
    )


def test_what_memory_lacks_is_asked_before_any_tool_runs_once_each(kit) -> None:
    graph = paper_graph(kit)
    with Answering(kit) as person:
        result = run_persona_graph(graph, USER, QUERY, agent=kit.agent, episode_id="early", **FAST)

    # The two early requirements are asked in one form before the first tool, each
    # once though two nodes need each; the reviewer, asked at its node, once the
    # draft exists.
    [(early, before), (late, after)] = person.asked
    assert len(early) == 2
    assert "citation style" in early[0].lower()
    assert "shared" in early[1].lower()
    assert before == {}
    assert late == [REVIEWER.question]
    assert after == {"fetch": 1, "draft": 1}
    assert result["metrics"]["clarifications"] == 3
    assert kit.calls == {"fetch": 1, "draft": 1, "review": 1, "cite": 1, "share": 1}

    # Every node that needs an answer has it, structured, as answered in this run.
    cite = kit.contexts["cite"][0]
    assert cite.requirement("citation style").value == "MLA"
    assert cite.requirement("citation style").source == "answered"
    assert cite.requirement("sharing channel").value == "the team channel"
    assert kit.contexts["share"][0].requirement("sharing channel").value == "the team channel"
    assert kit.contexts["review"][0].requirement("reviewer").value == "Bo"
    learned = {r.content.topic: r.content.preference for r in kit.store.list(USER, "persona")}
    assert learned == {
        "citation style": "MLA",
        "sharing channel": "the team channel",
        "reviewer": "Bo",
    }

    # A replay of the episode asks nothing and runs nothing again.
    with Answering(kit) as person:
        replay = run_persona_graph(graph, USER, QUERY, agent=kit.agent, episode_id="early", **FAST)
    assert person.asked == []
    assert replay["metrics"]["tool_executions"] == 0
    assert replay["outputs"] == result["outputs"]

    # A new run for the same user knows it all: nothing is asked.
    with Answering(kit) as person:
        again = run_persona_graph(graph, USER, QUERY, agent=kit.agent, **FAST)
    assert person.asked == []
    assert again["metrics"]["clarifications"] == 0


def test_a_graph_whose_requirements_memory_holds_asks_nothing_and_decides_once(kit) -> None:
    kit.store.add(USER, PersonaMemory(topic="citation style", preference="APA"))
    graph = TaskGraph(
        [
            TaskNode(id="fetch", tool=kit.record),
            TaskNode(id="draft", tool=kit.record, depends_on=["fetch"], requires=[CITATION]),
        ]
    )
    result = run_persona_graph(graph, USER, QUERY, agent=kit.agent, **FAST)
    assert result["metrics"]["clarifications"] == 0
    # 'draft' has one requirement: its check is its decision, not made twice.
    assert result["metrics"]["decisions"] == 2
    assert kit.contexts["draft"][0].requirement("citation style").value == "APA"
    assert kit.contexts["draft"][0].requirement("citation style").source == "memory"


def test_early_requirements_are_the_required_early_ones_each_name_once() -> None:
    optional = Requirement("tone", required=False)
    graph = TaskGraph(
        [
            TaskNode(id="a", tool=len, requires=[CITATION, optional]),
            TaskNode(
                id="b",
                tool=len,
                depends_on=["a"],
                requires=[Requirement("Citation Style"), REVIEWER, CHANNEL],
            ),
        ]
    )
    assert [(node.id, r.name) for node, r in early_requirements(graph)] == [
        ("a", "citation style"),
        ("b", "sharing channel"),
    ]


def test_an_answer_in_other_words_than_the_options_is_taken_where_the_requirement_allows(
    kit,
) -> None:
    style = Requirement("citation style", options=["APA", "MLA"], allow_other=True)
    graph = TaskGraph([TaskNode(id="cite", tool=kit.record, requires=[style])])

    def person() -> None:
        until = time.monotonic() + 60
        while not (waiting := pending_clarifications()) and time.monotonic() < until:
            time.sleep(0.1)
        resume_flow_run(waiting[0].flow_run_id, run_input={"answer": "Harvard"})

    thread = threading.Thread(target=person, daemon=True)
    thread.start()
    run_persona_graph(graph, USER, QUERY, agent=kit.agent, **FAST)
    thread.join(10)

    assert kit.contexts["cite"][0].requirement("citation style").value == "Harvard"
    [learned] = kit.store.list(USER, "persona")
    assert (learned.content.topic, learned.content.preference) == ("citation style", "Harvard")


class NotingAgent(PersonaAgent):
    """A PersonaAgent that notes, for each node it decides, how many tools had run
    by then and how many persona memories the person had."""

    def __init__(self, kit: Any) -> None:
        super().__init__(MemoryRetriever(kit.store))
        self.kit = kit
        self.noted: list[tuple[str, int, int]] = []

    def decide(self, request: Any) -> Any:
        persona = len(self.kit.store.list(request.user_id, "persona"))
        self.noted.append((request.node.id, sum(self.kit.calls.values()), persona))
        return super().decide(request)


def test_nodes_whose_early_requirements_memory_holds_are_decided_before_any_tool(kit) -> None:
    kit.store.add(USER, PersonaMemory(topic="citation style", preference="APA"))
    kit.store.add(USER, PersonaMemory(topic="sharing channel", preference="the team channel"))
    kit.store.add(USER, PersonaMemory(topic="reviewer", preference="Bo"))
    agent = NotingAgent(kit)
    graph = TaskGraph(
        [
            TaskNode(id="fetch", tool=kit.record),
            TaskNode(id="draft", tool=kit.record, depends_on=["fetch"], requires=[CITATION]),
            TaskNode(
                id="cite", tool=kit.record, depends_on=["draft"], requires=[CITATION, CHANNEL]
            ),
            TaskNode(id="share", tool=kit.record, depends_on=["cite"], requires=[CHANNEL]),
            TaskNode(id="review", tool=kit.record, depends_on=["share"], requires=[REVIEWER]),
        ]
    )
    result = run_persona_graph(graph, USER, QUERY, agent=agent, episode_id="held", **FAST)

    # The early check decides every node whose requirements are all early, in its one
    # step: before the flow body decides the others ('fetch' first), each once.
    order = [node for node, _, _ in agent.noted]
    assert order[:2] == ["draft", "cite"]  # each early requirement, at its first node
    assert sorted(order[2:4]) == ["cite", "share"]  # each such node, with its own request
    assert order[4:] == ["fetch", "review"]
    assert all(ran == 0 for _, ran, _ in agent.noted[:4])
    assert result["metrics"]["clarifications"] == 0
    assert kit.contexts["cite"][0].requirement("citation style").value == "APA"
    assert kit.contexts["cite"][0].requirement("sharing channel").source == "memory"
    assert kit.contexts["share"][0].requirement("sharing channel").source == "memory"

    # A replay decides none of them again.
    agent.noted.clear()
    replay = run_persona_graph(graph, USER, QUERY, agent=agent, episode_id="held", **FAST)
    assert agent.noted == []
    assert replay["metrics"]["tool_executions"] == 0


def test_after_an_early_answer_each_node_decides_with_it_in_memory(kit) -> None:
    kit.store.add(USER, PersonaMemory(topic="citation style", preference="APA"))
    agent = NotingAgent(kit)
    graph = TaskGraph(
        [
            TaskNode(id="draft", tool=kit.record, requires=[CITATION]),
            TaskNode(id="share", tool=kit.record, depends_on=["draft"], requires=[CHANNEL]),
        ]
    )
    with Answering(kit) as person:
        run_persona_graph(graph, USER, QUERY, agent=agent, episode_id="learned", **FAST)

    # The check found the citation style in memory and asked for the channel. The
    # decision 'draft' runs with is made after the answer is learned, not the check's.
    [(asked, _)] = person.asked
    assert "shared" in asked[0].lower()
    last = {node: persona for node, _, persona in agent.noted}
    assert last == {"draft": 2, "share": 2}
    assert kit.contexts["draft"][0].requirement("citation style").source == "memory"
    assert kit.contexts["share"][0].requirement("sharing channel").source == "answered"
