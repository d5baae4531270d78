"""`ask_first`: the persona tasks a flow is about to run ask what they lack in one form."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from prefect import flow

from autopersona_flows.agent import Requirement
from autopersona_flows.errors import FlowConfigurationError
from autopersona_flows.flows import NodeContext, ask_first, persona_runtime, persona_task
from autopersona_flows.testing import answering

CALLS: Counter[str] = Counter()


@persona_task(requires=[Requirement("citation style", options=["APA", "MLA"])])
def format_references(context: NodeContext, references: list[str]) -> str:
    """Format the references of the paper."""
    CALLS["format_references"] += 1
    return f"{context.requirement('citation style').value}: {', '.join(references)}"


@persona_task(requires=[Requirement("sharing channel")])
def share(context: NodeContext, text: str) -> str:
    """Share the paper with the reading group."""
    CALLS["share"] += 1
    return f"{text} via {context.requirement('sharing channel').value}"


@flow
def write_and_share(agent: Any, user_id: str, *, first: bool, episode_id: str | None = None) -> Any:
    with persona_runtime(
        agent,
        user_id=user_id,
        query="Write my paper and share it",
        poll_interval=0.2,
        pause_timeout=120,
        episode_id=episode_id,
    ):
        if first:
            ask_first(format_references, share)
        return [format_references(["Knuth 1984"]), share("the draft")]


@pytest.fixture(autouse=True)
def _reset() -> None:
    CALLS.clear()


ANSWERS = {"citation style": "MLA", "sharing channel": "email the reading group"}
EXPECTED = ["MLA: Knuth 1984", "the draft via email the reading group"]


def test_what_the_tasks_lack_is_asked_in_one_form_before_either_runs(prefect_harness, kit) -> None:
    with answering(ANSWERS) as person:
        assert write_and_share(kit.agent, "ada", first=True, episode_id="paper-1") == EXPECTED
    assert sorted(q.field for q in person.asked) == ["citation_style", "sharing_channel"]
    assert len({(q.flow_run_id, q.key) for q in person.asked}) == 1  # one pause, one form
    assert CALLS == {"format_references": 1, "share": 1}

    # A replay of the episode asks nothing and runs nothing again; a new run asks nothing.
    with answering({}) as nobody:
        assert write_and_share(kit.agent, "ada", first=True, episode_id="paper-1") == EXPECTED
        assert write_and_share(kit.agent, "ada", first=True) == EXPECTED
    assert nobody.asked == []
    assert CALLS == {"format_references": 2, "share": 2}


def test_without_it_each_task_asks_when_it_is_reached(prefect_harness, kit) -> None:
    with answering(ANSWERS) as person:
        assert write_and_share(kit.agent, "ada", first=False) == EXPECTED
    assert len({q.key for q in person.asked}) == 2  # two pauses: what ask_first saves


def test_it_needs_persona_tasks_and_a_user(prefect_harness, kit) -> None:
    @flow
    def mistaken(what: Any) -> None:
        with persona_runtime(kit.agent, user_id="ada"):
            ask_first(what)

    with pytest.raises(FlowConfigurationError, match="persona tasks"):
        mistaken(print)

    @flow
    def nobody() -> None:
        with persona_runtime(kit.agent):
            ask_first(share)

    with pytest.raises(FlowConfigurationError, match="needs a user"):
        nobody()
