"""OpenAICompatibleJudge and Policy against an HTTP server on 127.0.0.1 replying from a script."""

import base64
import json
import logging
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from autopersona_flows import JsonlMemoryStore, PersonaMemory, PolicyError
from autopersona_flows.agent import (
    ClarifyDecision,
    FinalDecision,
    NodeInfo,
    PersonaAgent,
    PersonaRequest,
    Requirement,
)
from autopersona_flows.agent.openai import (
    OUTPUT_SCHEMA,
    OpenAICompatibleJudge,
    OpenAICompatiblePolicy,
    schema_for,
)
from autopersona_flows.memory import MemoryUpdater
from autopersona_flows.memory.records import Embedding, MemoryRecord, WorkspaceMemory
from autopersona_flows.memory.retrieval import (
    MemoryBundle,
    MemoryRetriever,
    ScoredMemory,
    SearchRequest,
)
from autopersona_flows.testing.chat_server import HANG, completion
from autopersona_flows.testing.chat_server import FakeChatServer as FakeServer


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
ANSWERED = {
    "verdicts": [
        {
            "requirement": "citation style",
            "memory_ids": [APA.id],
            "value": "APA",
            "reason": "the stored citation style",
        }
    ]
}
UNANSWERED = {"verdicts": [{"requirement": "citation style", "memory_ids": [], "value": None}]}


def user_message(body: dict[str, Any]) -> dict[str, Any]:
    return json.loads(body["messages"][1]["content"])


def test_a_verdict_round_trip_becomes_a_final_decision(
    server: FakeServer, make_policy: Callable[..., OpenAICompatiblePolicy]
) -> None:
    server.script(completion(ANSWERED))
    policy = make_policy(base_url=server.url + "/", temperature=0.2)

    decision = policy.decide(REQUEST, BUNDLE)

    assert isinstance(decision, FinalDecision)
    (constraint,) = [c for c in decision.constraints if c.requirement]
    assert (constraint.memory_id, constraint.layer, constraint.value) == (APA.id, "persona", "APA")
    assert constraint.reason == "the stored citation style"
    assert "citation style: APA" in decision.guidance
    (request,) = server.requests
    assert request["path"] == "/v1/chat/completions"
    body = request["body"]
    assert (body["model"], body["temperature"]) == ("test-model", 0.2)
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    schema = body["response_format"]["json_schema"]["schema"]
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "verdicts", "schema": schema, "strict": False},
    }
    # Narrowed to this request: constrained decoding cannot name anything else.
    verdict = schema["$defs"]["_ModelVerdict"]["properties"]
    assert verdict["requirement"]["enum"] == ["citation style"]
    assert verdict["memory_ids"]["items"]["enum"] == [DRAFT.id, APA.id]
    assert schema["properties"]["verdicts"]["minItems"] == 1
    sent = user_message(body)
    assert sent["query"] == "format my bibliography"
    assert sent["node"] == {"id": "cite", "instruction": "Format the references"}
    (requirement,) = sent["requirements"]
    assert requirement["name"] == "citation style"
    assert requirement["options"] == ["APA", "MLA"]
    # The requirement's candidates: its own search's finds and the request's.
    assert [c["memory_id"] for c in requirement["candidates"]] == [DRAFT.id, APA.id]
    persona = next(c for c in requirement["candidates"] if c["memory_id"] == APA.id)
    assert persona["content"] == APA.content.model_dump(mode="json")
    assert persona["said_at"] == APA.updated_at.isoformat()
    text = body["messages"][1]["content"]
    assert "embedding" not in text
    assert base64.b64encode(VECTOR.vector).decode() not in text
    assert "user-7f3a9c" not in json.dumps(body)


def test_no_memory_answers_so_the_policy_asks(
    server: FakeServer, make_policy: Callable[..., OpenAICompatiblePolicy]
) -> None:
    server.script(completion(UNANSWERED))

    decision = make_policy().decide(REQUEST, BUNDLE)

    assert isinstance(decision, ClarifyDecision)
    assert (decision.requirement, decision.options) == ("citation style", ["APA", "MLA"])
    assert "citation style" in decision.question


