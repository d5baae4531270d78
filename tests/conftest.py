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
