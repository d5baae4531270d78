"""Results as JSON: values, and the exceptions Prefect persists for failed nodes."""

from __future__ import annotations

import logging
import time

import orjson
import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
from prefect.client.schemas.objects import StateType

from autopersona_flows.errors import MemoryNotFoundError, PolicyError
from autopersona_flows.flows import (
    OrjsonSerializer,
    TaskGraph,
    TaskNode,
    persona_graph,
    persona_runtime,
)

SERIALIZER = OrjsonSerializer()


def test_values_are_sorted_json() -> None:
    blob = SERIALIZER.dumps({"b": [1, 2.5, None], "a": "ü"})
    assert blob == '{"a":"ü","b":[1,2.5,null]}'.encode()
    assert SERIALIZER.loads(blob) == {"a": "ü", "b": [1, 2.5, None]}


@pytest.mark.parametrize(
    "error", [RuntimeError("tool of boom exploded"), PolicyError("invalid decision")]
)
def test_an_exception_is_stored_as_its_type_and_message_and_read_back(error) -> None:
    blob = SERIALIZER.dumps(error)
    assert orjson.loads(blob) == {
        "__exc_type__": f"{type(error).__module__}.{type(error).__qualname__}",
        "message": str(error),
    }
    back = SERIALIZER.loads(blob)
    assert (type(back), str(back)) == (type(error), str(error))


def test_an_exception_that_cannot_be_rebuilt_reads_back_as_a_runtime_error_naming_it() -> None:
    missing = SERIALIZER.dumps(MemoryNotFoundError("ada", "persona", "m-1"))  # three arguments
    unknown = b'{"__exc_type__":"nowhere.GoneError","message":"lost"}'
    for blob, named in [(missing, "autopersona_flows.errors.MemoryNotFoundError"), (unknown, "")]:
        back = SERIALIZER.loads(blob)
        assert type(back) is RuntimeError
        assert str(back).startswith(named or "nowhere.GoneError: lost")


def test_a_failed_node_is_persisted_without_a_warning_and_fails_as_before(
    prefect_harness, kit, caplog
) -> None:
    graph = TaskGraph([TaskNode(id="boom", tool=kit.failing)])

    with caplog.at_level(logging.WARNING), persona_runtime(kit.agent, result_storage=kit.results):
        state = persona_graph(graph=graph, user_id="ada", query="Explode", return_state=True)

    assert not [r for r in caplog.records if "Failed to write result" in r.getMessage()]
    assert state.is_failed()
    with pytest.raises(RuntimeError, match="tool of boom exploded"):
        state.result()
    assert kit.calls == {"boom": 1}

    # The node's failure as another process reads it: from the API and the result store.
    runs = FlowRunFilter(id=FlowRunFilterId(any_=[state.state_details.flow_run_id]))
    deadline = time.monotonic() + 15  # task-run states arrive through events
    with get_client(sync_client=True) as client:
        while True:
            boom = {run.name: run for run in client.read_task_runs(flow_run_filter=runs)}.get(
                "boom"
            )
            if boom is not None and boom.state.type == StateType.FAILED:
                break
            assert time.monotonic() < deadline, "the task run never reached the server as Failed"
            time.sleep(0.2)
    with pytest.raises(RuntimeError, match="tool of boom exploded"):
        boom.state.result()
