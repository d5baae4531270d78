"""`answering` answers real runs through the Prefect API, as a person would; the kit together.

Every test runs real flows on the session's Prefect test server: graphs that pause
and are answered, counted by `RecordingTool`s; and hand-made suspended runs, since a
run suspends only from a deployment.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import orjson
import pytest
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import StateType
from prefect.input.run_input import keyset_from_paused_state
from prefect.states import Running, Suspended
from prefect.task_runners import ProcessPoolTaskRunner

from autopersona_flows.agent.decisions import Requirement
from autopersona_flows.flows import (
    NodeContext,
    TaskGraph,
    TaskNode,
    pending_clarifications,
    persona_graph,
    persona_runtime,
    run_persona_graph,
)
from autopersona_flows.testing import (
    Clarify,
    InMemoryMemoryStore,
    Proceed,
    RecordingTool,
    ScriptedPolicy,
    UnansweredQuestionError,
    answering,
    recording_tool,
)

pytestmark = pytest.mark.usefixtures("prefect_harness")

USER, QUERY = "ada", "Finish my paper"
CITATION = Requirement("citation style", options=["APA", "MLA"])
SIZE = Requirement("paper size", question="Which paper size should it be printed on?")
CHANNEL = Requirement("sharing channel", ask="at_node")
LOG = "AUTOPERSONA_TESTING_TOOL_LOG"


def values(context: NodeContext) -> dict[str, Any]:
    """What a node ran with: its requirement values."""
    return {name: value.value for name, value in context.requirements.items()}


def paper_graph(tool: Callable[[NodeContext], Any]) -> TaskGraph:
    return TaskGraph(
        [
            TaskNode(id="fetch", tool=tool),
            TaskNode(id="draft", tool=tool, depends_on=["fetch"], requires=[CITATION]),
            TaskNode(id="share", tool=tool, depends_on=["draft"], requires=[CHANNEL]),
        ]
    )


@pytest.fixture
def store() -> InMemoryMemoryStore:
    return InMemoryMemoryStore()


@pytest.fixture
def options(tmp_path: Path) -> dict[str, Any]:
    """`run_persona_graph` options: results of the test's own, prompt polling."""
    return {"result_storage": tmp_path / "results", "poll_interval": 0.5, "pause_timeout": 120}


def learned(store: InMemoryMemoryStore) -> dict[str, str]:
    return {r.content.topic: r.content.preference for r in store.list(USER, "persona")}


def test_a_graph_pauses_twice_is_answered_and_runs_each_tool_once(
    store, options, agent_over
) -> None:
    tool = RecordingTool(values)
    graph, agent = paper_graph(tool), agent_over(store)  # the shipped EvidencePolicy
    with answering({"citation style": "MLA", "sharing channel": "Slack"}, user_id=USER) as person:
        first = run_persona_graph(graph, USER, QUERY, episode_id="paper", agent=agent, **options)
        replay = run_persona_graph(graph, USER, QUERY, episode_id="paper", agent=agent, **options)
    assert len(person.questions) == 2  # once each, none on the replay
    assert "citation style" in person.questions[0]
    assert "sharing channel" in person.questions[1]
    assert [(q.answer, q.user_id, q.state) for q in person.asked] == [
        ("MLA", USER, "Paused"),
        ("Slack", USER, "Paused"),
    ]
    assert tool.counts() == {"fetch": 1, "draft": 1, "share": 1}  # across both runs
    assert first["outputs"] == {
        "fetch": {},
        "draft": {"citation style": "MLA"},
        "share": {"sharing channel": "Slack"},
    }
    assert replay["outputs"] == first["outputs"]
    assert (replay["metrics"]["clarifications"], replay["metrics"]["tool_executions"]) == (0, 0)
    assert learned(store) == {"citation style": "MLA", "sharing channel": "Slack"}


