"""A waiting run on a real Prefect server: blank answers refused, the question announced.

The run states its question in its logs, its artifact and a Prefect event; an
automation made by `create_clarification_automation` delivers it, with the run's
link, to a webhook receiver on 127.0.0.1 within moments of the pause.
"""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from uuid import UUID, uuid4

import orjson
import pytest
from prefect.automations import (
    AutomationCore,
    CallWebhook,
    DoNothing,
    EventTrigger,
    Posture,
    SendNotification,
)
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
from prefect.events import emit_event
from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter
from prefect.exceptions import ObjectNotFound
from prefect.flow_runs import resume_flow_run

from autopersona_flows import _json
from autopersona_flows.agent import Requirement
from autopersona_flows.cli import main
from autopersona_flows.errors import BlankAnswerError, NotificationError
from autopersona_flows.flows import PendingClarification, TaskGraph, TaskNode, run_persona_graph
from autopersona_flows.flows.answers import answer_clarification
from autopersona_flows.flows.events import (
    CLARIFICATION_ANSWERED,
    CLARIFICATION_REQUESTED,
    flow_run_url,
)
from autopersona_flows.flows.notifications import (
    WEBHOOK_PAYLOAD,
    create_clarification_automation,
    delete_clarification_automation,
    list_clarification_automations,
)

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
    assert question == "To write the summary, what tone would you like?"
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
    """An HTTP server on 127.0.0.1 that keeps every request body it receives, with when.

    ``delay`` is how long it takes to answer (a chat service takes a few tenths of a
    second); with ``refuse_first`` it answers 503 the first time it sees a body, as a
    service that is briefly unavailable does, and keeps only what it accepted.
    """

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.received: list[tuple[datetime, str, bytes]] = []
        self.arrived = threading.Condition()
        self.delay = 0.0
        self.refuse_first = False
        self.refused: set[bytes] = set()

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
            refused = self.server.refuse_first and body not in self.server.refused
            if refused:
                self.server.refused.add(body)
            else:
                self.server.received.append((datetime.now(UTC), self.path, body))
                self.server.arrived.notify_all()
        time.sleep(self.server.delay)
        self.send_response(503 if refused else 200)
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

    asked: list[str] = []

    def person(waiting: PendingClarification) -> None:
        asked.append(waiting.question)
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
        [question] = asked
        assert "tone" in question
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


# ------------------------------------------------------------- many questions at once

ACTION_EXECUTED = "prefect.automation.action.executed"
ACTION_FAILED = "prefect.automation.action.failed"


def announce(runs: list[UUID]) -> None:
    """Emit the event of each run asking, all at once, as `flows.events` emits it.

    Forty real runs would reach their pause one after another (a run's start takes
    its turn at the server's database); the automation sees only the events, so these
    are the events, sent together, each about its own run.
    """
    for run in runs:
        url = flow_run_url(run)
        emit_event(
            CLARIFICATION_REQUESTED,
            resource={"prefect.resource.id": f"prefect.flow-run.{run}"},
            payload={
                "user_id": USER,
                "flow_run_id": str(run),
                "nodes": ["write_summary"],
                "questions": [{"question": "Which tone?", "options": [], "key": f"k-{run}"}],
                "url": url,
                "message": f"A run is waiting for your answer: Which tone? {url}",
            },
        )


def action_outcomes(automation_id: UUID) -> Counter[str]:
    """How Prefect recorded each of the automation's deliveries: executed or failed."""
    automation = EventResourceFilter(id=[f"prefect.automation.{automation_id}"])
    names = EventNameFilter(name=[ACTION_EXECUTED, ACTION_FAILED])
    with get_client(sync_client=True) as client:
        page = client.read_events(EventFilter(event=names, resource=automation), limit=50)
    return Counter(event.event for event in page.events)


def delivered_runs(receiver: Receiver, count: int, timeout: float) -> list[str]:
    """The run ids in the bodies the receiver accepted, sorted, once ``count`` arrived."""
    until = time.monotonic() + timeout
    with receiver.arrived:
        receiver.arrived.wait_for(lambda: len(receiver.received) >= count, timeout)
    time.sleep(max(0.0, min(2.0, until - time.monotonic())))  # a duplicate would come now
    return sorted(orjson.loads(body)["flow_run_id"] for _, _, body in receiver.received)


def test_every_question_arrives_when_forty_runs_ask_at_the_same_moment(receiver) -> None:
    receiver.delay = 0.2  # as long as a chat service takes to answer a hook
    automation = create_clarification_automation(
        webhook_url=f"{receiver.url}/hook", name=f"test-many-{uuid4().hex[:8]}"
    )
    assert automation.id is not None
    time.sleep(2)  # the server's trigger service loads new automations in the background
    runs = [uuid4() for _ in range(40)]
    try:
        announce(runs)
        # Every run's question arrived, once.
        assert delivered_runs(receiver, len(runs), timeout=45) == sorted(map(str, runs))
        # And Prefect knows it did: no delivery cut short by another one closing the
        # connections it shared (Prefect's `Webhook` block: "ReadError('')" for about
        # a third of them, never tried again).
        outcomes = eventually(
            lambda: (seen := action_outcomes(automation.id)).total() >= len(runs) and seen
        )
        assert outcomes == {ACTION_EXECUTED: len(runs)}
    finally:
        with get_client(sync_client=True) as client:
            client.delete_automation(automation.id)


