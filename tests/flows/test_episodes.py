"""An answer the server has but the asking run never kept is found by the episode's replay."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import orjson
import prefect.settings as ps
import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import StateType
from prefect.filesystems import LocalFileSystem

from autopersona_flows.agent import ClarifyDecision, Requirement
from autopersona_flows.errors import ClarificationTimeoutError
from autopersona_flows.flows import TaskGraph, TaskNode, answer_clarification, run_persona_graph
from autopersona_flows.flows.clarification import clarification_key
from autopersona_flows.flows.episodes import Asking, EpisodeAnswers, Given
from autopersona_flows.memory import JsonlMemoryStore

REPO = Path(__file__).resolve().parents[2]
QUESTION = "Which citation style should the paper use?"

# One run of the paper graph in pause mode, in its own process: its tools log each
# call to a file, so calls are counted across the crashed run and its replay.
EPISODE_RUN = """
import sys
from pathlib import Path

import orjson

from autopersona_flows.agent import PersonaAgent, Requirement
from autopersona_flows.flows import TaskGraph, TaskNode, run_persona_graph
from autopersona_flows.memory import JsonlMemoryStore, MemoryRetriever

store, results, log, out, episode, timeout, question = sys.argv[1:]


def tool(context):
    with open(log, "a") as calls:
        calls.write(context.node.id + "\\n")
    return {"node": context.node.id, "answer": context.answer}