def test_scripted_questions_are_asked_once_and_remembered_by_the_next_episode(
    store, options, agent_over
) -> None:
    tool = RecordingTool(values)
    policy = ScriptedPolicy(
        {"draft": {"citation style": Clarify()}, "share": Clarify("sharing channel")},
        default=Proceed("Gather the sources."),
    )
    agent = agent_over(store, policy)
    with answering({"citation style": "APA", "sharing channel": "email"}) as person:
        for episode in ("monday", "tuesday"):  # the second asks nothing: memory answers
            result = run_persona_graph(
                paper_graph(tool), USER, QUERY, episode_id=episode, agent=agent, **options
            )
            assert result["outputs"]["share"] == {"sharing channel": "email"}
    assert person.questions == [
        "To finish your paper, which citation style would you like? APA or MLA?",
        "To finish your paper, what sharing channel would you like?",
    ]
    assert tool.counts() == {"fetch": 2, "draft": 2, "share": 2}  # a new episode runs again
    assert [c.requirements for c in tool.calls if c.node_id == "draft"] == [
        {"citation style": "APA"},
        {"citation style": "APA"},
    ]
    # Each episode decides each node; "share" again once its question is answered.
    assert {node: policy.count(node) for node in ("fetch", "share")} == {"fetch": 2, "share": 3}
    assert learned(store) == {"citation style": "APA", "sharing channel": "email"}


def test_a_form_of_several_questions_is_answered_by_field_or_requirement(
    store, options, agent_over
) -> None:
    tool = RecordingTool(values)
    graph = TaskGraph([TaskNode(id="print", tool=tool, requires=[CITATION, SIZE])])
    # Asked at once, before any tool runs: one form, a field per requirement.
    with answering({"citation_style": "APA", "paper size": "A4"}) as person:
        result = run_persona_graph(graph, USER, QUERY, agent=agent_over(store), **options)
    assert [(q.field, q.answer) for q in person.asked] == [
        ("citation_style", "APA"),
        ("paper_size", "A4"),
    ]
    assert person.asked[1].text == "Which paper size should it be printed on?"
    assert result["outputs"]["print"] == {"citation style": "APA", "paper size": "A4"}
    assert tool.counts() == {"print": 1}


def test_a_question_without_an_answer_fails_its_run_at_once_and_the_block(
    store, options, agent_over
) -> None:
    tool = RecordingTool(values)
    started = time.monotonic()
    with (
        pytest.raises(UnansweredQuestionError, match=r"(?s)sharing channel.*no key") as info,
        answering({"citation style": "MLA"}) as person,
    ):
        run_persona_graph(paper_graph(tool), USER, QUERY, agent=agent_over(store), **options)
    assert time.monotonic() - started < 60  # not the run's pause_timeout of 120 s
    assert isinstance(info.value, AssertionError)
    assert info.value.__context__ is not None  # the failed run, shown with it
    assert [q.text for q in person.unanswered] == [person.questions[1]]
    assert tool.counts() == {"fetch": 1, "draft": 1}  # the asking node never ran


def test_questions_out_of_scope_or_left_unanswered_wait_out_the_run_s_timeout(
    store, tmp_path, agent_over
) -> None:
    tool = RecordingTool(values)
    graph = TaskGraph(
        [TaskNode(id="print", tool=tool, requires=[Requirement("paper size", default="A4")])]
    )
    # Bob's person ignores Ada's run; Ada's leaves it unanswered on purpose (None).
    with (
        answering({"paper size": "Letter"}, user_id="bob") as bob,
        answering(lambda question: None, user_id=USER) as ada,
    ):
        result = run_persona_graph(
            graph,
            USER,
            QUERY,
            agent=agent_over(store),
            result_storage=tmp_path / "results",
            poll_interval=0.5,
            pause_timeout=3,
            on_timeout="default",
        )
    assert bob.asked == []
    assert [(q.field, q.answer) for q in ada.unanswered] == [("answer", None)]
    assert result["outputs"]["print"] == {"paper size": "A4"}  # the declared default
    assert learned(store) == {}  # a default is never learned


# --------------------------------------------------------------------------- suspended runs


@flow
def _never_run() -> None:
    """Only gives the hand-made runs below a flow."""


@pytest.fixture(scope="module")
def deployment(prefect_harness: Path) -> Iterator[UUID]:
    """A deployment no worker serves: its runs stay where the tests put them."""
    with get_client(sync_client=True) as client:
        deployment_id = client.create_deployment(client.create_flow(_never_run), "answering")
    yield deployment_id
    with get_client(sync_client=True) as client:
        client.delete_deployment(deployment_id)