def test_a_question_refused_once_by_a_busy_receiver_is_sent_again(receiver) -> None:
    receiver.refuse_first = True  # 503 to each question's first delivery
    automation = create_clarification_automation(
        webhook_url=f"{receiver.url}/hook", name=f"test-busy-{uuid4().hex[:8]}"
    )
    assert automation.id is not None
    time.sleep(2)
    runs = [uuid4() for _ in range(10)]
    try:
        announce(runs)
        assert delivered_runs(receiver, len(runs), timeout=30) == sorted(map(str, runs))
        assert len(receiver.refused) == len(runs)
    finally:
        with get_client(sync_client=True) as client:
            client.delete_automation(automation.id)


# ------------------------------------------------------------------ list, replace, delete


def block_exists(block_id: UUID) -> bool:
    with get_client(sync_client=True) as client:
        try:
            client.read_block_document(block_id)
        except ObjectNotFound:
            return False
    return True


def test_an_automation_of_an_earlier_version_is_listed_and_replaced_by_creating_it_again(
    receiver,
) -> None:
    # What an earlier version made: a `Webhook` block and a call-webhook action.
    url = f"{receiver.url}/hook"
    name = f"test-old-{uuid4().hex[:8]}"
    old_block = Webhook(url=url, headers={"Content-Type": "application/json"}).save(
        f"autopersona-{_json.digest({'webhook': url})[:12]}", overwrite=True
    )
    old = AutomationCore(
        name=name,
        trigger=EventTrigger(
            expect={CLARIFICATION_REQUESTED},
            match={"prefect.resource.id": "prefect.flow-run.*"},
            posture=Posture.Reactive,
            threshold=1,
            within=timedelta(0),
        ),
        actions=[CallWebhook(block_document_id=old_block, payload=WEBHOOK_PAYLOAD)],
    )
    with get_client(sync_client=True) as client:
        old_id = client.create_automation(old)
    [listed] = [a for a in list_clarification_automations() if a.name == name]
    assert (listed.id, listed.enabled, listed.outdated) == (old_id, True, True)
    assert listed.sends_to.startswith("webhook/autopersona-")

    new = create_clarification_automation(webhook_url=url, name=name)

    [listed] = [a for a in list_clarification_automations() if a.name == name]
    assert (listed.id, listed.outdated) == (new.id, False)
    assert listed.sends_to == f"webhook {receiver.url}/…"
    [action] = new.actions
    assert isinstance(action, SendNotification)
    with get_client(sync_client=True) as client:
        document = client.read_block_document(action.block_document_id)
    assert document.block_type is not None
    assert document.block_type.slug == "custom-webhook"
    assert not block_exists(old_block)  # the old block went with the old automation
    delete_clarification_automation(name)
    assert not block_exists(action.block_document_id)


def test_notify_ls_and_delete_from_the_command_line(receiver, capsys) -> None:
    url = f"{receiver.url}/T0001/secret-part"  # a hook's path is its credential
    first, second = (f"test-cli-{uuid4().hex[:8]}" for _ in range(2))
    one = create_clarification_automation(webhook_url=url, name=first)
    two = create_clarification_automation(webhook_url=url, name=second)  # the same block
    CustomWebhookNotificationBlock(name="team", url=f"{receiver.url}/notify").save(
        first, overwrite=True
    )
    three = create_clarification_automation(block_slug=f"custom-webhook/{first}", name=first)
    other = f"test-other-{uuid4().hex[:8]}"  # an automation on another event, not ours
    with get_client(sync_client=True) as client:
        client.create_automation(
            AutomationCore(
                name=other,
                trigger=EventTrigger(expect={"prefect.flow-run.Failed"}, posture=Posture.Reactive),
                actions=[DoNothing()],
            )
        )
    [(url_action,), (block_action,)] = [one.actions, three.actions]
    assert isinstance(url_action, SendNotification)
    assert isinstance(block_action, SendNotification)
    saved, users = url_action.block_document_id, block_action.block_document_id
    try:
        assert main(["notify", "ls"]) == 0
        out, _ = capsys.readouterr()
        lines = {line.split("  ")[2]: line for line in out.splitlines()}
        assert lines[repr(first)] == (
            f"{three.id}  enabled  {first!r}  sends to custom-webhook/{first}"
        )
        assert lines[repr(second)] == (
            f"{two.id}  enabled  {second!r}  sends to webhook {receiver.url}/…"
        )
        assert repr(other) not in lines
        assert "secret" not in out

        # By name: `first` (made again through a block) goes; the block of the person stays.
        assert main(["notify", "delete", first]) == 0
        out, _ = capsys.readouterr()
        assert out == f"deleted automation {first!r} ({three.id})\n"
        assert block_exists(users)
        assert block_exists(saved)  # `second` still sends through it
        # By id: the last automation on the saved block takes it along.
        assert main(["notify", "delete", str(two.id)]) == 0
        assert capsys.readouterr().out == f"deleted automation {second!r} ({two.id})\n"
        assert not block_exists(saved)

        for missing in (first, other, str(uuid4())):
            assert main(["notify", "delete", missing]) == 1
            _, err = capsys.readouterr()
            assert err == (
                f"error: no automation named or with id {missing!r} sends our questions: "
                "`autopersona notify ls` lists them\n"
            )
        with get_client(sync_client=True) as client:
            assert len(client.read_automations_by_name(other)) == 1
    finally:
        with get_client(sync_client=True) as client:
            for automation in client.read_automations_by_name(other):
                assert automation.id is not None
                client.delete_automation(automation.id)