# Asked at its node, so the tools before it have run when the run crashes.
citation = Requirement(
    "citation style", options=["APA", "MLA"], question=question, ask="at_node"
)
graph = TaskGraph(
    [
        TaskNode(id="fetch", tool=tool),
        TaskNode(id="outline", tool=tool, depends_on=["fetch"]),
        TaskNode(id="draft", tool=tool, depends_on=["outline"], requires=[citation]),
        TaskNode(id="send", tool=tool, depends_on=["draft"]),
    ]
)
result = run_persona_graph(
    graph,
    "ada",
    "Finish my paper",
    episode_id=episode,
    agent=PersonaAgent(MemoryRetriever(JsonlMemoryStore(store))),
    result_storage=Path(results),
    pause_mode="pause",
    pause_timeout=int(timeout),
    poll_interval=0.5,
)
Path(out).write_bytes(orjson.dumps(result))
"""


def episode_run(
    tmp_path: Path, name: str, pause_timeout: int, question: str = QUESTION
) -> subprocess.Popen[bytes]:
    """Start one run of the episode in a new process, against the session's test server."""
    arguments = [tmp_path / "store", tmp_path / "results", tmp_path / "tools.log"]
    arguments += [tmp_path / f"{name}.json", "paper-7", pause_timeout, question]
    env = os.environ | {"PREFECT_API_URL": str(ps.PREFECT_API_URL.value())}
    with (tmp_path / f"{name}.log").open("wb") as log:
        return subprocess.Popen(
            [sys.executable, "-c", EPISODE_RUN, *map(str, arguments)],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def tool_calls(tmp_path: Path) -> Counter[str]:
    log = tmp_path / "tools.log"
    return Counter(log.read_text().split()) if log.exists() else Counter()


def answered_then_killed(
    tmp_path: Path, watch_for_pause: Any, answer: str
) -> tuple[subprocess.Popen[bytes], UUID]:
    """Run the episode until it asks, answer it, and SIGKILL the run before it sees the answer.

    Frozen first, so the run cannot see its answer before it dies: the server has
    stored the answer and resumed the run, the run has kept nothing. Returns the
    killed process and its flow run's id.
    """
    crashing = episode_run(tmp_path, "crashed", pause_timeout=120)

    def answer_then_crash(waiting) -> None:
        os.kill(crashing.pid, signal.SIGSTOP)
        answer_clarification(waiting.flow_run_id, answer)
        os.kill(crashing.pid, signal.SIGKILL)

    watcher = watch_for_pause(answer_then_crash)
    try:
        crashing.wait(timeout=180)
    finally:
        if crashing.poll() is None:
            crashing.kill()
    return crashing, watcher.finish()


@pytest.mark.slow
def test_an_answer_given_just_before_a_crash_is_not_asked_again(
    prefect_harness, tmp_path, watch_for_pause
) -> None:
    crashing, crashed_run = answered_then_killed(tmp_path, watch_for_pause, "APA")

    # The crash window: the answer is the run's input and the run is resumed, but
    # the node that asked never ran and nothing was learned.
    key = clarification_key("draft", ClarifyDecision(question=QUESTION))
    with get_client(sync_client=True) as client:
        assert client.read_flow_run(crashed_run).state.type == StateType.RUNNING
        stored = client.read_flow_run_input(crashed_run, f"paused-{key}-response")
    assert orjson.loads(stored) == {"answer": "APA"}
    assert crashing.returncode == -signal.SIGKILL
    assert tool_calls(tmp_path) == {"fetch": 1, "outline": 1}
    assert JsonlMemoryStore(tmp_path / "store").list("ada", "persona") == []

    # The replay would time out in 5 s if it asked again.
    replaying = episode_run(tmp_path, "replayed", pause_timeout=5)
    assert replaying.wait(timeout=180) == 0, (tmp_path / "replayed.log").read_text()[-3000:]

    result = orjson.loads((tmp_path / "replayed.json").read_bytes())
    assert result["metrics"]["clarifications"] == 0
    assert result["metrics"]["cache_hits"] == 2  # fetch and outline, from the crashed run
    assert result["outputs"]["draft"] == {"node": "draft", "answer": "APA"}
    assert [a["answer"] for a in result["decisions"]["draft"]["answers"]] == ["APA"]
    assert tool_calls(tmp_path) == {"fetch": 1, "outline": 1, "draft": 1, "send": 1}
    learned = JsonlMemoryStore(tmp_path / "store").list("ada", "persona")
    assert [(r.content.topic, r.content.preference) for r in learned] == [("citation style", "APA")]


@pytest.mark.slow
def test_an_answer_to_a_question_that_changed_is_not_used_the_new_one_is_asked(
    prefect_harness, tmp_path, watch_for_pause
) -> None:
    answered_then_killed(tmp_path, watch_for_pause, "APA")

    # The replay asks a reworded question: the answer given to the old one is bound to
    # it (its digest is in the pause key and in what the episode keeps), so it is not
    # taken for an answer to this one, which is asked.
    changed = "Which citation style should the paper's references use?"

    def answer_the_new_question(waiting) -> None:
        assert waiting.question == changed
        answer_clarification(waiting.flow_run_id, "MLA")

    asked = watch_for_pause(answer_the_new_question)
    replaying = episode_run(tmp_path, "replayed", pause_timeout=60, question=changed)
    assert replaying.wait(timeout=180) == 0, (tmp_path / "replayed.log").read_text()[-3000:]
    asked.finish()

    result = orjson.loads((tmp_path / "replayed.json").read_bytes())
    assert result["metrics"]["clarifications"] == 1
    assert result["outputs"]["draft"] == {"node": "draft", "answer": "MLA"}
    learned = JsonlMemoryStore(tmp_path / "store").list("ada", "persona")
    assert [(r.content.topic, r.content.preference) for r in learned] == [("citation style", "MLA")]


def test_a_question_nobody_answered_is_asked_again_by_the_replay(
    prefect_harness, kit, watch_for_pause
) -> None:
    citation = Requirement("citation style", options=["APA", "MLA"], question=QUESTION)
    graph = TaskGraph([TaskNode(id="draft", tool=kit.record, requires=[citation])])
    options = {"agent": kit.agent, "episode_id": "paper-8", "result_storage": kit.results}
    options |= {"poll_interval": 0.5}

    unanswered = watch_for_pause(lambda waiting: None)
    with pytest.raises(ClarificationTimeoutError):
        run_persona_graph(graph, "ada", "Finish my paper", pause_timeout=2, **options)
    unanswered.finish()

    answered = watch_for_pause(lambda waiting: answer_clarification(waiting.flow_run_id, "MLA"))
    result = run_persona_graph(graph, "ada", "Finish my paper", pause_timeout=60, **options)
    assert answered.finish() != unanswered.finish()

    assert result["metrics"]["clarifications"] == 1
    assert result["outputs"]["draft"]["answer"] == "MLA"
    assert kit.calls == {"draft": 1}


def test_runs_asking_at_once_are_all_noted(tmp_path: Path) -> None:
    # Each noting reads the list and writes it back: unlocked, one run's entry could be
    # lost, and its answer never read back after a crash.
    decision = ClarifyDecision(question="Which citation style?", options=["APA", "MLA"])
    answers = EpisodeAnswers(tmp_path / "results", "episode-1")
    askings = [Asking(flow_run_id=uuid4(), response_key=f"paused-k{i}-response") for i in range(24)]
    start = threading.Barrier(len(askings))

    def note(asking: Asking) -> None:
        start.wait(10)
        answers.asking("draft", "ada", decision, asking)

    threads = [threading.Thread(target=note, args=(a,)) for a in askings]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)

    key = answers._key("asking", "draft", "ada", decision)
    noted = {entry["flow_run_id"] for entry in answers._read(key)}
    assert noted == {str(a.flow_run_id) for a in askings}


class _FlakyReads(LocalFileSystem):
    """Local storage whose next ``fail`` reads of a kept record fail, as a network store's may."""

    _block_type_slug = "autopersona-test-flaky-reads"
    fail: int = 0

    def read_path(self, path: str, _sync: bool | None = None) -> bytes:
        if self.fail and Path(self.basepath, path).exists():
            self.fail -= 1
            raise OSError("connection reset")
        return LocalFileSystem.read_path(self, path, _sync=True)


def test_an_answer_kept_but_unreadable_for_a_moment_is_not_taken_for_no_answer(
    tmp_path: Path,
) -> None:
    # Taken for "nothing kept", a passing read error would ask the person again.
    storage = _FlakyReads(basepath=str(tmp_path / "results"))
    decision = ClarifyDecision(question="Which citation style?", options=["APA", "MLA"])
    answers = EpisodeAnswers(storage, "episode-1")
    assert answers.recall("draft", "ada", decision) is None  # nothing kept: no answer
    answers.keep("draft", "ada", decision, Given("MLA"))
    storage.fail = 1
    with pytest.raises(OSError, match="connection reset"):
        answers.recall("draft", "ada", decision)
    assert answers.recall("draft", "ada", decision) == Given("MLA")
