"""Persona graphs on a real Prefect server: pause and resume, replay, failures, concurrency."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, cast
from uuid import UUID

import orjson
import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    ArtifactFilterKey,
    FlowRunFilter,
    FlowRunFilterId,
)
from prefect.client.schemas.objects import Artifact, StateType, TaskRun
from prefect.filesystems import LocalFileSystem
from prefect.flow_runs import resume_flow_run

from autopersona_flows.agent import (
    ClarifyDecision,
    EvidencePolicy,
    FunctionPolicy,
    PersonaAgent,
    Requirement,
)
from autopersona_flows.errors import (
    ClarificationTimeoutError,
    NodeOutputError,
    PolicyError,
    StoreUnavailableError,
)
from autopersona_flows.flows import (
    PendingClarification,
    TaskGraph,
    TaskNode,
    answer_clarification,
    arun_persona_graph,
    persona_graph,
    persona_runtime,
    run_persona_graph,
)
from autopersona_flows.flows.clarification import clarification_key
from autopersona_flows.memory import JsonlMemoryStore, MemoryRetriever, PersonaMemory

pytestmark = pytest.mark.usefixtures("prefect_harness")

USER = "ada"
QUERY = "Finish my paper on retrieval"
QUESTION = "Which citation style should the paper use?"
CITATION = Requirement("citation style", options=["APA", "MLA"], question=QUESTION)
FAST = {"poll_interval": 0.5}


def paper_graph(kit) -> TaskGraph:
    return TaskGraph(
        [
            TaskNode(id="fetch", instruction="Fetch the sources", tool=kit.record),
            TaskNode(id="outline", tool=kit.record, depends_on=["fetch"]),
            TaskNode(
                id="draft",
                instruction="Draft the paper",
                tool=kit.record,
                depends_on=["fetch", "outline"],
                requires=[CITATION],
            ),
            TaskNode(id="send", tool=kit.record, depends_on=["draft"]),
        ]
    )


def run_for_state(kit, graph: TaskGraph, agent: PersonaAgent | None = None, **options: Any):
    """Run the flow and return its final state (and so its flow run id) instead of raising."""
    with persona_runtime(agent or kit.agent, **(FAST | options)):
        return persona_graph(graph=graph, user_id=USER, query=QUERY, return_state=True)


def read_state(flow_run_id: UUID) -> StateType:
    with get_client(sync_client=True) as client:
        state = client.read_flow_run(flow_run_id).state
    assert state is not None
    return state.type


def artifacts(flow_run_id: UUID, key: str) -> list[Artifact]:
    with get_client(sync_client=True) as client:
        return client.read_artifacts(
            artifact_filter=ArtifactFilter(
                key=ArtifactFilterKey(any_=[key]),
                flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]),
            )
        )


def task_runs(
    flow_run_id: UUID, settled: Callable[[dict[str, TaskRun]], bool], timeout: float = 15.0
) -> dict[str, TaskRun]:
    """The flow run's task runs by name, once ``settled`` holds.

    Task-run states reach the server through events, a moment after the flow returns.
    """
    flow_runs = FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
    until = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        while True:
            runs = {run.name: run for run in client.read_task_runs(flow_run_filter=flow_runs)}
            if settled(runs) or time.monotonic() > until:
                return runs
            time.sleep(0.2)


def state_of(run: TaskRun | None) -> StateType | None:
    return run.state.type if run is not None and run.state is not None else None


# --------------------------------------------------------------------------- 1. pause


def test_a_missing_preference_pauses_the_run_until_a_valid_answer(kit, watch_for_pause) -> None:
    graph = paper_graph(kit)
    key = clarification_key("draft", ClarifyDecision(question=QUESTION))
    seen: dict[str, Any] = {}

    def answer(waiting: PendingClarification) -> None:
        seen["pause_key"] = waiting.key
        with pytest.raises(RuntimeError, match="Validation failed"):
            resume_flow_run(waiting.flow_run_id, run_input={"answer": "Harvard"})  # not an option
        seen["after_invalid_answer"] = read_state(waiting.flow_run_id)
        resume_flow_run(waiting.flow_run_id, run_input={"answer": "APA"})

    watcher = watch_for_pause(answer)
    result = run_persona_graph(graph, USER, QUERY, agent=kit.agent, pause_timeout=60, **FAST)
    flow_run_id = watcher.finish()

    assert seen == {"pause_key": key, "after_invalid_answer": StateType.PAUSED}
    assert read_state(flow_run_id) == StateType.COMPLETED
    assert kit.calls == {"fetch": 1, "outline": 1, "draft": 1, "send": 1}
    [draft] = kit.contexts["draft"]
    assert (draft.answer, draft.question) == ("APA", QUESTION)
    assert "APA" in draft.guidance
    assert sorted(draft.inputs) == ["fetch", "outline"]
    assert result["outputs"]["draft"]["answer"] == "APA"
    assert all(kit.contexts[n][0].answer is None for n in ("fetch", "outline", "send"))
    assert result["metrics"] | {"seconds": 0} == {
        "nodes": 4,
        "decisions": 5,  # draft is decided again once its answer is learned
        "clarifications": 1,
        "tool_executions": 4,
        "cache_hits": 0,
        "seconds": 0,
    }
    summary = result["decisions"]["draft"]
    assert (summary["action"], summary["answers"]) == (
        "final",
        [{"question": QUESTION, "requirement": "citation style", "answer": "APA"}],
    )
    assert draft.requirement("citation style").value == "APA"
    assert draft.requirement("citation style").source == "answered"

    # The answer is now a persona memory of the user, under the requirement's name.
    learned = [(r.content.topic, r.content.preference) for r in kit.store.list(USER, "persona")]
    assert learned == [("citation style", "APA")]

    # The question and the decisions are artifacts of the run; the question's has a
    # second version once answered.
    asked, answered = sorted(artifacts(flow_run_id, key), key=lambda a: a.created)
    assert (asked.type, answered.type) == ("markdown", "markdown")
    assert QUESTION in asked.data
    assert "Answer: **APA**" in answered.data
    [table] = artifacts(flow_run_id, "persona-decisions")
    assert table.type == "table"
    assert "draft" in table.data
    assert "APA" in table.data
    # And what it changed in memory: ids, never contents.
    [operations] = artifacts(flow_run_id, "persona-memory-ops")
    [memory] = kit.store.list(USER, "persona")
    assert orjson.loads(operations.data) == [
        {
            "node": "draft",
            "requirement": "citation style",
            "operation": "add",
            "memory id": memory.id,
            "replaced": "",
        }
    ]

    # A second run for the same user knows the answer; a pause would time out in 5 s.
    again = run_persona_graph(graph, USER, QUERY, agent=kit.agent, pause_timeout=5, **FAST)
    assert again["metrics"]["clarifications"] == 0
    assert again["metrics"]["tool_executions"] == 4  # a new episode: the tools run again
    decision = again["decisions"]["draft"]
    assert decision["action"] == "final"
    [memory] = kit.store.list(USER, "persona")
    assert {"text": "citation style: APA", "memory_id": memory.id} in [
        {"text": c["text"], "memory_id": c["memory_id"]} for c in decision["constraints"]
    ]
    latest = kit.contexts["draft"][-1]
    assert (latest.answer, latest.question) == (None, None)
    assert [c.memory_id for c in latest.constraints if c.requirement == "citation style"] == [
        memory.id
    ]
    assert kit.calls == {"fetch": 2, "outline": 2, "draft": 2, "send": 2}


# --------------------------------------------------------------------------- 2. final


def test_known_preferences_reach_the_tool_as_guidance_constraints_and_inputs(
    kit, prefect_harness
) -> None:
    style = kit.store.add(USER, PersonaMemory(topic="citation style", preference="MLA"))
    kit.store.add(USER, PersonaMemory(topic="tone", preference="terse, no preamble"))
    graph = TaskGraph([node for node in paper_graph(kit).nodes.values() if node.id != "send"])

    result = run_persona_graph(graph, USER, QUERY, agent=kit.agent, pause_timeout=5, **FAST)

    assert kit.calls == {"fetch": 1, "outline": 1, "draft": 1}
    assert result["metrics"]["clarifications"] == 0
    draft = kit.contexts["draft"][0]
    assert (draft.node.id, draft.node.instruction) == ("draft", "Draft the paper")
    assert (draft.user_id, draft.query, draft.tools) == (USER, QUERY, graph.order)
    assert (draft.answer, draft.question) == (None, None)
    [constraint] = [c for c in draft.constraints if c.requirement == "citation style"]
    assert (constraint.memory_id, constraint.text) == (style.id, "citation style: MLA")
    assert "citation style: MLA" in draft.guidance
    assert style.id in {m.record.id for m in draft.memories.persona}
    assert draft.inputs == {
        "fetch": result["outputs"]["fetch"],
        "outline": result["outputs"]["outline"],
    }
    assert kit.contexts["fetch"][0].inputs == {}
    assert kit.contexts["outline"][0].inputs == {"fetch": result["outputs"]["fetch"]}
    for node_id in graph.order:
        [context] = kit.contexts[node_id]
        assert context.guidance, f"{node_id} got no guidance"
        assert result["outputs"][node_id]["guidance"] == context.guidance
    assert result["decisions"]["draft"]["action"] == "final"
    assert style.id in [c["memory_id"] for c in result["decisions"]["draft"]["constraints"]]
    # Without a result_storage, results go to the session's scratch PREFECT_HOME.
    stored = [path.name for path in (prefect_harness / "storage").iterdir()]
    assert any(name.startswith("autopersona-run-draft-") for name in stored)


# --------------------------------------------------------------------------- 3. replay


def test_a_new_run_of_the_same_episode_replays_every_node_from_the_cache(kit) -> None:
    kit.store.add(USER, PersonaMemory(topic="citation style", preference="APA"))
    graph = paper_graph(kit)
    options = {"agent": kit.agent, "result_storage": kit.results, "pause_timeout": 5, **FAST}

    first = run_persona_graph(graph, USER, QUERY, episode_id="ep-1", **options)
    assert first["metrics"]["tool_executions"] == 4
    assert first["metrics"]["cache_hits"] == 0
    assert kit.calls == dict.fromkeys(graph.order, 1)
    assert any(p.name.startswith("autopersona-run-draft-") for p in kit.results.iterdir())

    replay = run_persona_graph(graph, USER, QUERY, episode_id="ep-1", **options)
    assert kit.calls == dict.fromkeys(graph.order, 1)
    assert replay["metrics"]["cache_hits"] == len(graph)
    assert replay["metrics"]["tool_executions"] == 0
    assert replay["metrics"]["decisions"] == 0
    assert replay["outputs"] == first["outputs"]

    other = run_persona_graph(graph, USER, QUERY, episode_id="ep-2", **options)
    assert kit.calls == dict.fromkeys(graph.order, 2)
    assert other["metrics"]["cache_hits"] == 0
    assert other["metrics"]["tool_executions"] == 4


def test_a_replay_runs_with_the_decisions_of_its_first_run_whatever_memory_says_now(
    kit,
) -> None:
    kit.store.add(USER, PersonaMemory(topic="citation style", preference="APA"))
    graph = paper_graph(kit)
    options = {"agent": kit.agent, "result_storage": kit.results, "pause_timeout": 5, **FAST}
    first = run_persona_graph(graph, USER, QUERY, episode_id="ep-kept", **options)
    assert first["metrics"]["decisions"] == 4

    # Memory that changes what 'fetch' is told: a new episode sees it, the replay not.
    kit.store.add(USER, PersonaMemory(topic="paper tone", preference="formal, no contractions"))
    replay = run_persona_graph(graph, USER, QUERY, episode_id="ep-kept", **options)
    fresh = run_persona_graph(graph, USER, QUERY, episode_id="ep-new", **options)

    def formal(result: dict[str, Any]) -> bool:
        return any("formal" in c["text"] for c in result["decisions"]["fetch"]["constraints"])

    assert formal(fresh)
    assert not formal(first)
    assert replay["metrics"]["decisions"] == 0
    assert replay["decisions"] == first["decisions"]
    assert replay["outputs"] == first["outputs"]
    assert kit.calls == dict.fromkeys(graph.order, 2)  # the first run and the new episode


def test_only_runs_that_share_an_episode_take_step_locks(kit) -> None:
    kit.store.add(USER, PersonaMemory(topic="citation style", preference="APA"))
    graph = paper_graph(kit)
    options = {"agent": kit.agent, "result_storage": kit.results, **FAST}

    # An episode of the run's own id has no other run: nothing to lock against.
    run_persona_graph(graph, USER, QUERY, **options)
    assert kit.results.is_dir()
    assert not (kit.results / ".locks").exists()

    run_persona_graph(graph, USER, QUERY, episode_id="shared", **options)
    assert (kit.results / ".locks").is_dir()  # each lock file is gone once released


@pytest.mark.filterwarnings("ignore:unclosed:ResourceWarning")  # see run_async
def test_async_tools_run_in_the_sync_flow_and_in_its_async_twin(kit, run_async) -> None:
    kit.store.add(USER, PersonaMemory(topic="citation style", preference="APA"))
    graph = TaskGraph(
        [
            TaskNode(id="fetch", tool=kit.arecord),
            TaskNode(id="draft", tool=kit.arecord, depends_on=["fetch"], requires=[CITATION]),
            TaskNode(id="send", tool=kit.record, depends_on=["draft"]),
        ]
    )
    options = {"agent": kit.agent, "pause_timeout": 5, **FAST}

    synced = run_persona_graph(graph, USER, QUERY, **options)
    awaited = run_async(arun_persona_graph(graph, USER, QUERY, **options))

    assert kit.calls == dict.fromkeys(graph.order, 2)
    for result in (synced, awaited):
        assert result["outputs"]["send"]["inputs"] == ["draft"]
        assert result["outputs"]["draft"]["inputs"] == ["fetch"]
        assert "citation style: APA" in result["outputs"]["draft"]["guidance"]
        assert result["metrics"]["tool_executions"] == 3


# --------------------------------------------------------------------------- 4. timeout


def test_an_unanswered_question_fails_the_run_after_the_pause_timeout(kit, watch_for_pause) -> None:
    graph = TaskGraph([TaskNode(id="draft", tool=kit.record, requires=[CITATION])])
    watcher = watch_for_pause(lambda run: None)  # only notes the paused run's id

    with pytest.raises(ClarificationTimeoutError, match=re.escape(repr(QUESTION))):
        run_persona_graph(graph, USER, QUERY, agent=kit.agent, pause_timeout=2, **FAST)

    # The server fails the run itself once the pause has expired, so the state's
    # message is Prefect's ("... never resumed"); the exception reaches the caller.
    assert read_state(watcher.finish()) == StateType.FAILED
    assert kit.calls == {}
    assert kit.store.list(USER, "persona") == []


# --------------------------------------------------------------------------- 5. tool failures


def test_a_failing_tool_fails_its_node_and_the_run(kit) -> None:
    graph = TaskGraph(
        [
            TaskNode(id="fetch", tool=kit.record),
            TaskNode(id="boom", tool=kit.failing, depends_on=["fetch"]),
        ]
    )

    state = run_for_state(kit, graph)

    assert state.is_failed()
    with pytest.raises(RuntimeError, match="tool of boom exploded"):
        state.result()
    assert kit.calls == {"fetch": 1, "boom": 1}
    runs = task_runs(
        state.state_details.flow_run_id, lambda r: state_of(r.get("boom")) == StateType.FAILED
    )
    assert state_of(runs["boom"]) == StateType.FAILED
    assert state_of(runs["fetch"]) == StateType.COMPLETED


class SlowDecisionStorage(LocalFileSystem):
    """Local storage whose write of a run's kept decisions takes 4 s, then sets `_kept`.

    Longer than a sync flow takes to end (its heartbeat thread sleeps in whole seconds).
    """

    _block_type_slug = "autopersona-test-slow-decision-storage"
    _kept: ClassVar[threading.Event] = threading.Event()

    def write_path(self, path: str, content: bytes, _sync: bool | None = None) -> str:
        written = LocalFileSystem.write_path(self, path, content, _sync=True)
        if "autopersona-decide-" in path:
            time.sleep(4.0)
            self._kept.set()
        return cast(str, written)


def test_a_failing_node_ends_the_run_only_after_what_it_writes_beside_the_nodes(kit) -> None:
    # The decisions of the nodes are kept (and the tables written) beside the
    # nodes; a node that fails at once must not end the run while that is under way.
    SlowDecisionStorage._kept.clear()
    graph = TaskGraph([TaskNode(id="boom", tool=kit.failing)])

    # Prefect keeps task results only in saved storage blocks.
    storage = SlowDecisionStorage(basepath=str(kit.results))
    storage.save("slow-decisions", overwrite=True)

    state = run_for_state(kit, graph, result_storage=storage)

    assert state.is_failed()
    assert SlowDecisionStorage._kept.is_set()
    assert "persona-tables" not in [thread.name for thread in threading.enumerate()]
    with pytest.raises(RuntimeError, match="tool of boom exploded"):
        state.result()


def test_prefect_retries_a_node_that_allows_retries(kit) -> None:
    graph = TaskGraph([TaskNode(id="flaky", tool=kit.flaky, retries=1)])

    result = run_persona_graph(graph, USER, QUERY, agent=kit.agent, **FAST)

    assert kit.calls == {"flaky": 2}
    assert result["outputs"]["flaky"]["node"] == "flaky"
    assert result["metrics"]["tool_executions"] == 2


def test_a_tool_returning_a_non_json_value_fails_with_node_output_error(kit) -> None:
    # Retries are for the tool's own failures: ours would fail again and repeat its side effects.
    graph = TaskGraph([TaskNode(id="odd", tool=kit.returns_set, retries=2)])

    with pytest.raises(NodeOutputError, match=r"the output of 'odd'.*set"):
        run_persona_graph(graph, USER, QUERY, agent=kit.agent, **FAST)
    assert kit.calls == {"odd": 1}


class OnceUnavailableStore(JsonlMemoryStore):
    """A real store that is unreachable for its first ``reads`` reads, as a restarting server."""

    def __init__(self, root: Path, reads: int) -> None:
        super().__init__(root)
        self.failures_left = reads

    def changes(self, *args: Any, **kwargs: Any) -> Any:
        if self.failures_left:
            self.failures_left -= 1
            raise StoreUnavailableError("the store is restarting")
        return super().changes(*args, **kwargs)


class OnceUnavailablePolicy(EvidencePolicy):
    """The default policy, whose first decision meets a store outage."""

    def __init__(self) -> None:
        super().__init__()
        self.failures_left = 1

    def decide(self, *args: Any, **kwargs: Any) -> Any:
        if self.failures_left:
            self.failures_left -= 1
            raise StoreUnavailableError("the store is restarting")
        return super().decide(*args, **kwargs)


@pytest.mark.parametrize(("retries", "completes"), [(1, True), (0, False)])
def test_a_store_that_was_unreachable_is_retried_under_the_nodes_retries(
    kit, tmp_path: Path, retries: int, completes: bool
) -> None:
    # Twice: the decision in the flow body meets it and leaves the node to its run
    # task, whose decision meets it again; only a retry of the run task gets past.
    store = OnceUnavailableStore(tmp_path / "flaky-store", reads=2)
    agent = PersonaAgent(MemoryRetriever(store))
    graph = TaskGraph([TaskNode(id="draft", tool=kit.record, retries=retries)])

    state = run_for_state(kit, graph, agent=agent)

    assert state.is_completed() is completes
    assert store.failures_left == 0
    assert kit.calls == ({"draft": 1} if completes else {})
    if not completes:
        with pytest.raises(StoreUnavailableError):
            state.result()


def test_a_store_outage_in_the_pre_hook_is_retried_without_retrying_the_tool(
    kit, tmp_path: Path
) -> None:
    store = OnceUnavailableStore(tmp_path / "flaky-store", reads=2)
    store.add(USER, PersonaMemory(topic="citation style", preference="APA"))
    graph = TaskGraph([TaskNode(id="draft", tool=kit.record, requires=[CITATION])])

    state = run_for_state(kit, graph, agent=PersonaAgent(MemoryRetriever(store)))

    assert state.is_completed()
    assert store.failures_left == 0  # the decide step met the outage twice, in the flow body
    assert kit.calls == {"draft": 1}
    (context,) = kit.contexts["draft"]
    assert context.requirement("citation style").value == "APA"


def test_a_replay_after_an_outage_in_the_first_run_runs_no_tool_again(
    kit, tmp_path: Path, watch_for_pause
) -> None:
    # The outage meets the nodes decided all at once; each is then decided on its own.
    # A replay must meet those decisions again, not decide anew on memory that changed.
    policy = OnceUnavailablePolicy()
    agent = PersonaAgent(MemoryRetriever(JsonlMemoryStore(tmp_path / "store")), policy)
    style = Requirement("citation style", options=["APA", "MLA"], ask="at_node")
    graph = TaskGraph(
        [
            TaskNode(id="cite", instruction="Format the citations", tool=kit.record),
            TaskNode(id="ask", tool=kit.record, requires=[style], depends_on=["cite"]),
        ]
    )
    options = {"agent": agent, "episode_id": "outage-1", "result_storage": kit.results, **FAST}
    watcher = watch_for_pause(lambda waiting: answer_clarification(waiting.flow_run_id, "MLA"))
    first = run_persona_graph(graph, USER, QUERY, **options)
    watcher.finish()
    assert policy.failures_left == 0

    again = run_persona_graph(graph, USER, QUERY, **options)

    assert kit.calls == {"cite": 1, "ask": 1}
    assert again["metrics"]["tool_executions"] == 0
    assert again["outputs"] == first["outputs"]


# --------------------------------------------------------------------------- 6. concurrency


def test_independent_nodes_run_concurrently(kit) -> None:
    kit.barrier(2, timeout=10)  # neither tool passes it unless both are running
    graph = TaskGraph(
        [
            TaskNode(id="left", tool=kit.waits_at_barrier),
            TaskNode(id="right", tool=kit.waits_at_barrier),
            TaskNode(id="join", tool=kit.record, depends_on=["left", "right"]),
        ]
    )

    result = run_persona_graph(graph, USER, QUERY, agent=kit.agent, **FAST)

    assert kit.calls == {"left": 1, "right": 1, "join": 1}
    assert result["outputs"]["join"]["inputs"] == ["left", "right"]


# --------------------------------------------------------------------------- 7. configuration


def test_a_policy_error_fails_the_run_and_is_not_retried(kit) -> None:
    asked: list[str] = []

    def broken(request, memories) -> dict[str, Any]:
        asked.append(request.node.id)
        return {"action": "Clarify", "question": "Which one?"}  # actions are lowercase

    agent = PersonaAgent(MemoryRetriever(kit.store), FunctionPolicy(broken))
    graph = TaskGraph([TaskNode(id="draft", tool=kit.record, retries=2)])

    state = run_for_state(kit, graph, agent=agent)

    assert state.is_failed()
    with pytest.raises(PolicyError, match="invalid decision"):
        state.result()
    assert asked == ["draft"]  # decided once: the library's error is not retried
    assert kit.calls == {}


# --------------------------------------------------------------------------- 8. tasks per node


def test_every_node_is_decided_in_the_flow_body_and_runs_as_one_task(kit) -> None:
    kit.store.add(USER, PersonaMemory(topic="citation style", preference="MLA"))
    kit.store.add(USER, PersonaMemory(topic="paper tone", preference="formal, no contractions"))

    state = run_for_state(kit, paper_graph(kit))
    result = state.result()

    # Decisions have no Prefect task: 'draft' is decided by the check of its one
    # requirement before any tool runs (memory holds it: no question), the others
    # in the flow body. Each node is one task, its run.
    names = ["fetch", "outline", "draft", "send"]
    runs = task_runs(state.state_details.flow_run_id, lambda r: set(r) >= set(names))
    assert sorted(runs) == sorted(names)
    assert result["metrics"]["decisions"] == 4
    assert kit.calls == {"fetch": 1, "outline": 1, "draft": 1, "send": 1}
    # Every node still got its decision, with the memory it applies.
    assert set(result["decisions"]) == {"fetch", "outline", "draft", "send"}
    assert all(summary["action"] == "final" for summary in result["decisions"].values())
    [draft] = kit.contexts["draft"]
    assert draft.constraints[0].requirement == "citation style"
    [fetch] = kit.contexts["fetch"]
    assert any("formal" in c.text for c in fetch.constraints)  # guidance without a requirement


class _Journal(PersonaAgent):
    """A PersonaAgent that notes each decision in ``journal`` as it starts."""

    def __init__(self, store: JsonlMemoryStore, journal: list[str]) -> None:
        super().__init__(MemoryRetriever(store))
        self.journal = journal

    def decide(self, request: Any) -> Any:
        self.journal.append(f"decide {request.node.id}")
        return super().decide(request)


def test_nodes_nobody_can_ask_about_are_decided_on_one_read_before_any_tool(
    kit, tmp_path: Path
) -> None:
    journal: list[str] = []

    class ReadCounting(JsonlMemoryStore):
        def changes(self, *args: Any, **kwargs: Any) -> Any:
            journal.append("read")
            return super().changes(*args, **kwargs)

    store = ReadCounting(tmp_path / "store")
    store.add(USER, PersonaMemory(topic="paper tone", preference="formal, no contractions"))

    def noting(ctx: Any) -> dict[str, Any]:
        journal.append(f"tool {ctx.node.id}")
        return kit.record(ctx)

    ids = ["a", "b", "c", "d", "e"]
    graph = TaskGraph(
        [
            TaskNode(id=node_id, tool=noting, depends_on=ids[:1] if node_id != "a" else [])
            for node_id in ids
        ]
    )
    result = run_for_state(kit, graph, agent=_Journal(store, journal)).result()

    assert result["metrics"]["decisions"] == 5
    decided = [entry for entry in journal if entry.startswith("decide")]
    first_tool = next(i for i, entry in enumerate(journal) if entry.startswith("tool"))
    assert decided == [f"decide {node_id}" for node_id in ids]
    assert journal.index("decide e") < first_tool  # every decision before any tool
    # One read of each bank for all five decisions, not one per search.
    reads = journal[journal.index("decide a") : first_tool].count("read")
    assert reads == 3
    assert all(any("formal" in c.text for c in kit.contexts[n][0].constraints) for n in ids)


def test_a_policy_that_does_not_promise_gets_a_kept_decide_step_for_every_node(kit) -> None:
    calls: list[str] = []

    def always_final(request, memories) -> dict[str, Any]:
        calls.append(request.node.id)
        return {"action": "final", "guidance": "go"}

    agent = PersonaAgent(MemoryRetriever(kit.store), FunctionPolicy(always_final))
    graph = TaskGraph([TaskNode(id="a", tool=kit.record), TaskNode(id="b", tool=kit.record)])
    options = {"agent": agent, "result_storage": kit.results, **FAST}

    first = run_persona_graph(graph, USER, QUERY, episode_id="ep-steps", **options)
    replay = run_persona_graph(graph, USER, QUERY, episode_id="ep-steps", **options)

    # It may ask anywhere: each node's decision is a step kept in the result store
    # under its decide key, which the replay reads back instead of deciding again.
    assert calls == ["a", "b"]
    assert first["metrics"]["decisions"] == 2
    assert replay["metrics"]["decisions"] == 0
    kept = sorted(p.name for p in kit.results.iterdir() if p.name.startswith("autopersona-decide"))
    assert [name.split("-")[2] for name in kept] == ["a", "b"]


class _BrokenPromise:
    """Declares it never asks without requirements, then asks anyway."""

    asks_without_requirements = False

    def decide(self, request, memories) -> dict[str, Any]:
        return {"action": "clarify", "question": "Which font?"}


def test_a_policy_breaking_its_promise_fails_the_node_before_its_tool(kit) -> None:
    agent = PersonaAgent(MemoryRetriever(kit.store), _BrokenPromise())
    graph = TaskGraph([TaskNode(id="draft", tool=kit.record, retries=2)])

    state = run_for_state(kit, graph, agent=agent)

    assert state.is_failed()
    with pytest.raises(PolicyError, match=r"never asks.*'Which font\?'.*'draft'"):
        state.result()
    # Decided in the flow body, the node fails before its run task (and its retries)
    # exists: the tool never ran.
    assert kit.calls == {}


def test_nobody_is_asked_for_a_run_whose_work_in_flight_already_failed(
    prefect_harness, kit, watch_for_pause
) -> None:
    size = Requirement("paper size", options=["A4", "Letter"], ask="at_node")
    graph = TaskGraph(
        [
            TaskNode(id="fetch", tool=kit.failing),
            TaskNode(id="print", instruction="Print the paper", tool=kit.record, requires=[size]),
        ]
    )
    asked: list[str] = []
    watch_for_pause(
        lambda waiting: (
            asked.append(waiting.question),
            answer_clarification(waiting.flow_run_id, "A4"),
        )
    )
    with pytest.raises(RuntimeError, match="tool of fetch exploded"):
        run_persona_graph(
            graph, "ada", "Print", agent=kit.agent, poll_interval=0.2, pause_timeout=30
        )
    assert asked == []
    assert "print" not in kit.calls