def test_nothing_recalled_asks_without_calling_the_model(
    server: FakeServer, make_policy: Callable[..., OpenAICompatiblePolicy]
) -> None:
    assert make_policy().decide(REQUEST, MemoryBundle()).action == "clarify"
    no_requirements = REQUEST.model_copy(update={"requirements": []})
    assert make_policy().decide(no_requirements, BUNDLE).action == "final"
    assert server.requests == []


def test_a_ceased_preference_is_asked_about(
    server: FakeServer, make_policy: Callable[..., OpenAICompatiblePolicy]
) -> None:
    server.script(
        completion(
            {
                "verdicts": [
                    {"requirement": "citation style", "memory_ids": [APA.id], "ceases": True}
                ]
            }
        )
    )
    assert make_policy().decide(REQUEST, BUNDLE).action == "clarify"


def test_a_server_refusing_json_schema_is_asked_with_json_object_from_then_on(
    server: FakeServer, make_policy: Callable[..., OpenAICompatiblePolicy]
) -> None:
    # llama.cpp's server answers HTTP 500 to response_format json_schema.
    server.script((500, {"error": {"message": "Unrecognized schema"}}), *[completion(ANSWERED)] * 2)
    policy = make_policy()

    assert policy.decide(REQUEST, BUNDLE).action == "final"
    assert policy.decide(REQUEST, BUNDLE).action == "final"

    formats = [body["response_format"] for body in server.bodies()]
    assert formats[0]["type"] == "json_schema"
    schema = formats[0]["json_schema"]["schema"]
    assert formats[1:] == [{"type": "json_object", "schema": schema}] * 2
    assert policy.judge.response_format == "json_object"


def test_a_transient_500_is_retried_with_json_schema_kept(
    server: FakeServer, make_policy: Callable[..., OpenAICompatiblePolicy]
) -> None:
    server.script((500, {"error": {"message": "model is loading"}}), completion(ANSWERED))
    policy = make_policy()

    assert policy.decide(REQUEST, BUNDLE).action == "final"

    formats = [body["response_format"]["type"] for body in server.bodies()]
    assert formats == ["json_schema", "json_schema"]
    assert policy.judge.response_format == "json_schema"


def test_authorization_header_only_with_an_api_key(
    server: FakeServer,
    make_policy: Callable[..., OpenAICompatiblePolicy],
    caplog: pytest.LogCaptureFixture,
) -> None:
    server.script(completion(ANSWERED), completion("not json"), completion(ANSWERED))
    caplog.set_level(logging.DEBUG)

    make_policy().decide(REQUEST, BUNDLE)
    keyed = make_policy(api_key="sk-secret-123")
    keyed.decide(REQUEST, BUNDLE)  # retried once, so it logs

    without, *with_key = server.requests
    assert "authorization" not in without["headers"]
    assert [r["headers"]["authorization"] for r in with_key] == ["Bearer sk-secret-123"] * 2
    assert caplog.records  # the retry was logged ...
    assert "sk-secret-123" not in caplog.text  # ... without the key
    assert "sk-secret-123" not in repr(keyed) + repr(keyed.judge)


def test_invalid_output_is_retried_once_with_the_problem(
    server: FakeServer, make_policy: Callable[..., OpenAICompatiblePolicy]
) -> None:
    server.script(completion("Sure! APA it is."), completion(ANSWERED))

    assert make_policy().decide(REQUEST, BUNDLE).action == "final"

    first, second = server.bodies()
    assert second["messages"][:2] == first["messages"]
    bad, feedback = second["messages"][2:]
    assert bad == {"role": "assistant", "content": "Sure! APA it is."}
    assert feedback["role"] == "user"
    assert "not a valid verdicts object" in feedback["content"]


def test_verdicts_in_a_markdown_fence_are_accepted(
    server: FakeServer, make_policy: Callable[..., OpenAICompatiblePolicy]
) -> None:
    server.script(completion(f"```json\n{json.dumps(ANSWERED)}\n```"))

    assert make_policy().decide(REQUEST, BUNDLE).action == "final"
    assert len(server.requests) == 1


