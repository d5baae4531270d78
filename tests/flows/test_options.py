"""Prefect's task options on persona tasks and graph nodes: checked, merged, reaching Prefect."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
from prefect.task_engine import TaskRunTimeoutError

from autopersona_flows.errors import FlowConfigurationError
from autopersona_flows.flows import (
    DEFAULT_TASK_OPTIONS,
    NodeContext,
    TaskGraph,
    TaskNode,
    persona_graph,
    persona_runtime,
    persona_task,
)

CALLS: Counter[str] = Counter()


@pytest.fixture(autouse=True)
def _reset() -> None:
    CALLS.clear()


@persona_task(
    tags=["papers", "billing"],
    retries=2,
    retry_delay_seconds=0.2,
    task_run_name="style-{style}",
)
def styled(context: NodeContext, style: str) -> str:
    """Apply a style, failing once."""
    CALLS[style] += 1
    if CALLS[style] == 1:
        raise RuntimeError("a transient failure")
    return style


@persona_task(timeout_seconds=0.5)
async def stalls(context: NodeContext) -> str:
    """Take far too long."""
    CALLS["stalls"] += 1
    await asyncio.sleep(30)
    return "done"


@persona_task(timeout_seconds=0.5)
def stalls_sync(context: NodeContext) -> str:
    """Take far too long, blocking."""
    CALLS["stalls_sync"] += 1
    time.sleep(30)
    return "done"


@flow
def optioned(agent: Any) -> dict:
    with persona_runtime(agent, user_id="ada", query="Style my paper"):
        first = styled.submit("APA")
        other = styled.with_options(tags=["other"], retries=1, task_run_name="other").submit("MLA")
        stalled = stalls.submit()
        stalled.wait()
        started = time.monotonic()
        try:
            stalls_sync()  # called in the flow's (main) thread, where a timeout interrupts
        except TaskRunTimeoutError:
            blocked = time.monotonic() - started
        return {
            "results": [first.result(), other.result()],
            "runs": [str(first.task_run_id), str(other.task_run_id)],
            "stalled": stalled.result(raise_on_failure=False),
            "blocked": blocked,
        }


def test_options_reach_prefect_and_a_timeout_fires(prefect_harness, kit, settled_task_run) -> None:
    started = time.monotonic()
    result = optioned(kit.agent)
    assert time.monotonic() - started < 20  # neither 30 s sleep ran out
    assert result["results"] == ["APA", "MLA"]
    assert CALLS == {"APA": 2, "MLA": 2, "stalls": 1, "stalls_sync": 1}  # each retried once
    first, other = (settled_task_run(run_id) for run_id in result["runs"])
    assert first.name == "style-APA"
    assert set(first.tags) == {"papers", "billing"}
    assert first.empirical_policy.retries == 2
    assert first.empirical_policy.retry_delay == 0.2
    assert first.run_count == 2
    assert (other.name, other.tags, other.empirical_policy.retries) == ("other", ["other"], 1)
    assert isinstance(result["stalled"], TaskRunTimeoutError)
    assert result["blocked"] < 5
    assert styled.options["tags"] == ["papers", "billing"]  # with_options made a copy


def test_node_options_reach_prefect(prefect_harness, kit, settled_task_run) -> None:
    graph = TaskGraph(
        [
            TaskNode(id="flaky", tool=kit.flaky, retries=1, retry_delay_seconds=0.2, tags=["net"]),
            TaskNode(id="stalls", tool=kit.sleeps, depends_on=["flaky"], timeout_seconds=0.5),
        ]
    )
    started = time.monotonic()
    with persona_runtime(kit.agent, poll_interval=0.5):
        state = persona_graph(graph=graph, user_id="ada", query="Fetch", return_state=True)
    assert time.monotonic() - started < 20
    with pytest.raises(TaskRunTimeoutError):
        state.result()
    assert kit.calls == {"flaky": 2, "stalls": 1}
    flow_runs = FlowRunFilter(id=FlowRunFilterId(any_=[state.state_details.flow_run_id]))
    deadline = time.monotonic() + 20  # task runs reach the server through events
    with get_client(sync_client=True) as client:
        while not (
            found := [
                r.id for r in client.read_task_runs(flow_run_filter=flow_runs) if r.name == "flaky"
            ]
        ):
            assert time.monotonic() < deadline, "the flaky task run never reached the server"
            time.sleep(0.2)
    flaky = settled_task_run(found[0])
    assert flaky.tags == ["net"]
    assert (flaky.empirical_policy.retries, flaky.empirical_policy.retry_delay) == (1, 0.2)
    assert flaky.run_count == 2


# --------------------------------------------------------------------------- checks


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"cache_policy": None}, "set Prefect's 'cache_policy' themselves: NodeCachePolicy"),
        ({"persist_result": False}, "'persist_result' themselves"),
        ({"result_serializer": "json"}, "never pickled"),
        ({"retry": 2}, "unknown task option 'retry'; known: "),
        ({"result_storage": "s3/bucket"}, "a Path or a file-system block"),
        ({"task_run_name": 3}, "a template string or a callable"),
        ({"task_run_name": "fmt-{styel}"}, "names 'styel', which is not an argument"),
    ],
)
def test_options_persona_tasks_own_or_cannot_use_are_refused(options, message) -> None:
    def fmt(context: NodeContext, style: str) -> str:
        return style

    with pytest.raises(FlowConfigurationError, match=message):
        persona_task(**options)(fmt)


def test_options_merge_over_the_defaults(tmp_path: Path) -> None:
    def fmt(context: NodeContext, style: str) -> str:
        return style

    task = persona_task(timeout_seconds=3, result_storage=tmp_path)(fmt)
    assert task.options == DEFAULT_TASK_OPTIONS | {
        "timeout_seconds": 3,
        "result_storage": tmp_path,
    }
    assert task.with_options(retries=4).options == task.options | {"retries": 4}
    assert TaskNode(id="n", tool=fmt, retries=2, tags=["a"]).task_options() == {
        "retries": 2,
        "tags": ["a"],
    }
    assert TaskNode(id="n", tool=fmt).task_options() == DEFAULT_TASK_OPTIONS
