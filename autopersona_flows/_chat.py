"""Structured answers from any server that speaks OpenAI's chat-completions API.

`StructuredChat` is the HTTP plumbing that the LLM judge (``agent/openai.py``) and
the LLM extractor (``memory/llm_extraction.py``) share: it sends messages with a
JSON schema to ``POST {base_url}/chat/completions`` and hands the answer's text to
the caller's ``check``, which returns what the answer means or raises
`InvalidOutputError` with the problem. Invalid output is sent back to the model
with the problem, and the model asked again, within one retry budget that
timeouts, refused connections and HTTP 408, 429 and 5xx share. A server that
refuses ``response_format: json_schema`` (llama.cpp answers HTTP 500) is asked
with ``{"type": "json_object", "schema": ...}`` instead, from then on.

It lives outside ``memory/`` and ``agent/`` so that both can use it, and imports
neither (nor Prefect).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Literal, Self, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from autopersona_flows._validation import describe
from autopersona_flows.errors import AutopersonaError

__all__ = [
    "ChatAdapter",
    "InvalidOutputError",
    "ResponseFormat",
    "StructuredChat",
    "validated_json",
]

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)

ResponseFormat = Literal["json_schema", "json_object"]

_FENCE = re.compile(r"\A```(?:json)?\s*\n(.*)\n```\Z", re.DOTALL)
_RETRIED_STATUS = frozenset({408, 429})
_MAX_REASON = 300


class InvalidOutputError(Exception):
    """The model answered, but not as asked; worth asking again.

    Raised by a ``check`` given to `StructuredChat.ask`; never leaves it (the
    caller's error class does, after the last attempt).

    Args:
        problem: What is wrong, in words the model (and a person) can act on.
        answer: The answer to send back with the problem; the one that was
            checked if ``None``.
    """

    def __init__(self, problem: str, answer: str | None = None) -> None:
        super().__init__(problem)
        self.answer = answer


class _TransientError(Exception):
    """The server failed in a way that may pass (timeout, 429, 5xx); worth asking again."""


class StructuredChat:
    """Ask a model for a JSON answer that follows a schema, and check it.

    The arguments are those of the adapters built on it (`OpenAICompatibleJudge`,
    `OpenAICompatibleExtractor`), which check them here, plus what the adapter
    chooses for its users: its error class, the name of its answers, its logger.

    Args:
        base_url: The API root, e.g. ``"http://127.0.0.1:8000/v1"``.
        model: The model name the server knows.
        api_key: Sent as ``Authorization: Bearer ...`` when given; never logged
            nor shown in a repr.
        timeout: Seconds to wait for each response (also for an injected client).
        temperature: Sampling temperature.
        max_retries: How many more requests after a failed one.
        response_format: ``"json_schema"`` (OpenAI's structured outputs) or
            ``"json_object"`` with the schema (llama.cpp, Ollama).
        max_tokens: The most tokens an answer may take; the server's default if
            ``None``. An answer cut off there is invalid output.
        client: An `httpx.Client` to send requests with (pooling, tests); it stays
            open on `close`. One is made, and closed, otherwise.
        error: The error raised when asking fails for good, called with the
            message (e.g. `PolicyError`).
        name: What the answers are, as a plural noun (``"verdicts"``): the schema's
            name in ``response_format`` and the word in messages.
        logger: Where retries are logged; this module's logger by default.

    Raises:
        ValueError: If ``base_url`` is not an http(s) URL, ``model`` is empty, or
            ``timeout``, ``max_retries``, ``max_tokens`` or ``response_format`` is
            out of range.
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
        response_format: ResponseFormat = "json_schema",
        max_tokens: int | None = None,
        client: httpx.Client | None = None,
        error: type[AutopersonaError],
        name: str,
        logger: logging.Logger | None = None,
    ) -> None:
        if max_tokens is not None and (
            isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1
        ):
            raise ValueError(f"max_tokens must be a positive int or None, got {max_tokens!r}")
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
        if response_format not in ("json_schema", "json_object"):
            raise ValueError(
                f"response_format must be 'json_schema' or 'json_object', got {response_format!r}"
            )
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.timeout = timeout
        self.temperature = temperature
        self.max_retries = max_retries
        self.response_format: ResponseFormat = response_format
        self.max_tokens = max_tokens
        self.error = error
        self.name = name
        self.logger = logger or logging.getLogger(__name__)
        self._api_key = api_key
        self._owns_client = client is None
        self.client = client if client is not None else httpx.Client()

    def __repr__(self) -> str:
        # The api key stays out: reprs end up in logs and Prefect's UI.
        return f"StructuredChat({self.base_url!r}, {self.model!r})"

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the HTTP client if this chat made it; an injected one stays open."""
        if self._owns_client:
            self.client.close()

    @property
    def url(self) -> str:
        """The endpoint requests are sent to."""
        return f"{self.base_url}/chat/completions"

    def ask(
        self,
        messages: Sequence[Mapping[str, str]],
        schema: Mapping[str, Any],
        check: Callable[[str], T],
    ) -> T:
        """Send ``messages`` with ``schema`` until ``check`` accepts the answer.

        Args:
            messages: The conversation so far (``role`` and ``content``); not changed.
            schema: The JSON schema the answer must follow.
            check: Reads the answer's text: returns what it means, or raises
                `InvalidOutputError` saying what is wrong with it.

        Returns:
            What ``check`` returned for the first answer it accepted.

        Raises:
            AutopersonaError: The ``error`` class: if the last answer is invalid
                (the message says why), or the server cannot be reached or answers
                with an error (the message gives the HTTP status or the failure).
        """
        conversation = [dict(message) for message in messages]
        attempts = 1 + self.max_retries
        for attempt in range(1, attempts + 1):
            try:
                return self._checked(conversation, schema, check)
            except _TransientError as exc:
                if attempt == attempts:
                    raise self.error(f"{exc} (after {_requests(attempts)})") from exc.__cause__
                self.logger.warning("%s; trying again (%d/%d)", exc, attempt, attempts)
            except InvalidOutputError as exc:
                if attempt == attempts:
                    raise self.error(
                        f"model {self.model!r} at {self.url} gave invalid {self.name} after "
                        f"{_requests(attempts)}: {exc}"
                    ) from None
                self.logger.warning(
                    "model %r gave invalid %s (%s); asking again (%d/%d)",
                    self.model,
                    self.name,
                    exc,
                    attempt,
                    attempts,
                )
                conversation += [
                    {"role": "assistant", "content": exc.answer or ""},
                    {
                        "role": "user",
                        "content": f"That answer is invalid: {exc}. Reply again with only "
                        "a JSON object that follows the schema and the rules.",
                    },
                ]
        raise AssertionError("unreachable")  # pragma: no cover

    def _checked(
        self,
        messages: list[dict[str, str]],
        schema: Mapping[str, Any],
        check: Callable[[str], T],
    ) -> T:
        content = self._complete(messages, schema)
        try:
            return check(content)
        except InvalidOutputError as exc:
            if exc.answer is None:
                exc.answer = content
            raise

    def _complete(self, messages: list[dict[str, str]], schema: Mapping[str, Any]) -> str:
        """Send ``messages`` and return the answer's text."""
        response = self._post(messages, schema)
        if self.response_format == "json_schema" and _refuses_schema(response):
            self.logger.warning(
                "%s refused response_format json_schema (HTTP %d: %s); asking with "
                "json_object and the schema from now on",
                self.url,
                response.status_code,
                _reason(response),
            )
            self.response_format = "json_object"
            response = self._post(messages, schema)
        if response.status_code in _RETRIED_STATUS or response.is_server_error:
            raise _TransientError(
                f"{self.url} answered HTTP {response.status_code}: {_reason(response)}"
            )
        if not response.is_success:
            raise self.error(
                f"{self.url} answered HTTP {response.status_code}: {_reason(response)}"
            )
        try:
            choice = response.json()["choices"][0]
            message = choice["message"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise self.error(
                f"{self.url} answered HTTP {response.status_code} without a chat completion "
                f"(no choices[0].message): {_reason(response)}"
            ) from None
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, str) or not content.strip():
            refusal = message.get("refusal") if isinstance(message, dict) else None
            why = f"the model refused: {refusal}" if refusal else "the answer is empty"
            raise InvalidOutputError(why, "")
        if choice.get("finish_reason") == "length":
            raise InvalidOutputError("the answer was cut off (finish_reason 'length')", content)
        return content

    def _post(self, messages: list[dict[str, str]], schema: Mapping[str, Any]) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        response_format: dict[str, Any] = (
            {
                "type": "json_schema",
                "json_schema": {"name": self.name, "schema": schema, "strict": False},
            }
            if self.response_format == "json_schema"
            else {"type": "json_object", "schema": schema}
        )
        body = {
            "model": self.model,
            "messages": messages,
            "temperature": self.temperature,
            "response_format": response_format,
        }
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        try:
            return self.client.post(self.url, json=body, headers=headers, timeout=self.timeout)
        except httpx.TimeoutException as exc:
            raise _TransientError(f"{self.url} did not answer within {self.timeout:g} s") from exc
        except httpx.TransportError as exc:
            raise _TransientError(f"cannot reach {self.url}: {exc or type(exc).__name__}") from exc


def validated_json(model: type[M], content: str, name: str) -> M:
    """Parse an answer as ``model``, from plain JSON or JSON in a markdown fence.

    Args:
        model: The pydantic model of the whole answer.
        content: The answer's text.
        name: What the answer holds, for the problem (``"verdicts"``).

    Raises:
        InvalidOutputError: If it is not valid JSON for ``model``, naming every
            offending field.
    """
    text = content.strip()
    fenced = _FENCE.match(text)
    if fenced:  # some servers ignore response_format and the model answers in markdown
        text = fenced.group(1)
    try:
        return model.model_validate_json(text)
    except ValidationError as exc:
        problem = describe(exc, "answer")
        raise InvalidOutputError(f"it is not a valid {name} object ({problem})") from None


def _requests(count: int) -> str:
    return f"{count} request{'s' if count > 1 else ''}"


def _refuses_schema(response: httpx.Response) -> bool:
    """Whether an error says the server cannot take ``response_format: json_schema``.

    Only an error naming the response format or the schema: a transient 500 is
    retried as it is, and keeps structured outputs.
    """
    if response.status_code not in (400, 422, 500):
        return False
    said = _reason(response).casefold()
    return "response_format" in said or "schema" in said


def _reason(response: httpx.Response) -> str:
    """A short reason from an error body: OpenAI's ``error.message``, or the text."""
    try:
        error = response.json()["error"]
        reason = error["message"] if isinstance(error, dict) else error
    except (ValueError, KeyError, TypeError):
        reason = response.text or response.reason_phrase
    reason = " ".join(str(reason).split())
    return reason if len(reason) <= _MAX_REASON else reason[: _MAX_REASON - 1] + "…"


class ChatAdapter:
    """What the adapters on a `StructuredChat` share: its settings, closing, a safe repr.

    A subclass names its error class, the name of its answers and its logger; its
    own docstring documents the arguments, which are `StructuredChat`'s.
    """

    _error: ClassVar[type[AutopersonaError]]
    _answers: ClassVar[str]
    _logger: ClassVar[logging.Logger]

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
    ) -> None:
        self._chat = StructuredChat(
            base_url,
            model,
            api_key,
            timeout,
            temperature=temperature,
            max_retries=max_retries,
            response_format=response_format,
            max_tokens=max_tokens,
            client=client,
            error=self._error,
            name=self._answers,
            logger=self._logger,
        )

    def __repr__(self) -> str:
        # The api key stays out: reprs end up in logs and Prefect's UI.
        return f"{type(self).__name__}({self.base_url!r}, {self.model!r})"

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the HTTP client if this adapter made it; an injected one stays open."""
        self._chat.close()

    @property
    def base_url(self) -> str:
        """The API root, without a trailing slash."""
        return self._chat.base_url

    @property
    def model(self) -> str:
        """The model name the server knows."""
        return self._chat.model

    @property
    def timeout(self) -> float:
        """Seconds to wait for each response."""
        return self._chat.timeout

    @property
    def temperature(self) -> float:
        """The sampling temperature."""
        return self._chat.temperature

    @property
    def max_retries(self) -> int:
        """How many more requests after a failed one."""
        return self._chat.max_retries

    @property
    def max_tokens(self) -> int | None:
        """The most tokens an answer may take, or ``None`` for the server's default."""
        return self._chat.max_tokens

    @property
    def response_format(self) -> ResponseFormat:
        """How the schema is sent; ``"json_object"`` once the server refused ``json_schema``."""
        return self._chat.response_format

    @response_format.setter
    def response_format(self, value: ResponseFormat) -> None:
        self._chat.response_format = value

    @property
    def url(self) -> str:
        """The endpoint requests are sent to."""
        return self._chat.url
