"""OpenAICompatibleExtractor against an HTTP server on 127.0.0.1, through real ingestion."""

from __future__ import annotations

import ast
import json
import logging
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import autopersona_flows
from autopersona_flows.errors import ExtractionError, IngestionError
from autopersona_flows.memory import (
    JsonlMemoryStore,
    MemoryUpdater,
    OpenAICompatibleExtractor,
    PersonaMemory,
    RawTaskRecord,
    ingest_task_history,
)
from autopersona_flows.memory.records import LAYERS
from autopersona_flows.testing.chat_server import FakeChatServer, completion

WEDNESDAY = datetime(2025, 1, 8, 15, 0, tzinfo=UTC)
USER = "ada"
RECORD = RawTaskRecord(
    user_id=USER,
    query="Find me a hotel in Lisbon for the conference",
    trace=[
        {"role": "user", "text": "I'm vegetarian until March, so no steakhouse dinners."},
        {"role": "assistant", "text": "I love sushi places near the venue."},
        {"role": "user", "content": "And I prefer   aisle seats on the flight."},
    ],
    persona=[PersonaMemory(topic="hotel budget", preference="150 a night")],
    at=WEDNESDAY,
)
DIET = {
    "topic": "diet",
    "preference": "vegetarian",
    "until": None,
    "quote": "I'm vegetarian until March",
}
SEAT = {
    "topic": "seat",
    "preference": "aisle seats",
    "until": "2025-06-01T00:00:00+02:00",
    "quote": '"i PREFER aisle seats\non the flight"',  # case, spacing and quotation marks
}
ANSWER = {"memories": [DIET, SEAT]}


@pytest.fixture(autouse=True)
def _no_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    # httpx honours proxy variables; requests to the fake server must go straight to it.
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


@pytest.fixture
def server() -> Iterator[FakeChatServer]:
    with FakeChatServer() as fake:
        yield fake


@pytest.fixture
def make_extractor(server: FakeChatServer) -> Iterator[Callable[..., OpenAICompatibleExtractor]]:
    made: list[OpenAICompatibleExtractor] = []

    def make(**options: Any) -> OpenAICompatibleExtractor:
        options.setdefault("base_url", server.url)
        extractor = OpenAICompatibleExtractor(model="test-model", **options)
        made.append(extractor)
        return extractor

    yield make
    for extractor in made:
        extractor.close()


def ingest(store: JsonlMemoryStore, extractor: OpenAICompatibleExtractor) -> Any:
    return ingest_task_history(store, MemoryUpdater(store), RECORD, extractor=extractor)


def task_message(body: dict[str, Any]) -> dict[str, Any]:
    return json.loads(body["messages"][1]["content"])


def test_memories_round_trip_into_the_store_with_their_validity(
    server: FakeChatServer,
    make_extractor: Callable[..., OpenAICompatibleExtractor],
    tmp_path: Path,
) -> None:
    listed_again = {"topic": "budget", "preference": "150 a  night", "quote": "hotel in Lisbon"}
    server.script(completion({"memories": [DIET, SEAT, listed_again]}))
    store = JsonlMemoryStore(tmp_path / "store")

    result = ingest(store, make_extractor(base_url=server.url + "/", temperature=0.3))

    assert result.counts() == {"trajectory:add": 1, "persona:add": 3}
    stored = {r.content.topic: r for r in store.list(USER, "persona")}
    assert sorted(stored) == ["diet", "hotel budget", "seat"]
    # Left out by the model: read from the quote ("until March").
    assert stored["diet"].valid_until == datetime(2025, 3, 1, tzinfo=UTC)
    assert stored["diet"].content.preference == "vegetarian"
    assert stored["seat"].valid_until == datetime(2025, 5, 31, 22, 0, tzinfo=UTC)
    assert stored["hotel budget"].valid_until is None  # listed, kept as given
    assert all(r.stated_at == WEDNESDAY for r in stored.values())
    (request,) = server.requests
    assert request["path"] == "/v1/chat/completions"
    body = request["body"]
    assert (body["model"], body["temperature"]) == ("test-model", 0.3)
    assert body["response_format"]["type"] == "json_schema"
    assert body["response_format"]["json_schema"]["name"] == "memories"
    schema = body["response_format"]["json_schema"]["schema"]
    assert schema["required"] == ["memories"]
    memory = schema["$defs"]["_ModelMemory"]
    assert memory["required"] == ["topic", "preference", "quote"]
    assert memory["additionalProperties"] is False
    assert task_message(body) == {
        "said_at": WEDNESDAY.isoformat(),
        "messages": [
            "Find me a hotel in Lisbon for the conference",
            "I'm vegetarian until March, so no steakhouse dinners.",
            "And I prefer   aisle seats on the flight.",
        ],
        "listed": [{"topic": "hotel budget", "preference": "150 a night"}],
    }
    assert USER not in json.dumps(body)  # the user id is never sent ...
    assert "sushi" not in json.dumps(body)  # ... nor what the assistant said


