"""@persona_task inside a user-written @flow: the same pre-hook as a graph node."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from prefect import flow

from autopersona_flows.agent import PersonaAgent, Requirement
from autopersona_flows.errors import FlowConfigurationError, NodeOutputError
from autopersona_flows.flows import NodeContext, answer_clarification, persona_runtime, persona_task
from autopersona_flows.memory import PersonaMemory

CALLS: Counter[str] = Counter()
SEEN: list[NodeContext] = []


@persona_task(requires=[Requirement("citation style", options=["APA", "MLA"])])
def format_references(
    context: NodeContext, references: list[str], *, numbered: bool = False
) -> dict:
    """Format the references of the paper."""
    CALLS["format_references"] += 1
    SEEN.append(context)
    style = context.requirement("citation style").value
    return {"style": style, "references": references, "numbered": numbered}


@persona_task
def summarise(context: NodeContext, text: str) -> str:
    """Summarise a text in the person's preferred length."""
    CALLS["summarise"] += 1
    SEEN.append(context)
    return f"{text[:10]}... ({context.guidance.count('- ')} preferences applied)"


@flow
def write_paper(agent: Any, user_id: str, episode_id: str | None = None) -> dict:
    with persona_runtime(
        agent,
        user_id=user_id,
        query="Write my paper",
        poll_interval=0.5,
        pause_timeout=120,  # a pause nobody answers fails the test instead of hanging it
        episode_id=episode_id,
    ):
        return {
            "references": format_references(["Knuth 1984"], numbered=True),
            "summary": summarise("A long text about retrieval"),
        }


@pytest.fixture(autouse=True)
def _reset() -> None:
    CALLS.clear()
    SEEN.clear()


def test_a_persona_task_asks_once_runs_once_and_remembers(
    prefect_harness, kit, watch_for_pause
) -> None:
    kit.store.add("ada", PersonaMemory(topic="summary length", preference="one paragraph"))
    watcher = watch_for_pause(lambda waiting: answer_clarification(waiting.flow_run_id, "MLA"))
    first = write_paper(kit.agent, "ada")
    watcher.finish()
    assert first["references"] == {"style": "MLA", "references": ["Knuth 1984"], "numbered": True}
    assert CALLS == {"format_references": 1, "summarise": 1}
    asked = SEEN[0]
    assert asked.node.id == "format_references"
    assert asked.node.instruction == "Format the references of the paper."
    assert asked.answer == "MLA"
    assert "citation style" in (asked.question or "")
    assert "summary length: one paragraph" in SEEN[1].guidance  # the guidance reaches the tool

    second = write_paper(kit.agent, "ada")  # a pause here would wait for nobody: it must not
    assert second["references"]["style"] == "MLA"
    assert SEEN[2].answer is None
    assert SEEN[2].constraints[0].text == "citation style: MLA"


def test_a_stable_episode_replays_from_cache(prefect_harness, kit) -> None:
    kit.store.add("ada", PersonaMemory(topic="citation style", preference="APA"))
    first = write_paper(kit.agent, "ada", episode_id="paper-1")
    again = write_paper(kit.agent, "ada", episode_id="paper-1")
    assert again == first
    assert CALLS == {"format_references": 1, "summarise": 1}
    write_paper(kit.agent, "ada", episode_id="paper-2")
    assert CALLS == {"format_references": 2, "summarise": 2}


def test_arguments_must_be_json_values(prefect_harness, kit) -> None:
    kit.store.add("ada", PersonaMemory(topic="citation style", preference="APA"))

    @flow
    def bad(agent: PersonaAgent) -> None:
        with persona_runtime(agent, user_id="ada"):
            format_references({"a set"})  # type: ignore[arg-type]

    with pytest.raises(NodeOutputError, match="arguments of 'format_references'"):
        bad(kit.agent)
    assert CALLS == {}


def test_configuration_mistakes_are_clear(prefect_harness, kit) -> None:
    @flow
    def no_runtime() -> None:
        summarise("text")

    @flow
    def no_user(agent: PersonaAgent) -> None:
        with persona_runtime(agent):
            summarise("text")

    with pytest.raises(FlowConfigurationError, match="needs a user"):
        no_runtime()  # the settings give an agent, never a user
    with pytest.raises(FlowConfigurationError, match="needs a user"):
        no_user(kit.agent)
    with (
        persona_runtime(kit.agent, user_id="ada"),
        pytest.raises(FlowConfigurationError, match="inside a Prefect flow"),
    ):
        summarise("text")
    assert CALLS == {}


def test_names_and_requirements_are_validated() -> None:
    renamed = persona_task(name="fmt-refs")(lambda context: None)
    assert renamed.node.id == "fmt-refs"
    with pytest.raises(ValueError, match="node id"):
        persona_task(name="has space")(lambda context: None)
    assert (
        repr(format_references) == "PersonaTask('format_references', requires=['citation style'])"
    )
