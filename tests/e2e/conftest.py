"""A real Prefect stack on loopback: ``prefect server start``, a process work pool,
``prefect --no-prompt deploy --all`` from the repository's ``prefect.yaml``, and a
``prefect worker``; all in a scratch ``PREFECT_HOME`` and stopped by process group.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import prefect.settings as ps
import pytest

REPO = Path(__file__).resolve().parents[2]
PREFECT = [sys.executable, "-m", "prefect"]
POOL = "autopersona"  # the work pool prefect.yaml names
POSTGRES_ENV = "AUTOPERSONA_TEST_POSTGRES_DSN"


@dataclass
class Stack:
    """The running stack, its memory store's address and the folders its runs write to."""

    api_url: str
    env: dict[str, str]
    root: Path
    store: str

    @property
    def worklog(self) -> Path:
        return self.root / "worklog.jsonl"

    @property
    def snapshots(self) -> Path:
        return self.root / "snapshots"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    # Own session: the whole group is stopped at the end; a background worker
    # ignores SIGTERM otherwise (PREFECT_NOTES §7).
    with log.open("wb") as out:
        return subprocess.Popen(
            command, env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def _stop(process: subprocess.Popen[bytes]) -> None:
    for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(grace)
            return
        except subprocess.TimeoutExpired:
            continue


def _run(command: list[str], env: dict[str, str]) -> str:
    done = subprocess.run(
        command, env=env, cwd=REPO, capture_output=True, text=True, timeout=180, check=False
    )
    assert done.returncode == 0, f"{command} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _wait_healthy(api_url: str, server: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"prefect server exited early:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{api_url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    pytest.fail(f"prefect server not healthy within 180 s:\n{log.read_text()[-3000:]}")


@contextmanager
def running_stack(
    root: Path, *, store: str, workers: int = 1, database: str | None = None, ui: bool = False
) -> Iterator[Stack]:
    """Server (on ``database`` if given, else SQLite), pool, deployments and workers.

    With ``ui`` the server also serves the Prefect UI (at ``api_url`` without ``/api``).
    """
    api_url = f"http://127.0.0.1:{_free_port()}/api"
    # Only what the stack needs: a test session's own Prefect settings must not leak in.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env |= {
        "PREFECT_HOME": str(root / "prefect"),
        "PREFECT_API_URL": api_url,
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "DO_NOT_TRACK": "1",
        "PREFECT_SERVER_UI_ENABLED": str(ui).lower(),
        "PREFECT_WORKER_QUERY_SECONDS": "1",
        "PREFECT_WORKER_PREFETCH_SECONDS": "1",
        "PREFECT_LOGGING_LEVEL": "INFO",
        # What a deployment run builds its agent from (AutopersonaSettings).
        "PREFECT_INTEGRATIONS_AUTOPERSONA_STORE": store,
        "PREFECT_INTEGRATIONS_AUTOPERSONA_RESULTS": str(root / "results"),
        "PREFECT_INTEGRATIONS_AUTOPERSONA_SNAPSHOTS": str(root / "snapshots"),
        "PREFECT_INTEGRATIONS_AUTOPERSONA_PAUSE_TIMEOUT": "600",
        "AUTOPERSONA_EXAMPLES_WORKLOG": str(root / "worklog.jsonl"),
    }
    if database is not None:
        env["PREFECT_API_DATABASE_CONNECTION_URL"] = database
    port = api_url.split(":")[2].split("/", maxsplit=1)[0]
    processes: list[subprocess.Popen[bytes]] = []
    try:
        server_log = root / "server.log"
        server = _start(
            [*PREFECT, "server", "start", "--host", "127.0.0.1", "--port", port],
            env,
            server_log,
        )
        processes.append(server)
        _wait_healthy(api_url, server, server_log)
        _run([*PREFECT, "work-pool", "create", POOL, "--type", "process"], env)
        _run([*PREFECT, "--no-prompt", "deploy", "--all"], env)
        for n in range(workers):
            command = [*PREFECT, "worker", "start", "--pool", POOL, "--name", f"worker-{n}"]
            processes.append(_start(command, env, root / f"worker-{n}.log"))
        with ps.temporary_settings(updates={ps.PREFECT_API_URL: api_url}):
            yield Stack(api_url=api_url, env=env, root=root, store=store)
    finally:
        for process in reversed(processes):
            _stop(process)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The stack on SQLite with a JSONL memory store, up for the module."""
    root = tmp_path_factory.mktemp("e2e")
    with running_stack(root, store=str(root / "memory")) as running:
        yield running


@pytest.fixture(scope="module")
def ui_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The stack on SQLite with the server also serving the Prefect UI, for a browser."""
    root = tmp_path_factory.mktemp("e2e-browser")
    with running_stack(root, store=str(root / "memory"), ui=True) as running:
        yield running


@pytest.fixture(scope="module")
def postgres_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Prefect's server on PostgreSQL and two workers sharing a PostgreSQL memory store."""
    dsn = os.environ.get(POSTGRES_ENV)
    if not dsn:
        pytest.skip(f"no PostgreSQL: set {POSTGRES_ENV} (`.ci/postgres` starts one)")
    psycopg = pytest.importorskip("psycopg", reason="the postgres extra is not installed")
    name = f"autopersona_e2e_{uuid.uuid4().hex[:10]}"
    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.Error as exc:
        pytest.skip(f"cannot create a database for Prefect at {POSTGRES_ENV}: {exc}")
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    database = (
        f"postgresql+asyncpg://{info['user']}:{info['password']}@{info['host']}:"
        f"{info.get('port', 5432)}/{name}"
    )
    store = dsn.rsplit("/", 1)[0] + f"/{name}"  # the memory bank shares the database
    root = tmp_path_factory.mktemp("e2e-postgres")
    try:
        with running_stack(root, store=store, workers=2, database=database) as running:
            yield running
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