def test_an_invented_quote_is_refused_then_retried_and_accepted(
    server: FakeChatServer,
    make_extractor: Callable[..., OpenAICompatibleExtractor],
    tmp_path: Path,
) -> None:
    # The assistant said it, not the person: a preference the person never stated.
    invented = {"topic": "food", "preference": "sushi", "quote": "I love sushi"}
    server.script(completion({"memories": [DIET, invented]}), completion({"memories": [DIET]}))
    store = JsonlMemoryStore(tmp_path / "store")

    ingest(store, make_extractor())

    first, second = server.bodies()
    assert second["messages"][:2] == first["messages"]
    bad, feedback = second["messages"][2:]
    assert bad == {"role": "assistant", "content": json.dumps({"memories": [DIET, invented]})}
    assert feedback["role"] == "user"
    assert (
        "memories[1].quote 'I love sushi' is not in what the person wrote" in (feedback["content"])
    )
    assert sorted(r.content.topic for r in store.list(USER, "persona")) == ["diet", "hotel budget"]


@pytest.mark.parametrize(
    ("memory", "problem"),
    [
        pytest.param({**DIET, "topic": "  "}, "memories[0].topic is blank", id="blank-topic"),
        pytest.param({**DIET, "preference": ""}, "preference is blank", id="blank-preference"),
        pytest.param({**DIET, "quote": " "}, "is not in what the person wrote", id="blank-quote"),
        pytest.param({**DIET, "quote": "a"}, "is not in what the person wrote", id="one-letter"),
        pytest.param(
            {**DIET, "preference": "loves jazz"}, "says nothing of its quote", id="unquoted"
        ),
        pytest.param({**DIET, "until": "March"}, "is not an ISO 8601 date-time", id="not-a-time"),
        pytest.param(
            {**DIET, "until": "2025-01-08T14:00:00Z"},
            "is not after the task's time (2025-01-08T15:00:00+00:00)",
            id="ends-before-said",
        ),
        pytest.param({**DIET, "confidence": 0.9}, "Extra inputs", id="extra-field"),
        pytest.param({"topic": "diet", "preference": "vegetarian"}, "quote", id="no-quote"),
    ],
)
def test_each_invalid_memory_is_named_in_the_feedback(
    server: FakeChatServer,
    make_extractor: Callable[..., OpenAICompatibleExtractor],
    memory: dict[str, Any],
    problem: str,
) -> None:
    server.script(completion({"memories": [memory]}), completion({"memories": []}))

    found = make_extractor().extract(RECORD)

    assert [item.content.topic for item in found] == ["hotel budget"]
    assert problem in server.bodies()[1]["messages"][-1]["content"]


def test_invalid_json_after_the_retries_raises_and_writes_nothing(
    server: FakeChatServer,
    make_extractor: Callable[..., OpenAICompatibleExtractor],
    tmp_path: Path,
) -> None:
    server.script(*[completion("Sure! You like aisle seats.")] * 3)
    store = JsonlMemoryStore(tmp_path / "store")

    with pytest.raises(ExtractionError, match="invalid memories after 3 requests") as raised:
        ingest(store, make_extractor(max_retries=2))

    assert isinstance(raised.value, IngestionError)
    assert "not a valid memories object" in str(raised.value)
    assert len(server.requests) == 3
    assert all(store.list(USER, layer) == [] for layer in LAYERS)


def test_a_server_error_after_the_retries_raises_and_writes_nothing(
    server: FakeChatServer,
    make_extractor: Callable[..., OpenAICompatibleExtractor],
    tmp_path: Path,
) -> None:
    error = {"error": {"message": "CUDA out of memory"}}
    server.script((503, error), (503, error))
    store = JsonlMemoryStore(tmp_path / "store")

    with pytest.raises(ExtractionError, match=r"HTTP 503: CUDA out of memory \(after 2 requests\)"):
        ingest(store, make_extractor())
    assert all(store.list(USER, layer) == [] for layer in LAYERS)


