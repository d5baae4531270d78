"""A waiting run on a real Prefect server: blank answers refused, the question announced.

The run states its question in its logs, its artifact and a Prefect event; an
automation made by `create_clarification_automation` delivers it, with the run's
link, to a webhook receiver on 127.0.0.1 within moments of the pause.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from uuid import UUID, uuid4

import orjson
import pytest
from prefect.blocks.notifications import CustomWebhookNotificationBlock
from prefect.blocks.webhook import Webhook
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    ArtifactFilterKey,
    LogFilter,
    LogFilterFlowRunId,
)
from prefect.client.schemas.objects import StateType
from prefect.client.schemas.sorting import ArtifactSort
from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter
from prefect.flow_runs import resume_flow_run

from autopersona_flows.agent import Requirement
from autopersona_flows.errors import BlankAnswerError, NotificationError
from autopersona_flows.flows import PendingClarification, TaskGraph, TaskNode, run_persona_graph
from autopersona_flows.flows.answers import answer_clarification
from autopersona_flows.flows.events import (
    CLARIFICATION_ANSWERED,
    CLARIFICATION_REQUESTED,
    flow_run_url,
)
from autopersona_flows.flows.notifications import create_clarification_automation

pytestmark = pytest.mark.usefixtures("prefect_harness")

USER = "ada"
QUERY = "Summarise the meeting"
FAST = {"poll_interval": 0.5, "pause_timeout": 120}


def summary_graph(kit) -> TaskGraph:
    return TaskGraph(
        [
            TaskNode(
                id="write_summary",
                instruction="Write the summary",
                tool=kit.record,
                requires=[Requirement("tone")],  # text, not a choice
            )
        ]
    )


def state_of(run_id: UUID) -> StateType:
    with get_client(sync_client=True) as client:
        state = client.read_flow_run(run_id).state
    assert state is not None
    return state.type


def eventually(read: Callable[[], Any], timeout: float = 20.0) -> Any:
    """What ``read`` returns once it is truthy: logs and events reach the server later."""
    until = time.monotonic() + timeout
    while not (found := read()) and time.monotonic() < until:
        time.sleep(0.2)
    assert found, f"nothing arrived within {timeout} s"
    return found


def events(name: str, run_id: UUID) -> list[Any]:
    flow_run = EventResourceFilter(id=[f"prefect.flow-run.{run_id}"])
    with get_client(sync_client=True) as client:
        # Prefect 3.9.1's client asks for 100 by default, which its server refuses (max 50).
        page = client.read_events(
            EventFilter(event=EventNameFilter(name=[name]), resource=flow_run), limit=50
        )
    return page.events


def test_a_blank_answer_is_refused_and_the_run_waits_for_a_real_one(kit, watch_for_pause) -> None:
    seen: dict[str, Any] = {}

    def person(waiting: PendingClarification) -> None:
        seen["question"] = waiting.question
        # The form itself refuses it: Prefect's server validates the input.
        with pytest.raises(RuntimeError, match="Validation failed"):
            resume_flow_run(waiting.flow_run_id, run_input={"answer": "   "})
        seen["after blank"] = state_of(waiting.flow_run_id)
        with pytest.raises(BlankAnswerError, match=re.escape(repr(waiting.question))):
            answer_clarification(waiting.flow_run_id, " \t ")
        seen["after blank answer"] = state_of(waiting.flow_run_id)
        answer_clarification(waiting.flow_run_id, "terse")

    watcher = watch_for_pause(person)
    result = run_persona_graph(summary_graph(kit), USER, QUERY, agent=kit.agent, **FAST)
    run_id = watcher.finish()

    question = seen["question"]
    assert question.startswith("Which tone should I use to write the summary?")
    assert (seen["after blank"], seen["after blank answer"]) == (StateType.PAUSED,) * 2
    assert state_of(run_id) == StateType.COMPLETED
    assert result["outputs"]["write_summary"]["answer"] == "terse"
    learned = [(r.content.topic, r.content.preference) for r in kit.store.list(USER, "persona")]
    assert learned == [("tone", "terse")]

    # The artifact: the question while waiting, then a new version with the answer.
    with get_client(sync_client=True) as client:
        versions = client.read_artifacts(
            artifact_filter=ArtifactFilter(
                key=ArtifactFilterKey(like_="clarify-write-summary-"),
                flow_run_id=ArtifactFilterFlowRunId(any_=[run_id]),
            ),
            sort=ArtifactSort.CREATED_DESC,
        )
        logs = eventually(
            lambda: [
                log.message
                for log in client.read_logs(
                    LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id]))
                )
                if "terse" in log.message
            ]
        )
    assert [v.key for v in versions] == [versions[0].key] * 2
    latest, first = versions
    assert question in first.data
    assert "Waiting for an answer" in first.data
    assert "Answer: **terse**" in latest.data
    assert "Write the summary" in latest.data
    assert "needs an answer" not in first.data + latest.data
    assert latest.description == "Answered: terse"

    # The logs state the question when the run starts waiting, the answer when it goes on.
    with get_client(sync_client=True) as client:
        messages = [
            log.message
            for log in client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])))
        ]
    waiting_line = next(m for m in messages if m.startswith("Waiting for an answer"))
    assert question in waiting_line
    assert flow_run_url(run_id) in waiting_line
    assert any(question in m and "'terse'" in m for m in logs)

    # Both events are about the flow run, and say who, where, what and the link.
    [requested] = eventually(lambda: events(CLARIFICATION_REQUESTED, run_id))
    [answered] = eventually(lambda: events(CLARIFICATION_ANSWERED, run_id))
    assert requested.resource.id == f"prefect.flow-run.{run_id}"
    payload = requested.payload
    assert (payload["user_id"], payload["nodes"], payload["flow_run_id"]) == (
        USER,
        ["write_summary"],
        str(run_id),
    )
    [asked] = payload["questions"]
    assert (asked["question"], asked["options"], asked["step"]) == (
        question,
        [],
        "Write the summary",
    )
    assert asked["key"] == versions[0].key
    assert payload["url"] == flow_run_url(run_id)
    assert payload["url"].endswith(f"/runs/flow-run/{run_id}")
    assert "None" not in payload["url"]
    assert question in payload["message"]
    assert payload["url"] in payload["message"]
    assert answered.payload["answers"] == ["terse"]
    assert answered.payload["questions"] == payload["questions"]


# --------------------------------------------------------------------------- notifications


class Receiver(ThreadingHTTPServer):
    """An HTTP server on 127.0.0.1 that keeps every request body it receives, with when."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.received: list[tuple[datetime, str, bytes]] = []
        self.arrived = threading.Condition()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def wait_for(self, count: int, timeout: float = 30.0) -> list[tuple[datetime, str, bytes]]:
        with self.arrived:
            self.arrived.wait_for(lambda: len(self.received) >= count, timeout)
            assert len(self.received) >= count, f"{len(self.received)} of {count} arrived"
            return list(self.received)


