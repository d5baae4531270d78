"""Persona graphs on task runners of other processes: a process pool, and Dask.

The tools run in worker processes, so they count their calls in a file (named by
an environment variable the workers inherit) instead of in this process's memory.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from prefect import flow
from prefect.flow_runs import resume_flow_run
from prefect.task_runners import ProcessPoolTaskRunner

from autopersona_flows.agent import Requirement
from autopersona_flows.errors import FlowConfigurationError, GraphError
from autopersona_flows.flows import (
    NodeContext,
    TaskGraph,
    TaskNode,
    pending_clarifications,
    persona_graph,
    persona_runtime,
    persona_task,
)
from autopersona_flows.memory import PersonaMemory

pytestmark = pytest.mark.usefixtures("prefect_harness")

USER = "ada"
QUERY = "Finish my paper on retrieval"
LOG = "AUTOPERSONA_TEST_TOOL_LOG"
CITATION = Requirement("citation style", options=["APA", "MLA"])
SIZE = Requirement("paper size", question="Which paper size should it be printed on?")
FAST = {"poll_interval": 0.5}


def _log(context: NodeContext) -> dict[str, Any]:
    with Path(os.environ[LOG]).open("ab") as log:  # one short append per call: atomic
        log.write(orjson.dumps({"node": context.node.id, "pid": os.getpid()}) + b"\n")
    return {
        "pid": os.getpid(),
        "inputs": sorted(context.inputs),
        "requirements": {name: value.value for name, value in context.requirements.items()},
    }


def logged_tool(context: NodeContext) -> dict[str, Any]:
    """Append the call to the log file, return where it ran and what it was given."""
    return _log(context)


async def async_logged_tool(context: NodeContext) -> dict[str, Any]:
    """`logged_tool` as a coroutine."""
    return _log(context)


def calls(log: Path) -> Counter[str]:
    if not log.exists():
        return Counter()
    return Counter(orjson.loads(line)["node"] for line in log.read_bytes().splitlines())


def paper_graph() -> TaskGraph:
    return TaskGraph(
        [
            TaskNode(id="fetch", tool=logged_tool),
            TaskNode(id="outline", tool=async_logged_tool, depends_on=["fetch"]),
            TaskNode(
                id="draft",
                tool=logged_tool,
                depends_on=["fetch", "outline"],
                requires=[CITATION, SIZE],
            ),
            TaskNode(id="send", tool="test_task_runners:logged_tool", depends_on=["draft"]),
        ]
    )


@pytest.fixture(scope="module")
def log_path(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The log file, named in the environment before any worker process starts."""
    with pytest.MonkeyPatch.context() as patch:
        path = tmp_path_factory.mktemp("tool-log") / "calls.jsonl"
        patch.setenv(LOG, str(path))
        yield path


@pytest.fixture
def log(log_path: Path) -> Path:
    log_path.unlink(missing_ok=True)
    return log_path


@pytest.fixture(scope="module")
def dask_address(log_path: Path) -> Iterator[str]:
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    ) as cluster:
        yield cluster.scheduler_address


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
                for question in waiting.questions:  # one form asks what memory lacks
                    self.asked.append(question.question)
                    given[question.field] = next(
                        a for q, a in self.answers.items() if q in question.question.lower()
                    )
                resume_flow_run(waiting.flow_run_id, run_input=given)


def _run_with_answers(kit, runner: Any, episode: str) -> tuple[list[dict[str, Any]], list[str]]:
    """Run the graph on ``runner``, answering each question; then replay its episode."""
    answering = Answering({"citation": "MLA", "paper size": "A4"})
    answering.start()
    in_processes = persona_graph.with_options(task_runner=runner)
    try:
        with persona_runtime(kit.agent, pause_timeout=60, **FAST):
            results = [
                in_processes(graph=paper_graph(), user_id=USER, query=QUERY, episode_id=episode)
                for _ in range(2)  # the run, whose two questions are answered, then its replay
            ]
    finally:
        answering.stop.set()
        answering.join(10)
    return results, answering.asked


def _check(kit, log: Path, results: list[dict[str, Any]], asked: list[str]) -> None:
    first, replay = results
    assert len(asked) == 2  # both missing requirements, each once, none on the replay
    assert calls(log) == {"fetch": 1, "outline": 1, "draft": 1, "send": 1}  # across both runs
    pids = {orjson.loads(line)["pid"] for line in log.read_bytes().splitlines()}
    assert os.getpid() not in pids  # every tool ran in another process
    draft = first["outputs"]["draft"]
    assert draft["requirements"] == {"citation style": "MLA", "paper size": "A4"}
    assert draft["inputs"] == ["fetch", "outline"]
    assert first["metrics"]["clarifications"] == 2
    assert first["metrics"]["tool_executions"] == 4
    assert [a["answer"] for a in first["decisions"]["draft"]["answers"]] == ["MLA", "A4"]
    assert replay["outputs"] == first["outputs"]
    assert replay["metrics"]["clarifications"] == 0
    assert replay["metrics"]["tool_executions"] == 0
    assert replay["metrics"]["cache_hits"] == 4
    learned = {r.content.topic: r.content.preference for r in kit.store.list(USER, "persona")}
    assert learned == {"citation style": "MLA", "paper size": "A4"}


def test_a_graph_on_dask_pauses_resumes_and_replays_each_tool_once(kit, log, dask_address) -> None:
    from prefect_dask import DaskTaskRunner

    _check(kit, log, *_run_with_answers(kit, DaskTaskRunner(address=dask_address), "dask"))


def test_a_graph_on_a_process_pool_pauses_resumes_and_replays_each_tool_once(kit, log) -> None:
    _check(kit, log, *_run_with_answers(kit, ProcessPoolTaskRunner(max_workers=2), "pool"))


def _nested_tool() -> Any:
    def tool(context: NodeContext) -> str:
        return "never runs"

    return tool


def test_a_tool_a_worker_process_cannot_import_is_refused_before_anything_runs(kit, log) -> None:
    graph = TaskGraph(
        [TaskNode(id="fetch", tool=logged_tool), TaskNode(id="local", tool=_nested_tool())]
    )
    in_processes = persona_graph.with_options(task_runner=ProcessPoolTaskRunner(max_workers=1))
    with (
        persona_runtime(kit.agent, **FAST),
        pytest.raises(GraphError, match=r"'local'.*cannot be imported by path.*top level"),
    ):
        in_processes(graph=graph, user_id=USER, query=QUERY)
    assert calls(log) == {}


@persona_task(requires=[CITATION])
def cite(context: NodeContext, reference: str) -> str:
    return f"{reference} ({context.requirement('citation style').value})"


def test_a_persona_task_runs_directly_but_is_not_submitted_to_other_processes(kit) -> None:
    kit.store.add(USER, PersonaMemory(topic="citation style", preference="MLA"))

    @flow(task_runner=ProcessPoolTaskRunner(max_workers=1))
    def paper() -> str:
        with persona_runtime(kit.agent, user_id=USER, query=QUERY, **FAST):
            direct = cite("Knuth 1984")  # a direct call runs in the flow's process
            with pytest.raises(FlowConfigurationError, match=r"'cite' was submitted to a Proc"):
                cite.submit("Knuth 1984")
            with pytest.raises(FlowConfigurationError, match=r"'cite' was submitted to a Proc"):
                cite.map(["Knuth 1984"])
            return direct

    assert paper() == "Knuth 1984 (MLA)"
