"""Helpers shared by the benchmark scripts (run as ``python benchmarks/NAME.py``)."""

from __future__ import annotations

import argparse
import math
import os
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:  # the package is imported by the scripts that use it, not by every script
    from autopersona_flows.memory.protocol import MemoryStore

T = TypeVar("T")


def progress(message: str) -> None:
    """Report progress on stderr, keeping stdout for the results."""
    print(message, file=sys.stderr, flush=True)


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0-1) of ``values``, linearly interpolated."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    low, high = math.floor(pos), math.ceil(pos)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def parse_sizes(text: str) -> list[int]:
    """Parse ``--sizes 1000,10000``: positive and strictly increasing."""
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of integers: {text!r}"
        ) from None
    if not sizes or any(size <= 0 for size in sizes) or sizes != sorted(set(sizes)):
        raise argparse.ArgumentTypeError("sizes must be positive and strictly increasing")
    return sizes


# -- the PostgreSQL sections ---------------------------------------------------------------

POSTGRES_ENV = "AUTOPERSONA_TEST_POSTGRES_DSN"
BACKENDS = ("jsonl", "postgres")
NAMES = {"jsonl": "JSONL", "postgres": "Postgres"}


class PostgresSkipped(Exception):  # noqa: N818 - it is a reason, not an error
    """The PostgreSQL section cannot run here; the message says why, in one line."""


def add_postgres_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--postgres DSN``, defaulting to the test database of the environment."""
    parser.add_argument(
        "--postgres",
        metavar="DSN",
        default=os.environ.get(POSTGRES_ENV) or None,
        help=f"PostgreSQL to compare against (default: ${POSTGRES_ENV}); "
        "its tables go in a fresh schema, dropped at the end",
    )


def print_skipped(reason: PostgresSkipped) -> None:
    """Say in one line why the PostgreSQL section did not run."""
    print(f"PostgreSQL: skipped ({reason})")


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())


def _in_schema(dsn: str, schema: str) -> str:
    """``dsn`` with ``schema`` as its search path; a URL stays a URL."""
    if "://" in dsn:
        separator = "&" if "?" in dsn else "?"
        return f"{dsn}{separator}options=-csearch_path%3D{schema}"
    from psycopg.conninfo import make_conninfo

    return make_conninfo(dsn, options=f"-csearch_path={schema}")


@contextmanager
def postgres_schema(dsn: str | None, prefix: str) -> Iterator[tuple[str, str]]:
    """Create a fresh schema and drop it on the way out, also when the block fails.

    Args:
        dsn: The database, or None when none was given.
        prefix: The start of the schema's name (a random suffix follows).

    Yields:
        The DSN with the schema as its search path, and where it is (host/dbname,
        without the password) for the report.

    Raises:
        PostgresSkipped: Without a DSN, without psycopg, or if the database cannot
            be reached or refuses the schema.
    """
    if not dsn:
        raise PostgresSkipped(f"no database: pass --postgres DSN or set {POSTGRES_ENV}")
    try:
        import psycopg
        from psycopg import sql
    except ImportError:
        raise PostgresSkipped(
            "psycopg is not installed: pip install 'autopersona-flows[postgres]'"
        ) from None
    schema = f"{prefix}_{uuid.uuid4().hex[:12]}"
    name = sql.Identifier(schema)
    try:
        info = psycopg.conninfo.conninfo_to_dict(dsn)
        where = f"{info.get('host', 'localhost')}/{info.get('dbname', '')}"
        with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(name))
    except psycopg.Error as exc:
        raise PostgresSkipped(f"cannot use the database: {_one_line(exc)}") from None
    try:
        yield _in_schema(dsn, schema), where
    finally:
        try:
            with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
                conn.execute("SET lock_timeout = '10s'")
                conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(name))
        except psycopg.Error as exc:
            progress(f"could not drop schema {schema}: {_one_line(exc)}; drop it by hand")


def open_store(backend: str, target: str) -> MemoryStore:
    """A new store object: ``target`` is a JSONL folder or a PostgreSQL DSN."""
    if backend == "postgres":
        from autopersona_flows.memory.postgres import PostgresMemoryStore

        return PostgresMemoryStore(target)
    from autopersona_flows.memory.jsonl import JsonlMemoryStore

    return JsonlMemoryStore(target)


def close_store(store: MemoryStore) -> None:
    """Close the store's connections, if it has any."""
    close = getattr(store, "close", None)
    if close is not None:
        close()


def alternating(items: dict[str, T], i: int) -> list[tuple[str, T]]:
    """``items`` in order in even rounds, reversed in odd ones: neither always goes first."""
    pairs = list(items.items())
    return pairs if i % 2 == 0 else pairs[::-1]
