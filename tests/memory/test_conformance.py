"""Every store (JSONL, in-memory, PostgreSQL) runs the conformance suite every backend runs."""

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from autopersona_flows import JsonlMemoryStore, MemoryStore
from autopersona_flows.testing import InMemoryMemoryStore, MemoryStoreConformance


class TestJsonlConformance(MemoryStoreConformance):
    @pytest.fixture
    def store(self, tmp_path: Path) -> MemoryStore:
        return JsonlMemoryStore(tmp_path / "store")

    @pytest.fixture
    def reopen(self, tmp_path: Path) -> Callable[[], MemoryStore]:
        return lambda: JsonlMemoryStore(tmp_path / "store")


class TestInMemoryConformance(MemoryStoreConformance):
    """The store of users' unit tests: one object is the whole store, so it reopens as itself."""

    @pytest.fixture
    def store(self) -> MemoryStore:
        return InMemoryMemoryStore()

    @pytest.fixture
    def reopen(self, store: MemoryStore) -> Callable[[], MemoryStore]:
        return lambda: store


class TestPostgresConformance(MemoryStoreConformance):
    """Each test in a fresh schema of the ``AUTOPERSONA_TEST_POSTGRES_DSN`` database."""

    @pytest.fixture
    def store(self, postgres_schema: str) -> Iterator[MemoryStore]:
        from autopersona_flows.memory.postgres import PostgresMemoryStore

        with PostgresMemoryStore(postgres_schema) as store:
            yield store

    @pytest.fixture
    def reopen(self, postgres_schema: str) -> Callable[[], MemoryStore]:
        from autopersona_flows.memory.postgres import PostgresMemoryStore

        return lambda: PostgresMemoryStore(postgres_schema)


def test_testing_surface_is_deliberate_and_prefect_free() -> None:
    code = "import sys, autopersona_flows.testing as t; print(t.__all__, 'prefect' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == (
        "['Answering', 'Clarify', 'InMemoryMemoryStore', 'MemoryStoreConformance', 'Proceed', "
        "'Question', 'RecordingTool', 'ScriptedPolicy', 'ToolCall', 'UnansweredQuestionError', "
        "'UnscriptedNodeError', 'answering', 'assert_same_memories', 'recording_tool'] False"
    )


class TestPostgresDatabaseSearchConformance(TestPostgresConformance):
    """The same contract with searching in the database, whose writes keep its search columns.

    Its ranking against the JSONL store's: tests/memory/test_postgres_search.py.
    """

    @pytest.fixture
    def store(self, postgres_schema: str) -> Iterator[MemoryStore]:
        from autopersona_flows.memory.postgres import PostgresMemoryStore

        with PostgresMemoryStore(postgres_schema, search="database") as store:
            yield store

    @pytest.fixture
    def reopen(self, postgres_schema: str) -> Callable[[], MemoryStore]:
        from autopersona_flows.memory.postgres import PostgresMemoryStore

        return lambda: PostgresMemoryStore(postgres_schema, search="database")
