"""The launcher of the test LLM server fails fast and clearly, with no model needed."""

import os
import stat
import time
from pathlib import Path

import pytest

from autopersona_flows.testing.llama import SmolLM2Unavailable, llama_server


def fake_python(tmp_path: Path, serve: str) -> str:
    """A "python" that finds the model package, then runs ``serve`` as the server."""
    script = tmp_path / "python"
    script.write_text(
        f'#!/bin/sh\nif [ "$1" = "-c" ]; then echo "{tmp_path}"; exit 0; fi\n{serve}\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def test_a_python_without_the_server_is_a_reason_to_skip(tmp_path: Path) -> None:
    script = tmp_path / "python"
    script.write_text("#!/bin/sh\necho 'No module named llama_cpp' >&2\nexit 1\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    with (
        pytest.raises(SmolLM2Unavailable, match="No module named llama_cpp"),
        llama_server(str(script)),
    ):
        pass


def test_a_server_that_exits_is_reported_at_once(tmp_path: Path) -> None:
    started = time.monotonic()
    with (
        pytest.raises(RuntimeError, match="exited with code 3 before answering"),
        llama_server(fake_python(tmp_path, "exit 3"), start_timeout=120),
    ):
        pass
    assert time.monotonic() - started < 60  # long before the start timeout


def test_a_server_that_never_answers_times_out_and_is_stopped(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    python = fake_python(tmp_path, f'echo $$ > "{pid_file}"; exec sleep 60')
    with (
        pytest.raises(TimeoutError, match="did not answer within 1"),
        llama_server(python, start_timeout=1),
    ):
        pass
    with pytest.raises(ProcessLookupError):  # stopped and reaped
        os.kill(int(pid_file.read_text()), 0)


def test_a_server_that_ignores_terminate_is_killed(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    # The shell ignores SIGTERM and so does the sleep it waits on.
    python = fake_python(tmp_path, f"trap '' TERM; echo $$ > \"{pid_file}\"; sleep 60")
    with (
        pytest.raises(TimeoutError),
        llama_server(python, start_timeout=1),
    ):
        pass
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)
