"""OpenAICompatiblePolicy against a real HTTP server on 127.0.0.1 that replies from a script."""

import base64
import json
import logging
import socket
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from autopersona_flows import JsonlMemoryStore, MemoryUpdater, PersonaMemory, PolicyError
from autopersona_flows.agent import (
    ClarifyDecision,
    FinalDecision,
    NodeInfo,
    PersonaAgent,
    PersonaRequest,
    Requirement,
)
from autopersona_flows.agent.openai import OUTPUT_SCHEMA, OpenAICompatiblePolicy
from autopersona_flows.memory.records import Embedding, MemoryRecord, WorkspaceMemory
from autopersona_flows.memory.retrieval import (
    MemoryBundle,
    MemoryRetriever,
    ScoredMemory,
    SearchRequest,
)

HANG = "hang"  # a scripted reply that sends nothing until the server shuts down

Reply = tuple[int, Any] | Callable[[dict[str, Any]], tuple[int, Any]] | str


class FakeServer:
    """A chat-completions server that records every request and replies from a script."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.replies: list[Reply] = []
        self.release = threading.Event()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        # A short poll interval: shutdown() waits for one, and every test shuts a server down.
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def script(self, *replies: Reply) -> None:
        self.replies.extend(replies)

    def bodies(self) -> list[dict[str, Any]]:
        return [request["body"] for request in self.requests]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers["Content-Length"]))
                server.requests.append(
                    {
                        "path": self.path,
                        "headers": {k.lower(): v for k, v in self.headers.items()},
                        "body": json.loads(raw),
                    }
                )
                reply = server.replies.pop(0) if server.replies else (500, "nothing scripted")
                if reply == HANG:
                    server.release.wait(5)
                    return
                status, payload = reply(server.requests[-1]["body"]) if callable(reply) else reply
                data = payload if isinstance(payload, str) else json.dumps(payload)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data.encode())))
                self.end_headers()
                self.wfile.write(data.encode())

            def log_message(self, *args: object) -> None:
                pass

        return Handler

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()


def completion(content: Any, finish_reason: str = "stop") -> tuple[int, Any]:
    text = content if isinstance(content, str) else json.dumps(content)
    message = {"role": "assistant", "content": text}
    return 200, {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
    }


@pytest.fixture(autouse=True)
def _no_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    # httpx honours proxy variables; requests to the fake server must go straight to it.
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


@pytest.fixture
def server() -> Iterator[FakeServer]:
    fake = FakeServer()
    fake.thread.start()
    yield fake
    fake.close()


@pytest.fixture
def make_policy(server: FakeServer) -> Iterator[Callable[..., OpenAICompatiblePolicy]]:
    made: list[OpenAICompatiblePolicy] = []

    def make(**options: Any) -> OpenAICompatiblePolicy:
        options.setdefault("base_url", server.url)
        policy = OpenAICompatiblePolicy(model="test-model", **options)
        made.append(policy)
        return policy

    yield make
    for policy in made:
        policy.close()


VECTOR = Embedding.of("hashing-test", [0.25, -0.5, 0.75, 1.0])
APA = MemoryRecord.of(
    PersonaMemory(topic="citation style", preference="APA", strategy="cite as (Author, Year)"),
    embedding=VECTOR,
)
DRAFT = MemoryRecord.of(WorkspaceMemory(task="thesis", state={"chapter": 3}), embedding=VECTOR)
CITATION = Requirement("citation style", options=["APA", "MLA"])
REQUEST = PersonaRequest(
    user_id="user-7f3a9c",
    query="format my bibliography",
    node=NodeInfo(id="cite", instruction="Format the references"),
    requirements=[CITATION],
    additional_tools=["zotero"],
)
BUNDLE = MemoryBundle(
    persona=[
        ScoredMemory(
            record=APA,
            score=0.8123456,
            search=SearchRequest(
                layer="persona", query="citation style", label="requirement:citation style"
            ),
        )
    ],
    workspace=[
        ScoredMemory(
            record=DRAFT,
            score=0.3,
            search=SearchRequest(layer="workspace", query="format my bibliography", label="query"),
        )
    ],
)
FINAL = {
    "action": "final",
    "guidance": "Use APA.",
    "constraints": [
        {
            "text": "citation style: APA",
            "requirement": "citation style",
            "memory_id": APA.id,
            "layer": "persona",
            "score": 0.81,
        }
    ],
}
CLARIFY = {
    "action": "clarify",
    "question": "Which citation style should I use: APA or MLA?",
    "requirement": "citation style",
    "options": ["APA", "MLA"],
}


def user_message(body: dict[str, Any]) -> dict[str, Any]:
    return json.loads(body["messages"][1]["content"])


def test_final_decision_round_trip(
    server: FakeServer, make_policy: Callable[..., OpenAICompatiblePolicy]
) -> None:
    server.script(completion(FINAL))
    policy = make_policy(base_url=server.url + "/", temperature=0.2)

    decision = policy.decide(REQUEST, BUNDLE)

    assert isinstance(decision, FinalDecision)
    assert decision.guidance == "Use APA."
    (constraint,) = decision.constraints
    assert (constraint.memory_id, constraint.layer) == (APA.id, "persona")
    assert constraint.score == 0.8123456  # the retrieval's score, not the model's rounding
    assert not decision.memories  # the agent attaches them
    (request,) = server.requests
    assert request["path"] == "/v1/chat/completions"
    assert request["headers"]["content-type"] == "application/json"
    body = request["body"]
    assert (body["model"], body["temperature"]) == ("test-model", 0.2)
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert "exactly one" in body["messages"][0]["content"]
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "persona_decision", "schema": OUTPUT_SCHEMA, "strict": False},
    }
    sent = user_message(body)
    assert sent["request"] == {
        "query": "format my bibliography",
        "node": {"id": "cite", "instruction": "Format the references"},
        "requirements": [CITATION.model_dump(mode="json")],
        "additional_tools": ["zotero"],
    }
    assert sent["evidence"]["trajectory"] == []
    (persona,) = sent["evidence"]["persona"]
    assert persona["memory_id"] == APA.id
    assert persona["layer"] == "persona"
    assert persona["score"] == 0.8123
    assert persona["found_by"]["label"] == "requirement:citation style"
    assert persona["content"] == APA.content.model_dump(mode="json")
    (workspace,) = sent["evidence"]["workspace"]
    assert workspace["content"]["state"] == {"chapter": 3}
    text = body["messages"][1]["content"]
    assert "embedding" not in text
    assert base64.b64encode(VECTOR.vector).decode() not in text
    assert "user-7f3a9c" not in json.dumps(body)


def test_clarify_decision(
    server: FakeServer, make_policy: Callable[..., OpenAICompatiblePolicy]
) -> None:
    server.script(completion(CLARIFY))

    decision = make_policy().decide(REQUEST, MemoryBundle())

    assert isinstance(decision, ClarifyDecision)
    assert decision.question == CLARIFY["question"]
    assert (decision.requirement, decision.options) == ("citation style", ["APA", "MLA"])
    assert user_message(server.bodies()[0])["evidence"] == {
        "trajectory": [],
        "workspace": [],
        "persona": [],
    }


def test_authorization_header_only_with_an_api_key(
    server: FakeServer,
    make_policy: Callable[..., OpenAICompatiblePolicy],
    caplog: pytest.LogCaptureFixture,
) -> None:
    server.script(completion(FINAL), completion("not json"), completion(FINAL))
    caplog.set_level(logging.DEBUG)

    make_policy().decide(REQUEST, BUNDLE)
    keyed = make_policy(api_key="sk-secret-123")
    keyed.decide(REQUEST, BUNDLE)  # retried once, so it logs

    without, *with_key = server.requests
    assert "authorization" not in without["headers"]
    assert [r["headers"]["authorization"] for r in with_key] == ["Bearer sk-secret-123"] * 2
    assert caplog.records  # the retry was logged ...
    assert "sk-secret-123" not in caplog.text  # ... without the key
    assert "sk-secret-123" not in repr(keyed)


def test_invalid_json_is_retried_once_with_the_problem(
    server: FakeServer, make_policy: Callable[..., OpenAICompatiblePolicy]
) -> None:
    server.script(completion("Sure! The decision is final."), completion(FINAL))

    decision = make_policy().decide(REQUEST, BUNDLE)

    assert isinstance(decision, FinalDecision)
    first, second = server.bodies()
    assert second["messages"][:2] == first["messages"]
    bad, feedback = second["messages"][2:]
    assert bad == {"role": "assistant", "content": "Sure! The decision is final."}
    assert feedback["role"] == "user"
    assert "not JSON" in feedback["content"]


def test_a_decision_in_a_markdown_fence_is_accepted(
    server: FakeServer, make_policy: Callable[..., OpenAICompatiblePolicy]
) -> None:
    server.script(completion(f"```json\n{json.dumps(CLARIFY)}\n```"))

    assert isinstance(make_policy().decide(REQUEST, BUNDLE), ClarifyDecision)
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        pytest.param("{not json", "not JSON", id="invalid-json"),
        pytest.param(["final"], "expected a JSON object", id="not-an-object"),
        pytest.param({**CLARIFY, "action": "Clarify"}, "'final', 'clarify'", id="Clarify"),
        pytest.param({**CLARIFY, "question": "  "}, "must not be empty", id="empty-question"),
        pytest.param({**FINAL, "confidence": 0.9}, "Extra inputs", id="extra-field"),
        pytest.param({**FINAL, "memories": {}}, "'memories' must not be", id="memories"),
        pytest.param(
            {**FINAL, "constraints": [{**FINAL["constraints"][0], "memory_id": "01INVENTED"}]},
            "'01INVENTED', which is not among the memories shown",
            id="invented-memory-id",
        ),
        pytest.param(
            {**FINAL, "constraints": [{**FINAL["constraints"][0], "requirement": "tone"}]},
            "requirement 'tone', which the request does not have",
            id="unknown-requirement",
        ),
        pytest.param(
            {**CLARIFY, "requirement": None}, "must name the required requirement", id="unnamed"
        ),
    ],
)
def test_invalid_output_twice_raises_after_exactly_two_requests(
    server: FakeServer,
    make_policy: Callable[..., OpenAICompatiblePolicy],
    answer: Any,
    problem: str,
) -> None:
    server.script(completion(answer), completion(answer))

    with pytest.raises(PolicyError, match="invalid decision after 2 requests") as raised:
        make_policy().decide(REQUEST, BUNDLE)

    assert problem in str(raised.value)
    assert len(server.requests) == 2
    assert problem in server.bodies()[1]["messages"][-1]["content"]


def test_a_clarification_without_requirements_is_invalid(
    server: FakeServer, make_policy: Callable[..., OpenAICompatiblePolicy]
) -> None:
    server.script(completion(CLARIFY), completion({"action": "final", "guidance": "Go ahead."}))
    request = REQUEST.model_copy(update={"requirements": []})

    decision = make_policy().decide(request, BUNDLE)

    assert decision == FinalDecision(guidance="Go ahead.")
    assert "no required requirements" in server.bodies()[1]["messages"][-1]["content"]


def test_max_retries_is_the_budget(
    server: FakeServer, make_policy: Callable[..., OpenAICompatiblePolicy]
) -> None:
    server.script(*[completion("nope")] * 3, completion(FINAL))

    with pytest.raises(PolicyError, match="after 1 request:"):
        make_policy(max_retries=0).decide(REQUEST, BUNDLE)
    assert isinstance(make_policy(max_retries=2).decide(REQUEST, BUNDLE), FinalDecision)
    assert len(server.requests) == 4


def test_a_truncated_answer_is_reported_as_such(
    server: FakeServer, make_policy: Callable[..., OpenAICompatiblePolicy]
) -> None:
    server.script(completion('{"action": "fin', finish_reason="length"))

    with pytest.raises(PolicyError, match="cut off"):
        make_policy(max_retries=0).decide(REQUEST, BUNDLE)


def test_http_500_raises_with_the_status_after_the_retry(
    server: FakeServer, make_policy: Callable[..., OpenAICompatiblePolicy]
) -> None:
    error = {"error": {"message": "CUDA out of memory", "type": "server_error"}}
    server.script((500, error), (500, error))

    with pytest.raises(PolicyError, match=r"HTTP 500: CUDA out of memory \(after 2 requests\)"):
        make_policy().decide(REQUEST, BUNDLE)
    assert len(server.requests) == 2


def test_a_transient_error_then_success(
    server: FakeServer, make_policy: Callable[..., OpenAICompatiblePolicy]
) -> None:
    server.script((503, "overloaded"), completion(FINAL))

    assert isinstance(make_policy().decide(REQUEST, BUNDLE), FinalDecision)
    assert server.bodies()[0] == server.bodies()[1]  # the same question, no feedback


def test_a_client_error_is_not_retried(
    server: FakeServer, make_policy: Callable[..., OpenAICompatiblePolicy]
) -> None:
    server.script((404, {"error": {"message": "model 'test-model' not found"}}))

    with pytest.raises(PolicyError, match="HTTP 404: model 'test-model' not found"):
        make_policy().decide(REQUEST, BUNDLE)
    assert len(server.requests) == 1


def test_a_body_without_choices_raises(
    server: FakeServer, make_policy: Callable[..., OpenAICompatiblePolicy]
) -> None:
    server.script((200, {"object": "list", "data": []}))

    with pytest.raises(PolicyError, match=r"HTTP 200 without a chat completion"):
        make_policy().decide(REQUEST, BUNDLE)
    assert len(server.requests) == 1


def test_connection_refused_raises(make_policy: Callable[..., OpenAICompatiblePolicy]) -> None:
    with socket.socket() as probe:  # a port nothing listens on once this closes
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    policy = make_policy(base_url=f"http://127.0.0.1:{port}/v1")

    with pytest.raises(PolicyError, match=f"cannot reach http://127.0.0.1:{port}/v1") as raised:
        policy.decide(REQUEST, BUNDLE)
    assert isinstance(raised.value.__cause__, httpx.ConnectError)


def test_a_timeout_raises(
    server: FakeServer, make_policy: Callable[..., OpenAICompatiblePolicy]
) -> None:
    server.script(HANG)

    with pytest.raises(PolicyError, match=r"did not answer within 0.2 s \(after 1 request\)"):
        make_policy(timeout=0.2, max_retries=0).decide(REQUEST, BUNDLE)


def test_an_injected_client_is_used_and_left_open(server: FakeServer) -> None:
    server.script(completion(FINAL))
    with httpx.Client(headers={"X-Pool": "shared"}) as client:
        with OpenAICompatiblePolicy(server.url, "test-model", client=client) as policy:
            policy.decide(REQUEST, BUNDLE)
        assert not client.is_closed
    assert server.requests[0]["headers"]["x-pool"] == "shared"


def test_a_policy_closes_the_client_it_made(server: FakeServer) -> None:
    with OpenAICompatiblePolicy(server.url, "test-model") as policy:
        pass
    assert policy._client.is_closed


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"base_url": "127.0.0.1:8000/v1"}, "http"),
        ({"model": " "}, "model"),
        ({"timeout": 0}, "timeout"),
        ({"max_retries": -1}, "max_retries"),
        ({"max_retries": True}, "max_retries"),
    ],
)
def test_invalid_arguments(arguments: dict[str, Any], message: str) -> None:
    options = {"base_url": "http://127.0.0.1:8000/v1", "model": "m"} | arguments
    with pytest.raises(ValueError, match=message):
        OpenAICompatiblePolicy(**options)


def test_the_output_schema_is_a_decision_without_memories() -> None:
    text = json.dumps(OUTPUT_SCHEMA)
    assert "memories" not in text
    assert "Embedding" not in text
    assert sorted(OUTPUT_SCHEMA["$defs"]) == ["ClarifyDecision", "Constraint", "FinalDecision"]
    final = OUTPUT_SCHEMA["$defs"]["FinalDecision"]
    assert final["required"] == ["action", "guidance"]
    assert final["additionalProperties"] is False


def rule_following_model(body: dict[str, Any]) -> tuple[int, Any]:
    """A model that follows the system prompt: cite the requirement's evidence, else ask."""
    sent = user_message(body)
    (requirement,) = sent["request"]["requirements"]
    label = f"requirement:{requirement['name']}"
    evidence = [m for m in sent["evidence"]["persona"] if m["found_by"]["label"] == label]
    if not evidence:
        return completion(
            {
                "action": "clarify",
                "question": f"Which {requirement['name']} should I use?",
                "requirement": requirement["name"],
                "options": requirement["options"],
            }
        )
    best = evidence[0]
    content = best["content"]
    return completion(
        {
            "action": "final",
            "guidance": f"Use {content['preference']}.",
            "constraints": [
                {
                    "text": f"{content['topic']}: {content['preference']}",
                    "requirement": requirement["name"],
                    "memory_id": best["memory_id"],
                    "layer": best["layer"],
                    "score": best["score"],
                }
            ],
        }
    )


