"""A decision policy backed by any server that speaks OpenAI's chat-completions API.

The model sees the request and the evidence retrieved for it, and answers with a
decision as JSON. Its answer is checked like any policy's (`parse_decision`),
and then against what it was shown: a constraint citing a memory it was not
shown, or a clarification about a requirement the node does not have, is
invalid output. The model is told what was wrong and asked once more.
"""

from __future__ import annotations

import copy
import logging
import re
from collections.abc import Iterator
from typing import Any, Self

import httpx

from autopersona_flows import _json
from autopersona_flows.agent.decisions import (
    JSON_SCHEMA,
    ClarifyDecision,
    FinalDecision,
    PersonaDecision,
    PersonaRequest,
    parse_decision,
)
from autopersona_flows.errors import PolicyError
from autopersona_flows.memory.records import LAYERS
from autopersona_flows.memory.retrieval import MemoryBundle, ScoredMemory

__all__ = ["OUTPUT_SCHEMA", "OpenAICompatiblePolicy"]

logger = logging.getLogger(__name__)

_SYSTEM_PROMPT = """\
You decide, for one step of a person's task, whether the assistant can proceed \
with final guidance or must first ask the person one clarifying question.

You are shown the request (the person's query, the task node, what the node requires, \
and the tools it may use) and the evidence retrieved from this person's memory: each \
memory's id, layer, retrieval score in [0, 1], when it was last updated, the search that \
found it (the label "requirement:NAME" marks evidence searched for requirement NAME) \
and its content.

Rules:
1. Answer "clarify" only when a required requirement has no supporting evidence among \
the memories shown. Then ask exactly one targeted question about that requirement: name \
what is missing and what it is for, and offer its options if it has any. Set \
"requirement" to its name.
2. When the request has no requirements, never ask: answer "final".
3. Otherwise answer "final". "guidance" says in words what to do for this person. \
"constraints" lists what the step must respect, one per memory you rely on, each with \
the requirement it satisfies (if any) and the memory_id, layer and score of that memory \
exactly as shown.
4. Use only the evidence shown. Never invent memories, ids, preferences or scores.
5. When memories on the same topic disagree, the most recently updated one is the \
person's current preference.

Reply with one JSON object and nothing else, shaped like one of:
{"action": "final", "guidance": "...", "constraints": [{"text": "...", \
"requirement": "...", "memory_id": "...", "layer": "persona", "score": 0.8}]}
{"action": "clarify", "question": "...", "requirement": "...", "options": ["..."]}"""

_FENCE = re.compile(r"\A```(?:json)?\s*\n(.*)\n```\Z", re.DOTALL)
_RETRIED_STATUS = frozenset({408, 429})
_MAX_REASON = 300


def _output_schema() -> dict[str, Any]:
    """The schema of a decision as the model returns it: without ``memories``.

    Derived from `JSON_SCHEMA` so that it follows the models. The agent attaches
    the retrieved memories itself; a model asked for them would copy (or invent)
    the whole bundle, embeddings included.
    """
    schema = copy.deepcopy(JSON_SCHEMA)
    defs: dict[str, Any] = schema["$defs"]  # type: ignore[assignment]
    for model in (FinalDecision, ClarifyDecision):
        definition = defs[model.__name__]
        del definition["properties"]["memories"]
        # The action has a default in Python, but it is the tag that tells the two apart.
        definition["required"] = ["action", *definition["required"]]
        definition["description"] = "\n".join(
            line
            for line in definition["description"].splitlines()
            if not line.strip().startswith("memories:")
        )
    # Not every server's constrained decoding knows OpenAPI's "discriminator" or
    # "oneOf"; "anyOf" of two objects with distinct "action" constants means the same.
    schema.pop("discriminator", None)
    schema["anyOf"] = schema.pop("oneOf")
    reachable = set(_refs(schema.get("anyOf")))
    pending = list(reachable)
    while pending:
        for name in _refs(defs[pending.pop()]):
            if name not in reachable:
                reachable.add(name)
                pending.append(name)
    schema["$defs"] = {name: defs[name] for name in sorted(reachable)}
    return schema


def _refs(value: Any) -> Iterator[str]:
    """The names of the ``#/$defs/NAME`` references anywhere in ``value``."""
    if isinstance(value, dict):
        ref = value.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            yield ref.removeprefix("#/$defs/")
        for child in value.values():
            yield from _refs(child)
    elif isinstance(value, list):
        for child in value:
            yield from _refs(child)


OUTPUT_SCHEMA: dict[str, Any] = _output_schema()
"""The JSON schema the model's answer is asked to follow: a decision without ``memories``."""


class _InvalidOutputError(Exception):
    """The model answered, but not with a valid decision; worth asking again.

    Args:
        problem: What is wrong, in words the model (and a person) can act on.
        answer: The model's answer as given, to send back with the problem.
    """

    def __init__(self, problem: str, answer: str) -> None:
        super().__init__(problem)
        self.answer = answer


class _TransientError(Exception):
    """The server failed in a way that may pass (timeout, 429, 5xx); worth asking again."""


