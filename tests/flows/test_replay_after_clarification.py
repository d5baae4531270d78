"""A replay of an episode whose node asked a question repeats no tool and asks nothing."""

from __future__ import annotations

import pytest

from autopersona_flows.agent import Requirement
from autopersona_flows.flows import (
    TaskGraph,
    TaskNode,
    answer_clarification,
    arun_persona_graph,
    run_persona_graph,
)


@pytest.mark.filterwarnings("ignore:unclosed:ResourceWarning")  # see run_async
@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_replaying_an_answered_episode_runs_nothing_again(
    prefect_harness, kit, watch_for_pause, run_async, flavour
) -> None:
    region = Requirement("deployment region", options=["eu-west", "us-east"])
    tool = kit.record if flavour == "sync" else kit.arecord
    graph = TaskGraph(
        [
            TaskNode(id="build", tool=tool),
            TaskNode(id="deploy", tool=tool, depends_on=["build"], requires=[region]),
            TaskNode(id="announce", tool=tool, depends_on=["deploy"]),
        ]
    )

    def run(*args, **kwargs):  # the sync runner, or its async twin
        if flavour == "sync":
            return run_persona_graph(*args, **kwargs)
        return run_async(arun_persona_graph(*args, **kwargs))

    options = {
        "agent": kit.agent,
        "episode_id": f"release-42-{flavour}",
        "result_storage": kit.results,
        "poll_interval": 0.5,
        "pause_timeout": 120,  # a second question would fail the test instead of hanging it
    }
    watcher = watch_for_pause(lambda waiting: answer_clarification(waiting.flow_run_id, "eu-west"))
    first = run(graph, "ada", "Ship release 42", **options)
    watcher.finish()
    assert dict(kit.calls) == {"build": 1, "deploy": 1, "announce": 1}

    replay = run(graph, "ada", "Ship release 42", **options)
    assert dict(kit.calls) == {"build": 1, "deploy": 1, "announce": 1}  # nothing ran again
    assert replay["outputs"] == first["outputs"]
    assert (
        replay["decisions"]["deploy"] == first["decisions"]["deploy"]
    )  # still the answered question
    assert replay["metrics"]["cache_hits"] == 3
    assert replay["metrics"]["clarifications"] == 0
