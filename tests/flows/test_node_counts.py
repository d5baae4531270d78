"""How often each node consults the agent, runs its tool and learns: pinned, per node.

One graph with a node whose requirement is asked early (before any tool), one asked
when its node is reached (``ask="at_node"``), a quiet node (nothing to ask) and one
whose requirement memory already holds; and a `persona_task` in a flow of one's own.
The first run answers both questions; its replay decides nothing, learns nothing and
runs no tool. The same on a `ProcessPoolTaskRunner`, whose tools run in other
processes: every call is counted in a file, wherever it happens.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
from prefect import flow
from prefect.flow_runs import resume_flow_run
from prefect.task_runners import ProcessPoolTaskRunner, ThreadPoolTaskRunner

from autopersona_flows.agent import PersonaAgent, Requirement
from autopersona_flows.flows import (
    NodeContext,
    TaskGraph,
    TaskNode,
    pending_clarifications,
    persona_graph,
    persona_runtime,
    persona_task,
)
from autopersona_flows.memory import MemoryRetriever, PersonaMemory

pytestmark = pytest.mark.usefixtures("prefect_harness")

USER = "ada"
QUERY = "Finish my paper on retrieval"
LOG = "AUTOPERSONA_TEST_COUNT_LOG"
CITATION = Requirement("citation style", options=["APA", "MLA"])
CHANNEL = Requirement("sharing channel", ask="at_node")
TONE = Requirement("tone")
FAST = {"poll_interval": 0.5}


def _note(kind: str, node: str) -> None:
    with Path(os.environ[LOG]).open("ab") as log:  # one short append per call: atomic
        log.write(orjson.dumps({"kind": kind, "node": node, "pid": os.getpid()}) + b"\n")


class CountingAgent(PersonaAgent):
    """A PersonaAgent that notes every decide and learn, by node, in the log file."""

    def decide(self, request: Any) -> Any:
        node = request.node.id if hasattr(request, "node") else request["node"]["id"]
        _note("decide", node)
        return super().decide(request)

    def learn(self, user_id: str, decision: Any, answer: Any, **kwargs: Any) -> Any:
        _note("learn", kwargs.get("node") or decision.request.node.id)
        return super().learn(user_id, decision, answer, **kwargs)


def counted_tool(context: NodeContext) -> dict[str, Any]:
    """Note the run; return the requirement values it was given."""
    _note("tool", context.node.id)
    return {name: value.value for name, value in context.requirements.items()}


def counts(log: Path) -> Counter[tuple[str, str]]:
    if not log.exists():
        return Counter()
    lines = log.read_bytes().splitlines()
    return Counter((row["kind"], row["node"]) for row in map(orjson.loads, lines))


def graph() -> TaskGraph:
    return TaskGraph(
        [
            TaskNode(id="fetch", tool=counted_tool),  # quiet: nothing to ask
            TaskNode(id="draft", tool=counted_tool, depends_on=["fetch"], requires=[CITATION]),
            TaskNode(id="polish", tool=counted_tool, depends_on=["draft"], requires=[TONE]),
            TaskNode(id="send", tool=counted_tool, depends_on=["polish"], requires=[CHANNEL]),
        ]
    )


@persona_task(requires=[Requirement("paper size", options=["A4", "Letter"])])
def print_paper(context: NodeContext, title: str) -> str:
    _note("tool", context.node.id)
    return f"{title} on {context.requirement('paper size').value}"


class Answering(threading.Thread):
    """Answers every question runs ask, by a word it contains, until stopped."""

    def __init__(self, answers: dict[str, str]) -> None:
        super().__init__(daemon=True)
        self.answers = answers
        self.asked: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        answered: set[tuple[Any, str]] = set()
        while not self.stop.wait(0.1):
            for waiting in pending_clarifications():
                if (waiting.flow_run_id, waiting.key) in answered:
                    continue
                answered.add((waiting.flow_run_id, waiting.key))
                given = {}
                for question in waiting.questions:
                    self.asked.append(question.question)
                    given[question.field] = next(
                        a for q, a in self.answers.items() if q in question.question.lower()
                    )
                resume_flow_run(waiting.flow_run_id, run_input=given)


@pytest.fixture
def log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The count file, named in the environment before any worker process starts."""
    path = tmp_path / "counts.jsonl"
    monkeypatch.setenv(LOG, str(path))
    return path


@pytest.mark.parametrize(
    "runner",
    [
        pytest.param(lambda: ThreadPoolTaskRunner(max_workers=4), id="threads"),
        pytest.param(lambda: ProcessPoolTaskRunner(max_workers=2), id="processes"),
    ],
)
def test_each_node_decides_learns_and_runs_as_pinned_and_its_replay_does_nothing(
    kit, log: Path, runner: Any, request: pytest.FixtureRequest
) -> None:
    episode = f"counted-{request.node.callspec.id}"  # each runner its own cache keys
    kit.store.add(USER, PersonaMemory(topic="tone", preference="formal"))
    agent = CountingAgent(MemoryRetriever(kit.store))
    on_runner = persona_graph.with_options(task_runner=runner())

    @flow(task_runner=runner())
    def printing(episode: str) -> str:
        with persona_runtime(agent, user_id=USER, query=QUERY, episode_id=episode, **FAST):
            return print_paper("Retrieval")

    person = Answering({"citation": "MLA", "sharing": "the team channel", "paper size": "A4"})
    person.start()
    try:
        with persona_runtime(agent, pause_timeout=60, **FAST):
            first = on_runner(graph=graph(), user_id=USER, query=QUERY, episode_id=episode)
        printed = printing(f"printed-{episode}")
        first_counts = counts(log)
        log.unlink()
        with persona_runtime(agent, pause_timeout=60, **FAST):
            replay = on_runner(graph=graph(), user_id=USER, query=QUERY, episode_id=episode)
        printed_again = printing(f"printed-{episode}")
    finally:
        person.stop.set()
        person.join(10)

    assert len(person.asked) == 3  # citation style early, the channel at its node, the size
    assert first_counts == {
        # The early check reads memory for the citation style (at 'draft', its first
        # node) and for the tone (at 'polish'); once an answer is learned, each node
        # with a requirement decides again, with it in memory.
        ("decide", "draft"): 2,
        ("decide", "polish"): 2,
        ("decide", "fetch"): 1,
        ("decide", "send"): 2,  # before its question, and after the answer
        ("decide", "print_paper"): 2,
        ("learn", "draft"): 1,
        ("learn", "send"): 1,
        ("learn", "print_paper"): 1,
        ("tool", "fetch"): 1,
        ("tool", "draft"): 1,
        ("tool", "polish"): 1,
        ("tool", "send"): 1,
        ("tool", "print_paper"): 1,
    }
    assert first["outputs"]["draft"] == {"citation style": "MLA"}
    assert first["outputs"]["polish"] == {"tone": "formal"}
    assert first["outputs"]["send"] == {"sharing channel": "the team channel"}
    assert printed == "Retrieval on A4"

    assert counts(log) == {}  # the replay: no decide, no learn, no tool
    assert replay["outputs"] == first["outputs"]
    assert replay["metrics"]["tool_executions"] == 0
    assert replay["metrics"]["decisions"] == 0
    assert printed_again == printed
