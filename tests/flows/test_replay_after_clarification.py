"""A replay of an episode whose node asked a question repeats no tool and asks nothing."""

from __future__ import annotations

from autopersona_flows.agent import Requirement
from autopersona_flows.flows import TaskGraph, TaskNode, answer_clarification, run_persona_graph


def test_replaying_an_answered_episode_runs_nothing_again(
    prefect_harness, kit, watch_for_pause
) -> None:
    region = Requirement("deployment region", options=["eu-west", "us-east"])
    graph = TaskGraph(
        [
            TaskNode(id="build", tool=kit.record),
            TaskNode(id="deploy", tool=kit.record, depends_on=["build"], requires=[region]),
            TaskNode(id="announce", tool=kit.record, depends_on=["deploy"]),
        ]
    )
    options = {
        "agent": kit.agent,
        "episode_id": "release-42",
        "result_storage": kit.results,
        "poll_interval": 0.5,
        "pause_timeout": 120,  # a second question would fail the test instead of hanging it
    }
    watcher = watch_for_pause(lambda waiting: answer_clarification(waiting.flow_run_id, "eu-west"))
    first = run_persona_graph(graph, "ada", "Ship release 42", **options)
    watcher.finish()
    assert dict(kit.calls) == {"build": 1, "deploy": 1, "announce": 1}

    replay = run_persona_graph(graph, "ada", "Ship release 42", **options)
    assert dict(kit.calls) == {"build": 1, "deploy": 1, "announce": 1}  # nothing ran again
    assert replay["outputs"] == first["outputs"]
    assert (
        replay["decisions"]["deploy"] == first["decisions"]["deploy"]
    )  # still the answered question
    assert replay["metrics"]["cache_hits"] == 3
    assert replay["metrics"]["clarifications"] == 0
