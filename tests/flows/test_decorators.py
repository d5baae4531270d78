"""@persona_task inside a user-written @flow: the same pre-hook as a graph node, a Prefect task."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from typing import Any

import pytest
from prefect import flow, task, unmapped

from autopersona_flows.agent import PersonaAgent, Requirement
from autopersona_flows.errors import (
    ClarificationBudgetError,
    FlowConfigurationError,
    NodeOutputError,
)
from autopersona_flows.flows import NodeContext, answer_clarification, persona_runtime, persona_task
from autopersona_flows.memory import PersonaMemory
from autopersona_flows.testing import answering as a_person_answering

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

    with pytest.raises(NodeOutputError, match=r"argument 'references' of 'format_references'.*set"):
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


# --------------------------------------------------------------------------- a Prefect task

STYLE = Requirement("citation style", options=["APA", "MLA"])
FINISHED = threading.Event()  # set when `slow_fetch` returns


@persona_task(requires=[STYLE])
async def format_async(context: NodeContext, references: list[str]) -> dict:
    """Format the references, asynchronously."""
    await asyncio.sleep(0)
    CALLS["format_async"] += 1
    return {"style": context.requirement("citation style").value, "references": references}


@persona_task(requires=[STYLE])
def cite(context: NodeContext, reference: str, suffix: list[str]) -> str:
    """Cite one reference."""
    CALLS[f"cite {reference}"] += 1
    return f"{reference} ({context.requirement('citation style').value}){''.join(suffix)}"


@persona_task
def slow_fetch(context: NodeContext, source: str) -> str:
    """Fetch a source, slowly."""
    time.sleep(1.5)  # longer than deciding and asking take
    CALLS["slow_fetch"] += 1
    FINISHED.set()
    return f"{source} fetched"


@persona_task(retries=2)
def join(context: NodeContext, parts: list[Any]) -> list[Any]:
    """Join parts."""
    CALLS["join"] += 1
    return parts


@task
def produce(n: int) -> list[str]:
    return [f"ref-{i}" for i in range(n)]


@task
def produce_a_set() -> set[str]:
    return {"not", "json"}


def runtime_options(episode_id: str | None) -> dict[str, Any]:
    return {
        "user_id": "ada",
        "query": "Write my paper",
        "poll_interval": 0.5,
        "pause_timeout": 120,
        "episode_id": episode_id,
    }


def answering(watch_for_pause, answer: str, seen: list[bool] | None = None) -> Any:
    def on_paused(waiting) -> None:
        if seen is not None:
            seen.append(FINISHED.is_set())
        answer_clarification(waiting.flow_run_id, answer)

    return watch_for_pause(on_paused)


@flow
async def write_async(agent: Any, episode_id: str | None = None) -> dict:
    with persona_runtime(agent, **runtime_options(episode_id)):
        references = await format_async(["Knuth 1984"])
        summary = summarise("A long text about retrieval")  # a sync persona task, called here
        return {"references": references, "summary": summary}


@pytest.mark.filterwarnings("ignore:unclosed:ResourceWarning")  # see run_async
def test_an_async_persona_task_in_an_async_flow_asks_once_and_replays(
    prefect_harness, kit, watch_for_pause, run_async
) -> None:
    watcher = answering(watch_for_pause, "MLA")
    first = run_async(write_async(kit.agent, "async-1"))
    watcher.finish()
    assert first["references"] == {"style": "MLA", "references": ["Knuth 1984"]}
    assert first["summary"].startswith("A long tex")
    assert CALLS == {"format_async": 1, "summarise": 1}

    again = run_async(write_async(kit.agent, "async-1"))  # a pause would wait for nobody
    assert again == first
    assert CALLS == {"format_async": 1, "summarise": 1}  # nothing ran again


@flow
def submitting(agent: Any, episode_id: str) -> dict:
    with persona_runtime(agent, **runtime_options(episode_id)):
        fetched = slow_fetch.submit("arxiv")  # runs while the next one decides, and asks
        formatted = format_async.submit(["Knuth 1984"])  # async, submitted from a sync flow
        return {"fetched": fetched.result(), "formatted": formatted.result()}


def test_submit_returns_a_future_of_the_result_and_a_question_waits_for_work_in_flight(
    prefect_harness, kit, watch_for_pause
) -> None:
    FINISHED.clear()
    finished_when_asked: list[bool] = []
    watcher = answering(watch_for_pause, "APA", finished_when_asked)
    first = submitting(kit.agent, "submit-1")
    watcher.finish()
    assert first == {
        "fetched": "arxiv fetched",
        "formatted": {"style": "APA", "references": ["Knuth 1984"]},
    }
    assert finished_when_asked == [True]  # a suspend here would have lost no work
    assert CALLS == {"slow_fetch": 1, "format_async": 1}

    assert submitting(kit.agent, "submit-1") == first
    assert CALLS == {"slow_fetch": 1, "format_async": 1}


@flow
def mapping(agent: Any, episode_id: str) -> list[str]:
    with persona_runtime(agent, **runtime_options(episode_id)):
        futures = cite.map(["Knuth", "Lamport", "Knuth"], suffix=unmapped(["."]))
        return [*futures.result(), *(str(f.task_run_id) for f in futures)]


def test_map_runs_each_element_under_its_own_key_once_across_a_pause(
    prefect_harness, kit, watch_for_pause, settled_task_run
) -> None:
    watcher = answering(watch_for_pause, "MLA")
    first = mapping(kit.agent, "map-1")
    watcher.finish()
    assert first[:3] == ["Knuth (MLA).", "Lamport (MLA).", "Knuth (MLA)."]
    assert CALLS == {"cite Knuth": 2, "cite Lamport": 1}  # equal arguments, own elements
    names = [settled_task_run(run_id).name for run_id in first[3:]]
    assert names == ["cite[0]", "cite[1]", "cite[2]"]

    again = mapping(kit.agent, "map-1")  # one question, asked once: no pause now
    assert again[:3] == first[:3]
    assert CALLS == {"cite Knuth": 2, "cite Lamport": 1}


@flow
def chaining(agent: Any) -> dict:
    with persona_runtime(agent, **runtime_options(None)):
        refs = produce.submit(2)  # a future
        one = produce(1, return_state=True)  # a state
        direct = join(refs)
        nested = join.submit([refs, one, "plain"])
        mapped = cite.map(refs, suffix=unmapped([]))  # mapped over the future's result
        bad = join.submit(produce_a_set.submit())
        bad.wait()
        return {
            "direct": direct,
            "nested": nested.result(),
            "mapped": mapped.result(),
            "bad": bad.result(raise_on_failure=False),
            "bad run": str(bad.task_run_id),
        }


def test_futures_and_states_are_resolved_as_prefect_resolves_them(
    prefect_harness, kit, settled_task_run
) -> None:
    kit.store.add("ada", PersonaMemory(topic="citation style", preference="APA"))
    result = chaining(kit.agent)
    assert result["direct"] == ["ref-0", "ref-1"]
    assert result["nested"] == [["ref-0", "ref-1"], ["ref-0"], "plain"]
    assert result["mapped"] == ["ref-0 (APA)", "ref-1 (APA)"]
    assert isinstance(result["bad"], NodeOutputError)
    assert "argument 'parts' of 'join' (as its futures resolved) must be a JSON value" in str(
        result["bad"]
    )
    assert CALLS["join"] == 2  # the bad one never reached the function
    assert settled_task_run(result["bad run"]).run_count == 1  # ours: never retried


@persona_task(requires=[Requirement("paper size", options=["A4", "Letter"])])
async def print_paper(context: NodeContext, text: str) -> str:
    """Print the paper."""
    CALLS["print_paper"] += 1
    return str(context.requirement("paper size").value)


@persona_task(requires=[Requirement("citation style", options=["APA", "MLA"])])
async def cite_async(context: NodeContext, references: list[str]) -> str:
    """Format the references."""
    CALLS["cite_async"] += 1
    return str(context.requirement("citation style").value)


@flow
async def cite_and_print(agent: Any) -> list[str]:
    with persona_runtime(
        agent, user_id="ada", query="Write my paper", poll_interval=0.2, pause_timeout=60
    ):
        return list(await asyncio.gather(cite_async(["Knuth 1984"]), print_paper("the text")))


@pytest.mark.filterwarnings("ignore:unclosed:ResourceWarning")
def test_async_persona_tasks_awaited_together_ask_one_after_the_other(
    prefect_harness, kit, run_async
) -> None:
    with a_person_answering({"citation style": "MLA", "paper size": "A4"}) as person:
        assert run_async(cite_and_print(kit.agent)) == ["MLA", "A4"]
    assert sorted(q.answer for q in person.asked) == ["A4", "MLA"]
    assert len({q.key for q in person.asked}) == 2  # two forms, one at a time
    assert CALLS == {"cite_async": 1, "print_paper": 1}


@persona_task(requires=[Requirement("paper size", options=["A4", "Letter"])])
def size_paper(context: NodeContext) -> str:
    """Choose the paper size."""
    CALLS["size_paper"] += 1
    return str(context.requirement("paper size").value)


@persona_task(requires=[Requirement("citation style", options=["APA", "MLA"])])
def style_references(context: NodeContext) -> str:
    """Format the references."""
    CALLS["style_references"] += 1
    return str(context.requirement("citation style").value)


@flow
def on_a_budget(agent: Any) -> list[str]:
    with persona_runtime(
        agent, user_id="ada", query="Write my paper", poll_interval=0.2, question_budget=1
    ):
        return [style_references(), size_paper()]


def test_the_question_budget_counts_every_question_of_the_flow_run(prefect_harness, kit) -> None:
    with (
        a_person_answering({"citation style": "MLA", "paper size": "A4"}) as person,
        pytest.raises(ClarificationBudgetError, match="paper size"),
    ):
        on_a_budget(kit.agent)
    assert [q.answer for q in person.asked] == ["MLA"]  # one question: the budget
    assert CALLS == {"style_references": 1}
