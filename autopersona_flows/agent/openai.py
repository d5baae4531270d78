"""An LLM judge through any server that speaks OpenAI's chat-completions API.

`OpenAICompatibleJudge` shows a model each requirement of a request with the
memories recalled for it and asks, per requirement, which memory (if any) states
the person's current value, and what it is: structured verdicts, never a whole
decision. `OpenAICompatiblePolicy` is `EvidencePolicy` with that judge: the model
judges, the policy decides (what is asked, which answer is current, what guidance
the node gets) exactly as it does for the default judge.

The model's answer is checked against what it was shown: a verdict for a
requirement it was not asked about, or citing a memory that was not a candidate,
is invalid output; the model is told what was wrong and asked again. Servers
that refuse OpenAI's ``response_format: json_schema`` (llama.cpp's answers HTTP
500) are asked with ``{"type": "json_object", "schema": ...}`` instead, from then on.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Self

import httpx
from pydantic import BaseModel, ConfigDict, Field

from autopersona_flows import _json
from autopersona_flows._chat import (
    ChatAdapter,
    InvalidOutputError,
    ResponseFormat,
    validated_json,
)
from autopersona_flows.agent.decisions import PersonaDecision, PersonaRequest
from autopersona_flows.agent.evidence import EvidencePolicy
from autopersona_flows.agent.judges import Verdict
from autopersona_flows.errors import PolicyError
from autopersona_flows.memory.retrieval import MemoryBundle, ScoredMemory

__all__ = ["OUTPUT_SCHEMA", "OpenAICompatibleJudge", "OpenAICompatiblePolicy", "schema_for"]

logger = logging.getLogger(__name__)

_SYSTEM_PROMPT = """\
You judge, for one step of a person's task, which of their stored memories answer \
what the step needs to know.

You are shown the request (the person's query and the step) and, for each requirement \
of the step, the memories recalled for it: id, layer, when it was last said, and content. \
Persona memories are preferences (topic, preference, strategy); trajectory memories are \
past tasks (query, trace of actions, outcome, insight); workspace memories are state.

For every requirement give one verdict:
- "memory_ids": the memories that state the person's CURRENT value for exactly this \
requirement, most recent first; [] if none does.
- "value": that value in the memory's own words (or one of the requirement's options), \
or null.
- "ceases": true if the most recent relevant memory says the preference no longer holds \
and gives no new value ("I don't drive any more"); then "memory_ids" lists that memory.
- "reason": a few words.

Rules:
1. A memory answers only if it is about the same attribute of the same thing. A \
neighbouring topic is not an answer: a hotel booking method is not a hotel budget, a \
lesson length is not a quiz length, a dog training class is not a train's travel class.
2. Vague topics ("misc", "travel") and whole sentences count when the sentence states \
the value. A choice repeated in two or more past tasks counts; a single past choice does not.
3. When memories disagree, the most recently said one is current.
4. Use only the memories shown, with their ids exactly as given. Never invent a value.

Reply with one JSON object and nothing else:
{"verdicts": [{"requirement": "...", "memory_ids": ["..."], "value": "...", \
"ceases": false, "reason": "..."}]}"""


class _ModelVerdict(BaseModel):
    """One requirement's verdict as the model writes it."""

    model_config = ConfigDict(extra="forbid")

    requirement: str
    memory_ids: list[str] = Field(default_factory=list)
    value: str | None = None
    ceases: bool = False
    reason: str = ""


class _ModelAnswer(BaseModel):
    """The model's whole answer: a verdict per requirement."""

    model_config = ConfigDict(extra="forbid")

    verdicts: list[_ModelVerdict]


OUTPUT_SCHEMA: dict[str, Any] = _ModelAnswer.model_json_schema()
"""The JSON schema of the model's answer: verdicts per requirement. Each request
narrows it to the requirements asked and the memories shown (`schema_for`), so that a
server with constrained decoding cannot produce another name or an invented id."""