class OpenAICompatiblePolicy:
    """Let a language model decide final or clarify, through a chat-completions endpoint.

    Works with OpenAI, vLLM, Ollama (``http://127.0.0.1:11434/v1``), llama.cpp's
    server and any other server speaking ``POST {base_url}/chat/completions``. The
    model is sent the request and the retrieved evidence (ids, layers, scores, the
    search that found each memory and its content; never the user id nor any
    embedding) and asked for a JSON decision under a JSON schema
    (`OUTPUT_SCHEMA`).

    Its answer must validate with `parse_decision`, and every constraint must cite
    a memory it was shown; a clarification must name a required requirement of the
    request (a request without requirements is never asked about). Each
    constraint's ``layer`` and ``score`` are taken from the cited memory: they are
    facts of retrieval, not the model's judgement. The decision carries no
    memories; `PersonaAgent` attaches the retrieved ones.

    Invalid output is sent back with what was wrong, and the model asked again, up
    to ``max_retries`` times. Timeouts, refused connections, HTTP 408, 429 and 5xx
    are retried within the same budget; other HTTP errors are not.

    This policy is optional: the default `EvidencePolicy` needs no model, server
    or key.

    Args:
        base_url: The API root, e.g. ``"http://127.0.0.1:8000/v1"`` (a trailing
            slash is fine).
        model: The model name the server knows.
        api_key: Sent as ``Authorization: Bearer ...`` when given; never logged.
        timeout: Seconds to wait for each response (also for an injected client).
        temperature: Sampling temperature; 0 for the most repeatable decisions.
        max_retries: How many more requests after a failed one.
        client: An `httpx.Client` to send requests with (for pooling or tests);
            it stays open on `close`. One is made, and closed, otherwise.

    Raises:
        ValueError: If ``base_url`` is not an http(s) URL, ``model`` is empty,
            or ``timeout`` or ``max_retries`` is out of range.

    Example::

        with OpenAICompatiblePolicy("http://127.0.0.1:11434/v1", "qwen2.5") as policy:
            decision = PersonaAgent(retriever, policy).decide(request)
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout: float = 30.0,
        *,
        temperature: float = 0.0,
        max_retries: int = 1,
        client: httpx.Client | None = None,
    ) -> None:
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(
                f"base_url must be an http(s) URL such as 'http://127.0.0.1:8000/v1', "
                f"got {base_url!r}"
            )
        if not isinstance(model, str) or not model.strip():
            raise ValueError(f"model must name the server's model, got {model!r}")
        if not timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ValueError(f"max_retries must be a non-negative int, got {max_retries!r}")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.timeout = timeout
        self.temperature = temperature
        self.max_retries = max_retries
        self._api_key = api_key
        self._owns_client = client is None
        self._client = client if client is not None else httpx.Client()

    def __repr__(self) -> str:
        # The api key stays out: reprs end up in logs and Prefect's UI.
        return f"OpenAICompatiblePolicy({self.base_url!r}, {self.model!r})"

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the HTTP client if this policy made it; an injected one stays open."""
        if self._owns_client:
            self._client.close()

    @property
    def url(self) -> str:
        """The endpoint requests are sent to."""
        return f"{self.base_url}/chat/completions"

    def decide(self, request: PersonaRequest, memories: MemoryBundle) -> PersonaDecision:
        """Ask the model for a decision on ``request`` given ``memories``.

        Returns:
            A checked decision without memories (`PersonaAgent` attaches them).

        Raises:
            PolicyError: If the model's last answer is invalid (the message says
                why), or the server cannot be reached or answers with an error
                (the message gives the HTTP status or the failure).
        """
        shown = {memory.record.id: memory for memory in memories}
        messages: list[dict[str, str]] = [
            {"role": "system", "content": _SYSTEM_PROMPT},
            {"role": "user", "content": _prompt(request, memories)},
        ]
        attempts = 1 + self.max_retries
        for attempt in range(1, attempts + 1):
            try:
                content = self._complete(messages)
                return _checked(content, request, shown)
            except _TransientError as exc:
                if attempt == attempts:
                    raise PolicyError(
                        f"{exc} (after {attempts} request{'s' if attempts > 1 else ''})"
                    ) from exc.__cause__
                logger.warning("%s; trying again (%d/%d)", exc, attempt, attempts)
            except _InvalidOutputError as exc:
                if attempt == attempts:
                    raise PolicyError(
                        f"model {self.model!r} at {self.url} gave an invalid decision "
                        f"after {attempts} request{'s' if attempts > 1 else ''}: {exc}"
                    ) from None
                logger.warning(
                    "model %r gave an invalid decision (%s); asking again (%d/%d)",
                    self.model,
                    exc,
                    attempt,
                    attempts,
                )
                messages += [
                    {"role": "assistant", "content": exc.answer},
                    {
                        "role": "user",
                        "content": f"That answer is invalid: {exc}. Reply again with only "
                        "a JSON object that follows the schema and the rules.",
                    },
                ]
        raise AssertionError("unreachable")  # pragma: no cover

    def _complete(self, messages: list[dict[str, str]]) -> str:
        """Send ``messages`` and return the answer's text."""
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        body = {
            "model": self.model,
            "messages": messages,
            "temperature": self.temperature,
            "response_format": {
                "type": "json_schema",
                "json_schema": {
                    "name": "persona_decision",
                    "schema": OUTPUT_SCHEMA,
                    "strict": False,
                },
            },
        }
        try:
            response = self._client.post(self.url, json=body, headers=headers, timeout=self.timeout)
        except httpx.TimeoutException as exc:
            raise _TransientError(f"{self.url} did not answer within {self.timeout:g} s") from exc
        except httpx.TransportError as exc:
            raise _TransientError(f"cannot reach {self.url}: {exc or type(exc).__name__}") from exc
        if response.status_code in _RETRIED_STATUS or response.is_server_error:
            raise _TransientError(
                f"{self.url} answered HTTP {response.status_code}: {_reason(response)}"
            )
        if not response.is_success:
            raise PolicyError(
                f"{self.url} answered HTTP {response.status_code}: {_reason(response)}"
            )
        try:
            choice = response.json()["choices"][0]
            message = choice["message"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise PolicyError(
                f"{self.url} answered HTTP {response.status_code} without a chat completion "
                f"(no choices[0].message): {_reason(response)}"
            ) from None
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, str) or not content.strip():
            refusal = message.get("refusal") if isinstance(message, dict) else None
            why = f"the model refused: {refusal}" if refusal else "the answer is empty"
            raise _InvalidOutputError(why, "")
        if choice.get("finish_reason") == "length":
            raise _InvalidOutputError("the answer was cut off (finish_reason 'length')", content)
        return content