VERDICT = ANSWERED["verdicts"][0]


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        pytest.param("{not json", "not a valid verdicts object", id="invalid-json"),
        pytest.param(["final"], "not a valid verdicts object", id="not-an-object"),
        pytest.param({"verdicts": []}, "no verdict for ['citation style']", id="missing"),
        pytest.param(
            {"verdicts": [{**VERDICT, "confidence": 0.9}]}, "Extra inputs", id="extra-field"
        ),
        pytest.param(
            {"verdicts": [{**VERDICT, "memory_ids": ["01INVENTED"]}]},
            "['01INVENTED'], which are not among the memories shown",
            id="invented-memory-id",
        ),
        pytest.param(
            {"verdicts": [VERDICT, {**VERDICT, "requirement": "tone"}]},
            "'tone', which was not asked about",
            id="unknown-requirement",
        ),
        pytest.param({"verdicts": [VERDICT, VERDICT]}, "two verdicts", id="twice"),
    ],
)
def test_invalid_output_twice_raises_after_exactly_two_requests(
    server: FakeServer,
    make_policy: Callable[..., OpenAICompatiblePolicy],
    answer: Any,
    problem: str,
) -> None:
    server.script(completion(answer), completion(answer))

    with pytest.raises(PolicyError, match="invalid verdicts after 2 requests") as raised:
        make_policy().decide(REQUEST, BUNDLE)

    assert problem in str(raised.value)
    assert len(server.requests) == 2
    assert problem in server.bodies()[1]["messages"][-1]["content"]


def test_max_retries_is_the_budget(
    server: FakeServer, make_policy: Callable[..., OpenAICompatiblePolicy]
) -> None:
    server.script(*[completion("nope")] * 3, completion(ANSWERED))

    with pytest.raises(PolicyError, match="after 1 request:"):
        make_policy(max_retries=0).decide(REQUEST, BUNDLE)
    assert make_policy(max_retries=2).decide(REQUEST, BUNDLE).action == "final"
    assert len(server.requests) == 4


def test_a_truncated_answer_is_reported_as_such(
    server: FakeServer, make_policy: Callable[..., OpenAICompatiblePolicy]
) -> None:
    server.script(completion('{"verdicts": [', finish_reason="length"))

    with pytest.raises(PolicyError, match="cut off"):
        make_policy(max_retries=0).decide(REQUEST, BUNDLE)


def test_http_503_raises_with_the_status_after_the_retry(
    server: FakeServer, make_policy: Callable[..., OpenAICompatiblePolicy]
) -> None:
    error = {"error": {"message": "CUDA out of memory", "type": "server_error"}}
    server.script((503, error), (503, error))

    with pytest.raises(PolicyError, match=r"HTTP 503: CUDA out of memory \(after 2 requests\)"):
        make_policy().decide(REQUEST, BUNDLE)
    assert len(server.requests) == 2


def test_a_transient_error_then_success(
    server: FakeServer, make_policy: Callable[..., OpenAICompatiblePolicy]
) -> None:
    server.script((503, "overloaded"), completion(ANSWERED))

    assert make_policy().decide(REQUEST, BUNDLE).action == "final"
    assert server.bodies()[0] == server.bodies()[1]  # the same question, no feedback


def test_a_client_error_is_not_retried(
    server: FakeServer, make_policy: Callable[..., OpenAICompatiblePolicy]
) -> None:
    server.script((404, {"error": {"message": "model 'test-model' not found"}}))

    with pytest.raises(PolicyError, match="HTTP 404: model 'test-model' not found"):
        make_policy().decide(REQUEST, BUNDLE)
    assert len(server.requests) == 1


def test_a_400_naming_no_schema_is_an_error_not_a_fallback(
    server: FakeServer, make_policy: Callable[..., OpenAICompatiblePolicy]
) -> None:
    server.script((400, {"error": {"message": "max_tokens is too large"}}))
    policy = make_policy()

    with pytest.raises(PolicyError, match="HTTP 400: max_tokens is too large"):
        policy.decide(REQUEST, BUNDLE)
    assert len(server.requests) == 1
    assert policy.judge.response_format == "json_schema"


