"""End to end beyond one machine's files: Prefect's server on PostgreSQL and two workers
sharing a PostgreSQL memory store. Two people's runs go at once; each suspends, is
answered, and finishes with only its own person's memory.
"""

from __future__ import annotations

from collections import Counter

import orjson
import pytest
from _runs import TOOLS, start, wait_for
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId
from prefect.flow_runs import resume_flow_run

from autopersona_flows.flows import pending_clarifications
from autopersona_flows.memory import PersonaMemory, open_store
from examples.reading_group import worklog

pytestmark = pytest.mark.e2e

PEOPLE = {"ada": ("email the reading group", "APA"), "bob": ("post it in the team chat", "MLA")}


def test_two_people_at_once_each_asked_once_and_nothing_crosses(postgres_stack) -> None:
    store = open_store(postgres_stack.store)
    for user, (channel, _) in PEOPLE.items():
        store.add(user, PersonaMemory(topic="sharing channel", preference=channel))

    runs = {user: start("persona-graph-runner/reading-group", {"user_id": user}) for user in PEOPLE}
    for run_id in runs.values():
        wait_for(run_id, "Suspended")
    waiting = {p.flow_run_id: p for p in pending_clarifications()}
    assert set(waiting) == set(runs.values())
    for user, run_id in runs.items():
        assert "which citation style would you like" in waiting[run_id].question
        resume_flow_run(run_id, run_input={"answer": PEOPLE[user][1]})
    for run_id in runs.values():
        wait_for(run_id, "Completed")

    calls = Counter((line["user"], line["tool"]) for line in worklog(postgres_stack.worklog))
    assert calls == {(user, tool): 1 for user in PEOPLE for tool in TOOLS}
    for user, (channel, style) in PEOPLE.items():
        remembered = {(m.content.topic, m.content.preference) for m in store.list(user, "persona")}
        assert remembered == {("sharing channel", channel), ("citation style", style)}
        table = decisions(runs[user])
        assert channel in table["share"]["constraints"]
        other = next(c for u, (c, _) in PEOPLE.items() if u != user)
        assert other not in orjson.dumps(table).decode()  # nothing of the other person


def decisions(run_id) -> dict[str, dict[str, str]]:
    """The run's `persona-decisions` table, by node."""
    runs = ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run_id]))
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=runs)
    (artifact,) = [a for a in found if a.key == "persona-decisions"]
    return {row["node"]: row for row in orjson.loads(artifact.data)}
