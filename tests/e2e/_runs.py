"""Starting and watching deployment runs, as the UI and a person would."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any
from uuid import UUID

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import FlowRun

from examples.reading_group import worklog

TOOLS = ["gather_sources", "draft", "format_references", "share"]


def start(deployment: str, parameters: dict[str, Any] | None = None) -> UUID:
    """Create a run of ``deployment`` as the UI's Run button does."""
    with get_client(sync_client=True) as client:
        found = client.read_deployment_by_name(deployment)
        return client.create_flow_run_from_deployment(found.id, parameters=parameters or {}).id


def wait_for(run_id: UUID, *names: str, timeout: float = 150) -> FlowRun:
    """Poll until the run's state is one of ``names`` (fails fast on a final other state)."""
    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            run = client.read_flow_run(run_id)
            if run.state is not None and run.state.name in names:
                return run
            if run.state is not None and run.state.is_final():
                pytest.fail(f"run ended {run.state.name}: {run.state.message}")
            time.sleep(0.5)
    pytest.fail(f"run {run_id} not {names} within {timeout} s (last: {run.state})")


def state_names(run_id: UUID) -> list[str]:
    with get_client(sync_client=True) as client:
        return [state.name for state in client.read_flow_run_states(run_id)]


def tool_calls(stack) -> Counter[str]:
    return Counter(line["tool"] for line in worklog(stack.worklog))