def test_a_server_refusing_json_schema_is_asked_with_json_object_from_then_on(
    server: FakeChatServer, make_extractor: Callable[..., OpenAICompatibleExtractor]
) -> None:
    # llama.cpp's server answers HTTP 500 to response_format json_schema.
    server.script((500, {"error": {"message": "Unrecognized schema"}}), *[completion(ANSWER)] * 2)
    extractor = make_extractor()

    assert len(extractor.extract(RECORD)) == 3
    assert len(extractor.extract(RECORD)) == 3

    formats = [body["response_format"] for body in server.bodies()]
    assert formats[0]["type"] == "json_schema"
    schema = formats[0]["json_schema"]["schema"]
    assert formats[1:] == [{"type": "json_object", "schema": schema}] * 2
    assert extractor.response_format == "json_object"


def test_the_api_key_is_sent_but_never_shown(
    server: FakeChatServer,
    make_extractor: Callable[..., OpenAICompatibleExtractor],
    caplog: pytest.LogCaptureFixture,
) -> None:
    server.script(completion("not json"), completion(ANSWER), (500, "down"), (500, "down"))
    caplog.set_level(logging.DEBUG)
    extractor = make_extractor(api_key="sk-secret-123")

    extractor.extract(RECORD)  # retried once, so it logs
    with pytest.raises(ExtractionError) as raised:
        extractor.extract(RECORD)

    assert [r["headers"]["authorization"] for r in server.requests] == ["Bearer sk-secret-123"] * 4
    ours = [r for r in caplog.records if r.name.startswith("autopersona_flows")]
    assert [r.name for r in ours] == ["autopersona_flows.memory.llm_extraction"] * 2  # retries ...
    assert "sk-secret-123" not in caplog.text  # ... without the key
    assert "sk-secret-123" not in repr(extractor) + str(raised.value)
    assert repr(extractor) == f"OpenAICompatibleExtractor({server.url!r}, 'test-model')"


def test_no_authorization_header_without_an_api_key(
    server: FakeChatServer, make_extractor: Callable[..., OpenAICompatibleExtractor]
) -> None:
    server.script(completion({"memories": []}))

    make_extractor().extract(RECORD)

    assert "authorization" not in server.requests[0]["headers"]


def test_a_memory_naming_a_secret_is_dropped_without_asking_again(
    server: FakeChatServer, make_extractor: Callable[..., OpenAICompatibleExtractor]
) -> None:
    record = RECORD.model_copy(update={"query": "My PIN is 4321 and I prefer aisle seats"})
    pin = {"topic": "PIN", "preference": "4321", "quote": "My PIN is 4321"}
    server.script(completion({"memories": [pin, SEAT]}))

    found = make_extractor().extract(record)

    assert [item.content.topic for item in found] == ["hotel budget", "seat"]
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"base_url": "127.0.0.1:8000/v1"}, "http"),
        ({"model": " "}, "model"),
        ({"timeout": 0}, "timeout"),
        ({"max_retries": -1}, "max_retries"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"response_format": "yaml"}, "response_format"),
    ],
)
def test_invalid_arguments(arguments: dict[str, Any], message: str) -> None:
    options = {"base_url": "http://127.0.0.1:8000/v1", "model": "m"} | arguments
    with pytest.raises(ValueError, match=message):
        OpenAICompatibleExtractor(**options)


def test_the_memory_package_loads_the_extractor_only_when_asked() -> None:
    code = (
        "import sys, autopersona_flows.memory as m; "
        "print('autopersona_flows.memory.llm_extraction' in sys.modules); "
        "m.OpenAICompatibleExtractor; "
        "print('autopersona_flows.memory.llm_extraction' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.split() == ["False", "True"]


@pytest.mark.parametrize("module", ["_chat.py", "memory/llm_extraction.py"])
def test_the_extractor_imports_neither_the_agent_layer_nor_prefect(module: str) -> None:
    source = Path(autopersona_flows.__file__).parent / module
    imported = [
        node.module or ""
        for node in ast.walk(ast.parse(source.read_text()))
        if isinstance(node, ast.ImportFrom)
    ] + [
        alias.name
        for node in ast.walk(ast.parse(source.read_text()))
        if isinstance(node, ast.Import)
        for alias in node.names
    ]
    assert not [
        name for name in imported if name.startswith(("autopersona_flows.agent", "prefect"))
    ]
