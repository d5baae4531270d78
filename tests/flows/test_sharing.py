"""Two runs asking one person the same question: one answer resumes both."""

from __future__ import annotations

import threading
import time
from typing import Any

from autopersona_flows.agent import Requirement
from autopersona_flows.flows import (
    TaskGraph,
    TaskNode,
    answer_clarification,
    pending_clarifications,
    run_persona_graph,
)
from autopersona_flows.memory import PersonaMemory

STYLE = Requirement("citation style", options=["APA", "MLA"])


def _waiting(count: int, timeout: float = 60) -> list[Any]:
    give_up = time.monotonic() + timeout
    while time.monotonic() < give_up:
        found = pending_clarifications()
        if len(found) >= count:
            return found
        time.sleep(0.1)
    raise AssertionError(f"fewer than {count} runs waited for an answer")


def _run_both(
    kit: Any, users: tuple[str, str], nodes: tuple[str, str]
) -> tuple[list[dict], list[threading.Thread]]:
    """Start a run for each user (a node each); answer the first that waits; return them."""
    results: list[dict] = []

    def run(user: str, node: str) -> None:
        graph = TaskGraph([TaskNode(id=node, tool=kit.record, requires=[STYLE])])
        results.append(
            run_persona_graph(
                graph, user, "Write my paper", agent=kit.agent, poll_interval=0.2, pause_timeout=60
            )
        )

    threads = [threading.Thread(target=run, args=pair) for pair in zip(users, nodes, strict=True)]
    for thread in threads:
        thread.start()
    first = _waiting(2)[0]
    answer_clarification(first.flow_run_id, "MLA")  # the person answers one of them
    return results, threads


def test_a_person_answers_a_question_two_runs_ask_once(prefect_harness, kit) -> None:
    results, threads = _run_both(kit, ("ada", "ada"), ("format", "cite"))
    for thread in threads:
        thread.join(60)
    assert sorted(r["outputs"][n]["answer"] for r in results for n in r["outputs"]) == [
        "MLA",
        "MLA",
    ]
    assert kit.calls == {"format": 1, "cite": 1}
    assert pending_clarifications() == []
    stored = kit.store.list("ada", "persona")
    assert [m.content.preference for m in stored if isinstance(m.content, PersonaMemory)] == ["MLA"]


def test_another_persons_question_is_not_answered_for_them(prefect_harness, kit) -> None:
    results, threads = _run_both(kit, ("ada", "bob"), ("format", "cite"))
    threads_done = time.monotonic() + 60
    while not results and time.monotonic() < threads_done:
        time.sleep(0.1)
    time.sleep(1)  # time for a wrong resume to show
    [still] = pending_clarifications()  # the other person's run waits for their own answer
    assert len(results) == 1
    answer_clarification(still.flow_run_id, "APA")
    for thread in threads:
        thread.join(60)
    assert sorted(r["outputs"][n]["answer"] for r in results for n in r["outputs"]) == [
        "APA",
        "MLA",
    ]
