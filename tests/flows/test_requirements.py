"""A node missing several requirements asks each (a graph in one form); its tool gets them all."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from prefect import flow

from autopersona_flows.agent import Requirement
from autopersona_flows.flows import (
    NodeContext,
    TaskGraph,
    TaskNode,
    answer_clarification,
    pending_clarifications,
    persona_runtime,
    persona_task,
    run_persona_graph,
)

pytestmark = pytest.mark.usefixtures("prefect_harness")

STYLE = Requirement("citation style", options=["APA", "MLA", "Chicago"])
PAPER = Requirement("paper size", options=["A4", "Letter"])
ANSWERS = {"citation style": "MLA", "paper size": "Letter"}


class Answerer(threading.Thread):
    """Answers every question a run asks, by the option set it offers, and keeps them."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.asked: list[str] = []
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            answered: set[tuple[object, str]] = set()
            while not self.halt.is_set():
                for waiting in pending_clarifications():
                    if (waiting.flow_run_id, waiting.key) in answered:
                        continue
                    answered.add((waiting.flow_run_id, waiting.key))
                    given = {}
                    for question in waiting.questions:  # one form may ask several
                        (name,) = [
                            n
                            for n, r in (("citation style", STYLE), ("paper size", PAPER))
                            if set(question.options) == set(r.options)
                        ]
                        self.asked.append(name)
                        given[question.field] = ANSWERS[name]
                    answer_clarification(waiting.flow_run_id, given)
                time.sleep(0.1)
        except BaseException as exc:  # re-raised by the test
            self.error = exc

    def stop(self) -> list[str]:
        self.halt.set()
        self.join(30)
        if self.error is not None:
            raise self.error
        return self.asked


@pytest.fixture
def answerer() -> Iterator[Answerer]:
    thread = Answerer()
    thread.start()
    yield thread
    thread.halt.set()
    thread.join(30)


def values(context: NodeContext) -> dict[str, tuple[str | None, str]]:
    return {name: (r.value, r.source) for name, r in context.requirements.items()}


def test_every_missing_requirement_is_asked_and_reaches_the_tool(kit, answerer) -> None:
    graph = TaskGraph(
        [
            TaskNode(id="outline", tool=kit.record),
            TaskNode(
                id="typeset", tool=kit.record, depends_on=["outline"], requires=[STYLE, PAPER]
            ),
        ]
    )
    options = {
        "agent": kit.agent,
        "episode_id": "paper-1",
        "result_storage": kit.results,
        "poll_interval": 0.5,
        "pause_timeout": 60,
    }
    first = run_persona_graph(graph, "ada", "Typeset my paper", **options)
    assert sorted(answerer.stop()) == ["citation style", "paper size"]

    (context,) = kit.contexts["typeset"]
    assert values(context) == {
        "citation style": ("MLA", "answered"),
        "paper size": ("Letter", "answered"),
    }
    learned = {r.content.topic: r for r in kit.store.list("ada", "persona")}
    assert context.requirement("paper size").memory_id == learned["paper size"].id
    assert [a.answer for a in context.answers] == [ANSWERS[a.requirement] for a in context.answers]
    assert first["metrics"]["clarifications"] == 2
    assert first["decisions"]["typeset"]["action"] == "final"
    assert [(q["requirement"], q["answer"]) for q in first["decisions"]["typeset"]["answers"]] == [
        (a.requirement, a.answer) for a in context.answers
    ]

    replay = run_persona_graph(graph, "ada", "Typeset my paper", **options)
    assert replay["metrics"]["clarifications"] == 0
    assert dict(kit.calls) == {"outline": 1, "typeset": 1}
    assert replay["outputs"] == first["outputs"]

    # A new episode knows both from memory and asks nothing.
    later = run_persona_graph(graph, "ada", "Typeset my paper", **{**options, "episode_id": "2"})
    assert later["metrics"]["clarifications"] == 0
    assert values(kit.contexts["typeset"][-1]) == {
        "citation style": ("MLA", "memory"),
        "paper size": ("Letter", "memory"),
    }


SEEN: list[NodeContext] = []


@persona_task(requires=[STYLE, PAPER])
def typeset(context: NodeContext, title: str) -> dict:
    """Typeset the paper."""
    SEEN.append(context)
    return {"title": title, **{name: r.value for name, r in context.requirements.items()}}


@flow
def write(agent, episode_id: str) -> dict:
    with persona_runtime(
        agent,
        user_id="bo",
        query="Write",
        poll_interval=0.5,
        pause_timeout=60,
        episode_id=episode_id,
    ):
        return typeset("On memory")


def test_a_persona_task_asks_every_missing_requirement(kit, answerer) -> None:
    SEEN.clear()
    assert write(kit.agent, "e-1") == {"title": "On memory", **ANSWERS}
    assert sorted(answerer.stop()) == ["citation style", "paper size"]
    assert write(kit.agent, "e-1") == {"title": "On memory", **ANSWERS}
    assert len(SEEN) == 1  # the replay ran nothing again


def looks_up(context: NodeContext) -> dict[str, str | None]:
    """Look up a declared requirement, one declared without a value, and a typo."""
    try:
        context.requirement("citaton style")
    except KeyError as exc:
        typo = exc.args[0]
    else:
        typo = "no error"
    held = context.requirement("citation style")
    optional = context.requirement("reviewer")
    return {
        "held": held.value if held else None,
        "optional": optional.value if optional else None,
        "typo": typo,
    }


def test_a_requirement_the_node_never_declared_is_a_key_error_naming_those_it_did(kit) -> None:
    from autopersona_flows.memory import PersonaMemory

    kit.store.add("ada", PersonaMemory(topic="citation style", preference="APA"))
    reviewer = Requirement("reviewer", required=False)
    graph = TaskGraph([TaskNode(id="cite", tool=looks_up, requires=[STYLE, reviewer])])

    result = run_persona_graph(graph, "ada", "Finish my paper", agent=kit.agent, poll_interval=0.5)

    assert result["outputs"]["cite"] == {
        "held": "APA",
        "optional": None,
        "typo": "'cite' declares no requirement 'citaton style'; it declares "
        "'citation style', 'reviewer'",
    }