def schema_for(asked: Mapping[str, Sequence[ScoredMemory]]) -> dict[str, Any]:
    """`OUTPUT_SCHEMA` with the requirement names and memory ids of one request as enums."""
    schema = copy.deepcopy(OUTPUT_SCHEMA)
    verdict = schema["$defs"]["_ModelVerdict"]["properties"]
    verdict["requirement"]["enum"] = list(asked)
    ids = list(dict.fromkeys(m.record.id for memories in asked.values() for m in memories))
    verdict["memory_ids"]["items"]["enum"] = ids
    schema["properties"]["verdicts"] |= {"minItems": len(asked), "maxItems": len(asked)}
    return schema


class OpenAICompatibleJudge(ChatAdapter):
    """Let a language model judge which memories answer each requirement.

    Works with OpenAI, vLLM, Ollama (``http://127.0.0.1:11434/v1``), llama.cpp's
    server and any other server speaking ``POST {base_url}/chat/completions``. The
    model is sent the request and each requirement's candidates (ids, layers, when
    last said and content; never the user id nor any embedding), one request per
    decision, and only for requirements that have candidates: with none, nothing
    can answer and no model is asked.

    Invalid output is sent back with what was wrong, and the model asked again, up
    to ``max_retries`` times. Timeouts, refused connections, HTTP 408, 429 and 5xx
    are retried within the same budget; other HTTP errors are not. A server that
    refuses ``response_format: json_schema`` (HTTP 400, 422 or 500 naming the
    response format or the schema) is asked with ``json_object`` and the schema
    instead, at once and for every later request.

    Args:
        base_url: The API root, e.g. ``"http://127.0.0.1:8000/v1"``.
        model: The model name the server knows.
        api_key: Sent as ``Authorization: Bearer ...`` when given; never logged.
        timeout: Seconds to wait for each response (also for an injected client).
        temperature: Sampling temperature; 0 for the most repeatable verdicts.
        max_retries: How many more requests after a failed one.
        response_format: ``"json_schema"`` (OpenAI's structured outputs, the
            default) or ``"json_object"`` with the schema (llama.cpp, Ollama).
        max_tokens: The most tokens an answer may take; the server's default if
            ``None``. An answer cut off there is invalid output.
        client: An `httpx.Client` to send requests with (pooling, tests); it stays
            open on `close`. One is made, and closed, otherwise.

    Raises:
        ValueError: If ``base_url`` is not an http(s) URL, ``model`` is empty, or
            ``timeout``, ``max_retries`` or ``response_format`` is out of range.
    """

    _error = PolicyError
    _answers = "verdicts"
    _logger = logger

    def judge(
        self, request: PersonaRequest, candidates: Mapping[str, Sequence[ScoredMemory]]
    ) -> dict[str, list[Verdict]]:
        """Ask the model for a verdict per requirement that has candidates.

        Raises:
            PolicyError: If the model's last answer is invalid (the message says
                why), or the server cannot be reached or answers with an error
                (the message gives the HTTP status or the failure).
        """
        asked = {name: list(memories) for name, memories in candidates.items() if memories}
        verdicts: dict[str, list[Verdict]] = {name: [] for name in candidates}
        if not asked:
            return verdicts
        messages = [
            {"role": "system", "content": _SYSTEM_PROMPT},
            {"role": "user", "content": _prompt(request, asked)},
        ]
        return verdicts | self._chat.ask(
            messages, schema_for(asked), lambda content: _checked(content, asked)
        )


