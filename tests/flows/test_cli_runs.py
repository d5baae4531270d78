"""The run commands on a real Prefect server: pending, answer (several questions), notify."""

from __future__ import annotations

import re
import threading
import time
from typing import Any

import pytest
from prefect.client.orchestration import get_client

from autopersona_flows.agent import Requirement
from autopersona_flows.cli import main
from autopersona_flows.flows import TaskGraph, TaskNode, pending_clarifications, run_persona_graph

pytestmark = pytest.mark.usefixtures("prefect_harness")

CITATION = Requirement("citation style", options=["APA", "MLA"])
CHANNEL = Requirement("sharing channel", question="Where should the paper be shared?")


def test_a_form_of_two_questions_is_listed_and_answered_from_the_command_line(kit, capsys) -> None:
    graph = TaskGraph(
        [
            TaskNode(id="draft", tool=kit.record, requires=[CITATION]),
            TaskNode(id="share", tool=kit.record, depends_on=["draft"], requires=[CHANNEL]),
        ]
    )
    seen: dict[str, Any] = {}

    def person() -> None:
        until = time.monotonic() + 60
        while not (waiting := pending_clarifications()) and time.monotonic() < until:
            time.sleep(0.1)
        run = str(waiting[0].flow_run_id)
        seen["pending"] = main(["pending"])
        seen["plain"] = main(["answer", run, "MLA"])  # two questions: one answer is refused
        seen["unknown"] = main(["answer", run, "citation_style=MLA", "colour=red"])
        seen["blank"] = main(["answer", run, "citation_style=MLA", "sharing_channel=  "])
        seen["answered"] = main(
            ["answer", run, "citation_style=MLA", "sharing_channel=the team channel"]
        )

    thread = threading.Thread(target=person, daemon=True)
    thread.start()
    result = run_persona_graph(graph, "ada", "Share my paper", agent=kit.agent, poll_interval=0.3)
    thread.join(30)
    out, err = capsys.readouterr()

    assert seen == {"pending": 0, "plain": 1, "unknown": 1, "blank": 1, "answered": 0}
    assert "2 questions:" in out
    assert "citation_style=" in out
    assert "[APA | MLA]" in out
    assert "sharing_channel=  Where should the paper be shared?" in out
    # One answer to two questions: each field named with its question, no schema jargon.
    assert "asks 2 questions: answer each as FIELD=ANSWER" in err
    assert "citation_style=  To share your paper, which citation style" in err
    assert "sharing_channel=  Where should the paper be shared?" in err
    assert "Additional properties" not in err
    assert "asks no question 'colour'" in err
    # Whom it asks, its flow and run, since when, whether its process waits, each step.
    assert "  for ada  persona-graph/" in out
    assert re.search(r"  waiting \d+ s  process \d+ on \S+ waits  2 questions:", out)
    assert "(before: share)" in out
    assert "Where should the paper be shared?" in err  # the blank answer names its question
    assert result["metrics"]["clarifications"] == 2
    assert kit.contexts["share"][0].requirement("sharing channel").value == "the team channel"
    assert kit.contexts["draft"][0].requirement("citation style").value == "MLA"


def test_notify_create_makes_the_automation_and_refuses_what_cannot_notify(capsys) -> None:
    name = "autopersona test: notify create"
    assert main(["notify", "create", "--webhook", "http://127.0.0.1:9/hook", "--name", name]) == 0
    out, _ = capsys.readouterr()
    assert f"automation {name!r}" in out
    with get_client(sync_client=True) as client:
        [automation] = client.read_automations_by_name(name)
    assert automation.trigger.expect == {"autopersona.clarification.requested"}
    # Gone again: it would send every later test's questions to a closed port.
    assert main(["notify", "delete", name]) == 0

    assert main(["notify", "create"]) == 1
    _, err = capsys.readouterr()
    assert err.startswith("error: give exactly one of webhook_url")
    assert main(["notify", "create", "--webhook", "ftp://example.org/x"]) == 1