def _prompt(request: PersonaRequest, memories: MemoryBundle) -> str:
    """The user message: the request and the evidence, as JSON.

    The user id is left out (the model has no use for it) and so are embeddings.
    """
    task: dict[str, Any] = {
        "query": request.query,
        "node": request.node.model_dump(mode="json") if request.node else None,
        "requirements": [
            requirement.model_dump(mode="json") for requirement in request.requirements
        ],
        "additional_tools": list(request.additional_tools),
    }
    evidence = {layer: [_evidence(memory) for memory in memories.layer(layer)] for layer in LAYERS}
    return _json.dumps({"request": task, "evidence": evidence}).decode()


def _evidence(memory: ScoredMemory) -> dict[str, Any]:
    record = memory.record
    return {
        "memory_id": record.id,
        "layer": record.layer,
        "score": round(memory.score, 4),
        "updated_at": record.updated_at.isoformat(),
        "found_by": {"label": memory.search.label, "query": memory.search.query},
        "content": record.content.model_dump(mode="json"),
    }


def _checked(
    content: str, request: PersonaRequest, shown: dict[str, ScoredMemory]
) -> PersonaDecision:
    """Validate the model's answer against the schema and against what it was shown."""
    text = content.strip()
    fenced = _FENCE.match(text)
    if fenced:  # some servers ignore response_format and the model answers in markdown
        text = fenced.group(1)
    try:
        value = _json.loads(text)
    except _json.JSONDecodeError as exc:
        raise _InvalidOutputError(f"it is not JSON ({exc})", content) from None
    if not isinstance(value, dict):
        raise _InvalidOutputError(f"expected a JSON object, got {type(value).__name__}", content)
    if "memories" in value:
        raise _InvalidOutputError(
            "'memories' must not be returned; they are attached for you", content
        )
    try:
        decision = parse_decision(value)
    except PolicyError as exc:
        raise _InvalidOutputError(str(exc), content) from None
    names = {requirement.name for requirement in request.requirements}
    if isinstance(decision, ClarifyDecision):
        required = [r.name for r in request.requirements if r.required]
        if not required:
            raise _InvalidOutputError(
                "a clarification was given, but the request has no required requirements: "
                "answer 'final'",
                content,
            )
        if decision.requirement not in required:
            raise _InvalidOutputError(
                f"a clarification must name the required requirement it asks about, one of "
                f"{required}; got {decision.requirement!r}",
                content,
            )
        return decision
    constraints = []
    for i, constraint in enumerate(decision.constraints):
        cited = shown.get(constraint.memory_id)
        if cited is None:
            raise _InvalidOutputError(
                f"constraints[{i}] cites memory_id {constraint.memory_id!r}, which is not "
                f"among the memories shown",
                content,
            )
        if constraint.requirement is not None and constraint.requirement not in names:
            raise _InvalidOutputError(
                f"constraints[{i}] names requirement {constraint.requirement!r}, which the "
                f"request does not have (it has {sorted(names)})",
                content,
            )
        constraints.append(
            constraint.model_copy(update={"layer": cited.record.layer, "score": cited.score})
        )
    return decision.model_copy(update={"constraints": constraints})


def _reason(response: httpx.Response) -> str:
    """A short reason from an error body: OpenAI's ``error.message``, or the text."""
    try:
        error = response.json()["error"]
        reason = error["message"] if isinstance(error, dict) else error
    except (ValueError, KeyError, TypeError):
        reason = response.text or response.reason_phrase
    reason = " ".join(str(reason).split())
    return reason if len(reason) <= _MAX_REASON else reason[: _MAX_REASON - 1] + "…"