class OpenAICompatiblePolicy:
    """`EvidencePolicy` with an `OpenAICompatibleJudge`: the model judges, the policy decides.

    Takes the judge's arguments (see `OpenAICompatibleJudge`); ``threshold``,
    ``margin`` and ``max_guidance`` go to the `EvidencePolicy`. Guidance beyond
    the requirements (standing constraints, memories about the work) is the
    policy's own, without the model. This policy is optional: the default
    `EvidencePolicy` needs no model, server or key.

    Example::

        with OpenAICompatiblePolicy("http://127.0.0.1:11434/v1", "qwen2.5") as policy:
            decision = PersonaAgent(retriever, policy).decide(request)
    """

    asks_without_requirements: ClassVar[bool] = False  # see `Policy`: never asks without

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout: float = 30.0,
        *,
        temperature: float = 0.0,
        max_retries: int = 1,
        response_format: ResponseFormat = "json_schema",
        max_tokens: int | None = None,
        client: httpx.Client | None = None,
        threshold: float = 0.5,
        margin: float = 0.1,
        max_guidance: int = 5,
    ) -> None:
        self.judge = OpenAICompatibleJudge(
            base_url,
            model,
            api_key,
            timeout,
            temperature=temperature,
            max_retries=max_retries,
            response_format=response_format,
            max_tokens=max_tokens,
            client=client,
        )
        self._policy = EvidencePolicy(threshold, margin, max_guidance, judge=self.judge)

    def __repr__(self) -> str:
        return f"OpenAICompatiblePolicy({self.judge.base_url!r}, {self.judge.model!r})"

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the judge's HTTP client if it made it."""
        self.judge.close()

    def decide(self, request: PersonaRequest, memories: MemoryBundle) -> PersonaDecision:
        """Decide as `EvidencePolicy` does, with the model as the judge."""
        return self._policy.decide(request, memories)


def _prompt(request: PersonaRequest, asked: Mapping[str, list[ScoredMemory]]) -> str:
    """The user message: the request and each requirement's candidates, as JSON.

    The user id is left out (the model has no use for it) and so are embeddings.
    """
    requirements = {r.name: r for r in request.requirements}
    task = {
        "query": request.query,
        "node": request.node.model_dump(mode="json") if request.node else None,
        "requirements": [
            {
                **requirements[name].model_dump(
                    mode="json", include={"name", "description", "question", "options"}
                ),
                "candidates": [_candidate(memory) for memory in memories],
            }
            for name, memories in asked.items()
        ],
    }
    return _json.dumps(task).decode()


def _candidate(memory: ScoredMemory) -> dict[str, Any]:
    record = memory.record
    return {
        "memory_id": record.id,
        "layer": record.layer,
        "said_at": record.at.isoformat(),
        "content": record.content.model_dump(mode="json"),
    }


def _checked(content: str, asked: Mapping[str, list[ScoredMemory]]) -> dict[str, list[Verdict]]:
    """Validate the model's answer against the schema and against what it was shown."""
    answer = validated_json(_ModelAnswer, content, "verdicts")
    verdicts: dict[str, list[Verdict]] = {}
    for i, given in enumerate(answer.verdicts):
        if given.requirement not in asked:
            raise InvalidOutputError(
                f"verdicts[{i}] is for {given.requirement!r}, which was not asked about; "
                f"the requirements are {sorted(asked)}"
            )
        if given.requirement in verdicts:
            raise InvalidOutputError(f"{given.requirement!r} has two verdicts; give exactly one")
        shown = {memory.record.id for memory in asked[given.requirement]}
        stray = [memory_id for memory_id in given.memory_ids if memory_id not in shown]
        if stray:
            raise InvalidOutputError(
                f"verdicts[{i}] cites {stray}, which are not among the memories shown for "
                f"{given.requirement!r}"
            )
        reason = given.reason.strip() or "the model's verdict"
        verdicts[given.requirement] = [
            Verdict(
                memory_id=memory_id,
                answers=not given.ceases,
                strength=1.0 if position == 0 else 0.9,
                # Without a value the memory's own words stand (the constraint quotes it).
                value=None if given.ceases else (given.value or "").strip() or None,
                ceases=given.ceases and position == 0,
                reason=reason,
            )
            for position, memory_id in enumerate(given.memory_ids)
        ]
    missing = sorted(set(asked) - set(verdicts))
    if missing:
        raise InvalidOutputError(f"there is no verdict for {missing}")
    return verdicts