class _Handler(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with self.server.arrived:
            self.server.received.append((datetime.now(UTC), self.path, body))
            self.server.arrived.notify_all()
        self.send_response(200)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass  # no request lines in the test output


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    thread.join(10)
    server.server_close()


def test_an_automation_sends_the_question_and_the_link_when_a_run_waits(
    kit, watch_for_pause, receiver: Receiver
) -> None:
    # One automation through a webhook URL, one through a notification block by slug.
    name = f"test-{uuid4().hex[:8]}"
    by_url = create_clarification_automation(webhook_url=f"{receiver.url}/hook", name=f"{name}-url")
    CustomWebhookNotificationBlock(
        name="autopersona",
        url=f"{receiver.url}/notify",
        json_data={"subject": "{{subject}}", "body": "{{body}}"},
    ).save(name, overwrite=True)
    by_block = create_clarification_automation(
        block_slug=f"custom-webhook/{name}", name=f"{name}-block"
    )
    assert by_url.id is not None
    assert by_block.id is not None
    # Creating it again replaces it: one automation per name.
    again = create_clarification_automation(webhook_url=f"{receiver.url}/hook", name=f"{name}-url")
    with get_client(sync_client=True) as client:
        assert [a.id for a in client.read_automations_by_name(f"{name}-url")] == [again.id]
    time.sleep(2)  # the server's trigger service loads new automations in the background

    def person(waiting: PendingClarification) -> None:
        receiver.wait_for(2)
        answer_clarification(waiting.flow_run_id, "warm")

    watcher = watch_for_pause(person)
    run_persona_graph(summary_graph(kit), USER, QUERY, agent=kit.agent, **FAST)
    run_id = watcher.finish()
    try:
        received = {path: (at, body) for at, path, body in receiver.wait_for(2)}
        assert sorted(received) == ["/hook", "/notify"]
        hook = orjson.loads(received["/hook"][1])
        notice = orjson.loads(received["/notify"][1])
        question = "Which tone should I use to write the summary?"
        link = flow_run_url(run_id)
        assert question in hook["text"]
        assert link in hook["text"]
        assert (hook["url"], hook["flow_run_id"], hook["user_id"]) == (link, str(run_id), USER)
        assert [q["question"] for q in hook["questions"]] == [question]
        assert notice["subject"] == "A run is waiting for your answer"
        assert question in notice["body"]
        assert link in notice["body"]
        # The link is the run's: the API behind the same address knows it.
        with get_client(sync_client=True) as client:
            api = str(client.api_url).rstrip("/")
            assert link == f"{api.removesuffix('/api')}/runs/flow-run/{run_id}"
            assert client.read_flow_run(UUID(link.rsplit("/", 1)[1])).id == run_id
        occurred = datetime.fromisoformat(hook["occurred"])
        latency = {path: (at - occurred).total_seconds() for path, (at, _) in received.items()}
        print(f"event -> delivery latency: {latency}")
        assert all(0 <= seconds < 10 for seconds in latency.values()), latency
    finally:
        with get_client(sync_client=True) as client:
            for automation in (again, by_block):
                assert automation.id is not None
                client.delete_automation(automation.id)


def test_an_automation_is_refused_clearly_when_it_cannot_notify() -> None:
    with pytest.raises(NotificationError, match="exactly one"):
        create_clarification_automation()
    with pytest.raises(NotificationError, match="exactly one"):
        create_clarification_automation(webhook_url="http://127.0.0.1:1/", block_slug="a/b")
    with pytest.raises(NotificationError, match="not an http"):
        create_clarification_automation(webhook_url="127.0.0.1:9/hook")
    with pytest.raises(NotificationError, match="not a block slug"):
        create_clarification_automation(block_slug="slack-webhook")
    with pytest.raises(NotificationError, match="prefect block create slack-webhook"):
        create_clarification_automation(block_slug=f"slack-webhook/missing-{uuid4().hex[:6]}")
    name = f"plain-{uuid4().hex[:6]}"
    Webhook(url="http://127.0.0.1:1/").save(name)  # calls a URL, but is no notification block
    with pytest.raises(NotificationError, match="cannot send notifications"):
        create_clarification_automation(block_slug=f"webhook/{name}")