def test_a_422_refusing_response_format_falls_back(
    server: FakeServer, make_policy: Callable[..., OpenAICompatiblePolicy]
) -> None:
    server.script(
        (422, {"error": {"message": "response_format type json_schema unsupported"}}),
        completion(ANSWERED),
    )
    policy = make_policy()

    assert policy.decide(REQUEST, BUNDLE).action == "final"
    assert [body["response_format"]["type"] for body in server.bodies()] == [
        "json_schema",
        "json_object",
    ]


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
    server.script(completion(ANSWERED))
    with httpx.Client(headers={"X-Pool": "shared"}) as client:
        with OpenAICompatiblePolicy(server.url, "test-model", client=client) as policy:
            policy.decide(REQUEST, BUNDLE)
        assert not client.is_closed
    assert server.requests[0]["headers"]["x-pool"] == "shared"


def test_a_policy_closes_the_client_it_made(server: FakeServer) -> None:
    with OpenAICompatiblePolicy(server.url, "test-model") as policy:
        pass
    assert policy.judge._chat.client.is_closed


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"base_url": "127.0.0.1:8000/v1"}, "http"),
        ({"model": " "}, "model"),
        ({"timeout": 0}, "timeout"),
        ({"max_retries": -1}, "max_retries"),
        ({"max_retries": True}, "max_retries"),
        ({"response_format": "yaml"}, "response_format"),
    ],
)
def test_invalid_arguments(arguments: dict[str, Any], message: str) -> None:
    options = {"base_url": "http://127.0.0.1:8000/v1", "model": "m"} | arguments
    with pytest.raises(ValueError, match=message):
        OpenAICompatibleJudge(**options)


def test_the_output_schema_is_verdicts_per_requirement() -> None:
    narrowed = schema_for({"citation style": BUNDLE.persona})
    assert OUTPUT_SCHEMA["properties"]["verdicts"].get("minItems") is None  # not changed
    assert narrowed["properties"]["verdicts"]["maxItems"] == 1
    text = json.dumps(OUTPUT_SCHEMA)
    assert "Embedding" not in text
    assert OUTPUT_SCHEMA["required"] == ["verdicts"]
    verdict = OUTPUT_SCHEMA["$defs"]["_ModelVerdict"]
    assert verdict["required"] == ["requirement"]
    assert verdict["additionalProperties"] is False


def rule_following_model(body: dict[str, Any]) -> tuple[int, Any]:
    """A model that follows the prompt: a persona memory whose topic is the requirement answers."""
    verdicts = []
    for requirement in user_message(body)["requirements"]:
        answering = [
            c
            for c in requirement["candidates"]
            if c["layer"] == "persona" and c["content"]["topic"] == requirement["name"]
        ]
        verdicts.append(
            {
                "requirement": requirement["name"],
                "memory_ids": [c["memory_id"] for c in answering],
                "value": answering[0]["content"]["preference"] if answering else None,
            }
        )
    return completion({"verdicts": verdicts})


def test_a_persona_agent_asks_learns_and_then_proceeds(
    server: FakeServer, make_policy: Callable[..., OpenAICompatiblePolicy], tmp_path: Path
) -> None:
    store = JsonlMemoryStore(tmp_path / "store")
    retriever = MemoryRetriever(store)
    updater = MemoryUpdater(store, retriever=retriever)
    updater.update(
        "user-7f3a9c", "persona", PersonaMemory(topic="citation manager", preference="Zotero")
    )
    agent = PersonaAgent(retriever, make_policy(), updater=updater)
    server.script(rule_following_model, rule_following_model)

    question = agent.decide(REQUEST)
    assert isinstance(question, ClarifyDecision)
    assert question.requirement == "citation style"
    learned = agent.learn("user-7f3a9c", question, "MLA")
    assert learned.record is not None
    final = agent.decide(REQUEST)

    assert isinstance(final, FinalDecision)
    (constraint,) = [c for c in final.constraints if c.requirement]
    assert (constraint.memory_id, constraint.value) == (learned.record.id, "MLA")
    for body in server.bodies():
        assert "embedding" not in body["messages"][1]["content"]
        assert "user-7f3a9c" not in json.dumps(body)