def test_a_persona_agent_asks_learns_and_then_proceeds(
    server: FakeServer, make_policy: Callable[..., OpenAICompatiblePolicy], tmp_path: Path
) -> None:
    store = JsonlMemoryStore(tmp_path / "store")
    retriever = MemoryRetriever(store)
    updater = MemoryUpdater(store, retriever=retriever)
    updater.update("user-7f3a9c", "persona", PersonaMemory(topic="tone", preference="formal"))
    agent = PersonaAgent(retriever, make_policy(), updater=updater)
    server.script(rule_following_model, rule_following_model)

    question = agent.decide(REQUEST)
    assert isinstance(question, ClarifyDecision)
    assert question.requirement == "citation style"
    learned = agent.learn("user-7f3a9c", question, "MLA")
    assert learned.record is not None
    final = agent.decide(REQUEST)

    assert isinstance(final, FinalDecision)
    assert final.guidance == "Use MLA."
    (constraint,) = final.constraints
    assert constraint.memory_id == learned.record.id
    shown = {memory.record.id: memory for memory in final.memories}
    assert learned.record.id in shown  # the agent attached what was retrieved
    assert constraint.score == shown[learned.record.id].score
    for body in server.bodies():
        assert "embedding" not in body["messages"][1]["content"]
        assert "user-7f3a9c" not in json.dumps(body)
