"""A malformed graph from a deployment's run form: refused by the form, or when the run starts.

Measured against the session's Prefect server, as a deployment's run is made and run:
the form's checks (``/ui/schemas/validate``, what the UI's run form calls) and the
server's (``create_flow_run_from_deployment``, parameters checked against the same
schema), then ``python -m prefect.engine``, the command a process worker runs for a run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import httpx
import prefect.settings as ps
import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterId,
    LogFilter,
    LogFilterFlowRunId,
)
from prefect.exceptions import PrefectHTTPStatusError

from autopersona_flows.flows import graph_runner

REPO = Path(__file__).resolve().parents[2]
TOOL_MODULES = "PREFECT_INTEGRATIONS_AUTOPERSONA_TOOL_MODULES"
GATHER = "examples.reading_group:gather_sources"
DRAFT = "examples.reading_group:draft"
ALLOWED = f"'examples' ({TOOL_MODULES})"


def deploy(monkeypatch: pytest.MonkeyPatch, tool_modules: str | None) -> UUID:
    """A deployment of `graph_runner`, its schema written as ``prefect deploy`` writes it.

    Args:
        monkeypatch: Sets ``TOOL_MODULES`` as the deploying environment has it.
        tool_modules: The deploying environment's ``TOOL_MODULES``; unset if None.
    """
    if tool_modules is None:
        monkeypatch.delenv(TOOL_MODULES, raising=False)
    else:
        monkeypatch.setenv(TOOL_MODULES, tool_modules)
    deployment = graph_runner.to_deployment(name=f"graph-{uuid4().hex[:8]}")
    assert deployment.enforce_parameter_schema  # Prefect's default, as for `prefect deploy`
    return deployment.apply()


def parameters(*nodes: dict[str, Any]) -> dict[str, Any]:
    return {"graph": {"nodes": list(nodes)}, "user_id": "ada", "query": "Summarise the papers"}


def form_errors(deployment_id: UUID, values: dict[str, Any]) -> Any:
    """What the run form shows for ``values``: the UI sends them to this endpoint."""
    with get_client(sync_client=True) as client:
        schema = client.read_deployment(deployment_id).parameter_openapi_schema
    response = httpx.post(
        f"{ps.PREFECT_API_URL.value()}/ui/schemas/validate",
        json={"schema": schema, "values": values},
    )
    response.raise_for_status()
    return response.json()


def run_as_a_worker(run_id: UUID, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Run ``run_id`` as a process worker does, with the reading-group deployment's env."""
    env = {
        **os.environ,
        "PREFECT_API_URL": str(ps.PREFECT_API_URL.value()),
        TOOL_MODULES: "examples",
        "PREFECT_INTEGRATIONS_AUTOPERSONA_STORE": str(tmp_path / "memory"),
        "PYTHONPATH": os.pathsep.join([str(tmp_path / "importable"), str(REPO)]),
    }
    return subprocess.run(
        [sys.executable, "-m", "prefect.engine", str(run_id)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def test_the_form_and_the_server_refuse_a_tool_outside_the_allowed_modules_with_the_reason(
    prefect_harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    deployment_id = deploy(monkeypatch, tool_modules="examples")
    outside = parameters({"id": "a", "tool": GATHER}, {"id": "b", "tool": "subprocess:getoutput"})

    assert form_errors(deployment_id, parameters({"id": "a", "tool": GATHER})) == {
        "errors": [],
        "valid": True,
    }
    pattern = r"^(?:examples)(?:\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"
    reason = f"'subprocess:getoutput' does not match {pattern!r}"
    tool_errors = {"index": 1, "errors": [{"property": "tool", "errors": [reason]}]}
    assert form_errors(deployment_id, outside) == {
        "errors": [
            {"property": "graph", "errors": [{"property": "nodes", "errors": [tool_errors]}]}
        ],
        "valid": False,
    }
    with get_client(sync_client=True) as client, pytest.raises(PrefectHTTPStatusError) as info:
        client.create_flow_run_from_deployment(deployment_id, parameters=outside)
    assert info.value.response.status_code == 409
    assert info.value.response.json()["detail"] == (
        f"Error creating flow run: Validation failed for field 'graph.nodes[1].tool'. "
        f"Failure reason: {reason}"
    )


@pytest.mark.parametrize(
    ("nodes", "reason"),
    [
        (
            [
                {"id": "a", "tool": GATHER, "depends_on": ["b"]},
                {"id": "b", "tool": DRAFT, "depends_on": ["a"]},
            ],
            "the graph has a cycle through 'a' -> 'b' -> 'a'; 2 nodes in all are on a cycle "
            "or depend on one",
        ),
        (
            [{"id": "a", "tool": GATHER, "depends_on": ["ghost"]}],
            "node 'a' depends on unknown node 'ghost'",
        ),
        ([{"id": "a", "tool": GATHER}, {"id": "a", "tool": DRAFT}], "node id 'a' is used twice"),
        (
            # Deployed without TOOL_MODULES, so the form had no modules to hold it to.
            [{"id": "a", "tool": GATHER}, {"id": "b", "tool": "marker_tools:record"}],
            f"node 'b' names tool 'marker_tools:record', outside the allowed modules {ALLOWED}",
        ),
    ],
    ids=["cycle", "unknown-dependency", "repeated-id", "tool-outside"],
)
def test_what_the_form_cannot_refuse_fails_as_the_run_starts_before_any_code_of_it(
    prefect_harness, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, nodes, reason
) -> None:
    # A tool module that leaves a file behind when it is imported.
    marker = tmp_path / "imported"
    (tmp_path / "importable").mkdir()
    (tmp_path / "importable" / "marker_tools.py").write_text(
        f"open({str(marker)!r}, 'w').close()\n\n\ndef record(context):\n    return 'ran'\n"
    )
    deployment_id = deploy(monkeypatch, tool_modules=None)
    assert form_errors(deployment_id, parameters(*nodes))["valid"] is True
    with get_client(sync_client=True) as client:
        run_id = client.create_flow_run_from_deployment(
            deployment_id, parameters=parameters(*nodes)
        ).id

    process = run_as_a_worker(run_id, tmp_path)

    with get_client(sync_client=True) as client:
        run = client.read_flow_run(run_id)
        task_runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id]))
        )
        logs = [
            log.message
            for log in client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])))
        ]
    assert process.returncode == 0, process.stderr
    assert run.state is not None
    assert run.state.is_failed()
    assert run.state.message == (
        "Validation of flow parameters failed with error: ParameterTypeError: Flow run "
        f"received invalid parameters:\n - graph.nodes: Value error, {reason}"
    )
    assert task_runs == []
    assert not marker.exists()
    # The flow's body never began, so no traceback passes through this package's code;
    # the one traceback is Prefect's own, which its engine logs for every Failed run.
    assert not [m for m in logs if "Encountered exception during execution" in m]
    [traceback] = [m for m in logs if "Traceback" in m]
    assert traceback.startswith("Engine execution exited with unexpected exception")
    assert "autopersona_flows" not in traceback
    assert traceback.endswith(f"- graph.nodes: Value error, {reason}")
