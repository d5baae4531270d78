from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

# The conformance suite and test helpers live in the package; rewrite their asserts so
# failures show values. Before anything imports them, so here, at the root.
pytest.register_assert_rewrite("autopersona_flows.testing")

from autopersona_flows import JsonlMemoryStore  # noqa: E402 - after the rewrite hook

if TYPE_CHECKING:
    from autopersona_flows.memory.postgres import PostgresMemoryStore


@pytest.fixture(scope="session")
def prefect_harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A Prefect test server for the session, with a scratch PREFECT_HOME; yields the home.

    Prefect reads its settings once, when it is imported (at collection), so the
    environment alone would reach only subprocesses: the same values are also entered
    as temporary settings for this process. The results folder is set in the settings
    only, so a subprocess given another PREFECT_HOME keeps its results there too.
    """
    # Imported here: only the tests that request the server load Prefect for it.
    import prefect.settings as ps
    from prefect.client.orchestration import get_client
    from prefect.testing.utilities import prefect_test_harness

    home = tmp_path_factory.mktemp("prefect-home")
    env = {
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
        "DO_NOT_TRACK": "1",
    }
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        with (
            ps.temporary_settings(
                updates={
                    ps.PREFECT_HOME: home,
                    ps.PREFECT_RESULTS_LOCAL_STORAGE_PATH: home / "storage",
                    ps.PREFECT_SERVER_ANALYTICS_ENABLED: False,
                    ps.PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS: 120,
                }
            ),
            prefect_test_harness(server_startup_timeout=120),
        ):
            # Warm the client in this thread: threads that race into the first
            # get_client() can each start a server (PREFECT_NOTES §1a).
            with get_client(sync_client=True) as client:
                client.hello()
            yield home
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture
def store_root(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def store(store_root: Path) -> JsonlMemoryStore:
    return JsonlMemoryStore(store_root)


@pytest.fixture
def run_cli() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run the ``autopersona`` command line in a fresh interpreter, as a user would."""

    def run(
        *args: str,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        timeout: float = 120,
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "autopersona_flows", *args],
            capture_output=True,
            text=True,
            check=False,
            env=env,
            cwd=cwd,
            timeout=timeout,
        )

    return run


# --------------------------------------------------------------------------- PostgreSQL

POSTGRES_ENV = "AUTOPERSONA_TEST_POSTGRES_DSN"


@pytest.fixture(scope="session")
def postgres_dsn() -> str:
    """The test database (``.ci/postgres`` starts one and prints it); skips without one."""
    dsn = os.environ.get(POSTGRES_ENV)
    if not dsn:
        pytest.skip(f"no PostgreSQL: set {POSTGRES_ENV} (`.ci/postgres` starts one)")
    psycopg = pytest.importorskip("psycopg", reason="the postgres extra is not installed")
    try:
        psycopg.connect(dsn, connect_timeout=5).close()
    except psycopg.Error as exc:
        pytest.skip(f"PostgreSQL at {POSTGRES_ENV} is unreachable: {exc}")
    return dsn


@pytest.fixture
def postgres_schema(postgres_dsn: str) -> Iterator[str]:
    """A DSN whose tables live in a fresh schema, dropped afterwards."""
    import psycopg

    schema = f"autopersona_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    separator = "&" if "?" in postgres_dsn else "?"
    yield f"{postgres_dsn}{separator}options=-csearch_path%3D{schema}"  # still a URL
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


@pytest.fixture
def pg_store(postgres_schema: str) -> Iterator[PostgresMemoryStore]:
    from autopersona_flows.memory.postgres import PostgresMemoryStore

    store = PostgresMemoryStore(postgres_schema)
    yield store
    store.close()