@pytest.fixture
def suspended(deployment: UUID) -> Iterator[Callable[[], UUID]]:
    """Make deployment runs suspended on a question; none is left waiting after the test."""
    made: list[UUID] = []

    def make() -> UUID:
        schema = {
            "type": "object",
            "properties": {"answer": {"type": "string", "enum": ["work", "own"]}},
            "required": ["answer"],
        }
        with get_client(sync_client=True) as client:
            run = client.create_flow_run_from_deployment(deployment, parameters={"user_id": USER})
            client.set_flow_run_state(run.id, Running(), force=True)
            state = Suspended(pause_key=f"clarify-pay-{run.id.hex[:16]}")
            keyset = state.state_details.run_input_keyset = keyset_from_paused_state(state)
            client.set_flow_run_state(run.id, state, force=True)
            for key, value in (("description", "**Pay with which card?**"), ("schema", schema)):
                client.create_flow_run_input(run.id, keyset[key], orjson.dumps(value).decode())
        made.append(run.id)
        return run.id

    yield make
    with get_client(sync_client=True) as client:  # none left waiting for later tests
        for run_id in made:
            client.delete_flow_run(run_id)


def _state(run_id: UUID) -> tuple[StateType, str | None]:
    with get_client(sync_client=True) as client:
        state = client.read_flow_run(run_id).state
    assert state is not None
    return state.type, state.message


def _wait_until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    until = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < until, "timed out"
        time.sleep(0.1)


def test_a_suspended_run_is_answered_only_when_named_if_it_waited_before_the_block(
    suspended,
) -> None:
    run_id = suspended()
    with answering({"card": "own"}) as ignoring:  # not this block's: it waited before
        time.sleep(1.0)
    assert ignoring.asked == []
    assert run_id in [p.flow_run_id for p in pending_clarifications()]
    with answering({"card": "own"}, flow_run_id=run_id) as person:
        _wait_until(lambda: bool(person.asked))
    (question,) = person.asked
    assert (question.text, question.options, question.state) == (
        "Pay with which card?",
        ("work", "own"),
        "Suspended",
    )
    assert question.answer == "own"
    assert _state(run_id)[0] == StateType.SCHEDULED  # resuming: a worker re-runs it


def test_a_suspended_run_without_an_answer_is_marked_failed(suspended) -> None:
    run_id = suspended()
    with (
        pytest.raises(UnansweredQuestionError, match="Pay with which card"),
        answering({"citation style": "APA"}, flow_run_id=run_id),
    ):
        _wait_until(lambda: _state(run_id)[0] == StateType.FAILED)
    kind, message = _state(run_id)
    assert kind == StateType.FAILED
    assert message is not None
    assert "no key of the answers matches it" in message


def test_an_answer_the_run_refuses_is_reported_with_the_refusal(suspended) -> None:
    run_id = suspended()
    with (
        pytest.raises(UnansweredQuestionError, match=r"refused the answers.*cash"),
        answering({"card": "cash"}, flow_run_id=run_id) as person,
    ):
        _wait_until(lambda: bool(person.asked))
    assert person.unanswered[0].text == "Pay with which card?"
    assert _state(run_id)[0] == StateType.FAILED


def test_an_answers_function_that_raises_is_the_cause_of_the_block_s_error(suspended) -> None:
    run_id = suspended()

    def person_who_only_knows_about_travel(question: Any) -> str:
        raise LookupError(f"no idea about {question.text!r}")

    with (
        pytest.raises(UnansweredQuestionError) as info,
        answering(person_who_only_knows_about_travel, flow_run_id=run_id) as person,
    ):
        _wait_until(lambda: bool(person.asked))
    assert isinstance(info.value.__cause__, LookupError)
    assert _state(run_id)[0] == StateType.FAILED


# --------------------------------------------------------------------------- process pools


@recording_tool(log=lambda: os.environ.get(LOG))
def pooled(context: NodeContext) -> dict[str, Any]:
    """A tool a worker process imports by its path, logging each call to the shared file."""
    return values(context)


def test_tools_in_worker_processes_are_counted_through_the_log(
    store, options, agent_over, tmp_path, monkeypatch
) -> None:
    monkeypatch.setenv(LOG, str(tmp_path / "calls.jsonl"))  # before any worker starts
    graph = paper_graph(pooled)
    in_processes = persona_graph.with_options(task_runner=ProcessPoolTaskRunner(max_workers=2))
    with (
        answering({"citation style": "APA", "sharing channel": "Slack"}) as person,
        persona_runtime(agent_over(store), **options),
    ):
        result = in_processes(graph=graph, user_id=USER, query=QUERY, episode_id="pool")
    assert len(person.questions) == 2
    assert pooled.counts() == {"fetch": 1, "draft": 1, "share": 1}
    assert os.getpid() not in {call.pid for call in pooled.calls}  # all ran in workers
    assert result["outputs"]["draft"] == {"citation style": "APA"}
