"""A scripted chat-completions server on loopback, for testing LLM adapters offline.

`FakeChatServer` speaks just enough of OpenAI's ``POST .../chat/completions`` to
test a client of it for real (HTTP, headers, timeouts): it records every request
and replies from a script of ``(status, body)`` pairs, functions of the request
body, or `HANG`. `completion` builds the body of a successful answer::

    with FakeChatServer() as server:
        server.script(completion({"memories": []}))
        extractor = OpenAICompatibleExtractor(server.url, "test-model")
        ...
        assert server.bodies()[0]["model"] == "test-model"

httpx honours proxy variables (``HTTP_PROXY``, ``ALL_PROXY``); unset them in a
test that talks to this server.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

__all__ = ["HANG", "FakeChatServer", "Reply", "completion"]

HANG = "hang"
"""A scripted reply that sends nothing until the server shuts down (or 5 s pass)."""

Reply = tuple[int, Any] | Callable[[dict[str, Any]], tuple[int, Any]] | str
"""``(status, body)`` (a body that is text is sent as is), a function of the request
body returning one, or `HANG`."""


class FakeChatServer:
    """A chat-completions server that records every request and replies from a script.

    With nothing scripted it answers HTTP 500. Start it with `start` (or ``with``,
    which also closes it), and aim a client at `url`.

    Attributes:
        requests: Every request received: ``path``, ``headers`` (lowercased
            names) and ``body`` (parsed JSON).
        replies: The replies still to send, in order.
    """

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.replies: list[Reply] = []
        self.release = threading.Event()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        # A short poll interval: shutdown() waits for one, and every test shuts a server down.
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def url(self) -> str:
        """The API root to give a client, ``http://127.0.0.1:PORT/v1``."""
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def start(self) -> None:
        """Serve requests in a background thread."""
        self.thread.start()

    def script(self, *replies: Reply) -> None:
        """Queue ``replies``, answered one per request in order."""
        self.replies.extend(replies)

    def bodies(self) -> list[dict[str, Any]]:
        """The body of every request received, in order."""
        return [request["body"] for request in self.requests]

    def close(self) -> None:
        """Release hanging replies, stop serving and free the port."""
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        if self.thread.is_alive():
            self.thread.join()

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
                if isinstance(reply, str):  # HANG, the one reply that is text
                    server.release.wait(5)
                    return
                status, payload = reply(server.requests[-1]["body"]) if callable(reply) else reply
                data = payload if isinstance(payload, str) else json.dumps(payload)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data.encode())))
                self.end_headers()
                self.wfile.write(data.encode())

            def log_message(self, *args: object) -> None:  # no access log in test output
                pass

        return Handler


def completion(content: Any, finish_reason: str = "stop") -> tuple[int, Any]:
    """A successful chat completion answering ``content`` (JSON-encoded unless text).

    Args:
        content: The assistant's answer: text as is, anything else as JSON.
        finish_reason: Why the model stopped; ``"length"`` for an answer cut off.

    Returns:
        ``(200, body)``, a reply to `FakeChatServer.script`.
    """
    text = content if isinstance(content, str) else json.dumps(content)
    message = {"role": "assistant", "content": text}
    return 200, {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
    }
