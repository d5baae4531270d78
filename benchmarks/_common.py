"""Helpers shared by the benchmark scripts (run as ``python benchmarks/NAME.py``)."""

from __future__ import annotations

import argparse
import io
import math
import os
import platform
import re
import shlex
import sys
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, TextIO, TypeVar

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


# -- benchmarks/RESULTS.md -----------------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
RESULTS_ENV = "AUTOPERSONA_BENCH_RESULTS"
"""A path to record into instead of ``RESULTS``, or ``off`` not to record (a trial run)."""
_SECTION = re.compile(r"[a-z][-_0-9a-z]*")


def _markers(name: str) -> tuple[str, str]:
    # pymdownx.snippets section markers inside HTML comments: invisible on GitHub, and
    # the docs include a section with --8<-- "benchmarks/RESULTS.md:NAME".
    return f"<!-- --8<-- [start:{name}] -->", f"<!-- --8<-- [end:{name}] -->"


def machine() -> str:
    """This machine in one line: system, CPUs (and how many this process may use), Python."""
    cpus = os.cpu_count()
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cpus
    count = f"{cpus} CPUs" + (f" ({usable} usable)" if usable != cpus else "")
    return f"{platform.system()} {platform.machine()}, {count}, Python {platform.python_version()}"


def load() -> str:
    """The 1-minute load average, or ``n/a`` where the system keeps none."""
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except (AttributeError, OSError):
        return "n/a"


def record_results(
    name: str,
    command: str,
    text: str,
    *,
    note: str | None = None,
    path: Path | None = None,
    now: datetime | None = None,
) -> Path | None:
    """Write one benchmark's section of ``RESULTS.md``, replacing what it held.

    A section lies between the markers of ``name``; one not in the file yet is added
    at its end under a ``## name`` heading. The rest of the file is kept as it was.

    Args:
        name: The section: lower case letters, digits, ``-`` and ``_``.
        command: What was run, as a shell would take it.
        text: What the benchmark printed: its tables.
        note: The rest of the header line after the machine (the load average now
            if not given).
        path: The file; ``$AUTOPERSONA_BENCH_RESULTS`` or ``benchmarks/RESULTS.md``
            if not given.
        now: When it was recorded (now, in UTC, if not given).

    Returns:
        The file written, or None if ``$AUTOPERSONA_BENCH_RESULTS`` is ``off``.

    Raises:
        ValueError: If ``name`` cannot be a section's name.
    """
    if not _SECTION.fullmatch(name):
        raise ValueError(f"section name {name!r}: use lower case letters, digits, - and _")
    if path is None:
        chosen = os.environ.get(RESULTS_ENV, "")
        if chosen == "off":
            return None
        path = Path(chosen) if chosen else RESULTS
    when = (now or datetime.now(UTC)).strftime("%Y-%m-%d %H:%M UTC")
    note = note if note is not None else f"load average {load()}"
    start, end = _markers(name)
    body = (
        f"{start}\nRecorded {when} on {machine()}; {note}.\n\n"
        f"```bash\n{command}\n```\n\n```text\n{text.strip()}\n```\n{end}"
    )
    old = path.read_text(encoding="utf-8") if path.exists() else "# Benchmark results\n"
    before, found, rest = old.partition(start)
    if found and end in rest:
        new = before + body + rest.split(end, 1)[1]
    else:
        new = f"{old.rstrip()}\n\n## {name}\n\n{body}\n"
    # Whole or not at all: a benchmark interrupted while writing leaves the old file.
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(new, encoding="utf-8")
    tmp.replace(path)
    return path


class _Tee:
    """Stdout that also keeps a copy of what is written."""

    def __init__(self, out: TextIO) -> None:
        self.out, self.copy = out, io.StringIO()

    def write(self, text: str) -> int:
        self.copy.write(text)
        return self.out.write(text)

    def __getattr__(self, name: str) -> object:
        return getattr(self.out, name)


def section_name(name: str, argv: Sequence[str], keyed_by: Sequence[str] = ()) -> str:
    """``name``, followed by the value of each option of ``keyed_by`` given in ``argv``.

    ``section_name("flow_overhead", ["--tool-ms", "20"], ["--tool-ms"])`` is
    ``flow_overhead-tool-ms-20``: runs of another configuration keep their own section.
    """
    parts = [name]
    for option in keyed_by:
        for i, arg in enumerate(argv):
            if arg == option and i + 1 < len(argv):
                value = argv[i + 1]
            elif arg.startswith(f"{option}="):
                value = arg.split("=", 1)[1]
            else:
                continue
            parts.append(f"{option.lstrip('-')}-{re.sub(r'[^-_0-9a-z]', '_', value.lower())}")
    return "-".join(parts)


def recorded(name: str, main: Callable[[], int], *, keyed_by: Sequence[str] = ()) -> int:
    """Run a benchmark's ``main`` and record what it printed in ``RESULTS.md``.

    What ``main`` prints appears as before. A run that raises records nothing; the
    exit code is returned unchanged, and recorded: a benchmark exits 1 when it
    misses its bar, which is a result too.

    Args:
        name: The benchmark's section (its script's name).
        main: Parses ``sys.argv`` and runs; returns the exit code.
        keyed_by: Options whose value gets a section of its own (see `section_name`).
    """
    argv = sys.argv[1:]
    script = Path(sys.argv[0]).resolve()
    shown = script.relative_to(ROOT) if script.is_relative_to(ROOT) else script
    load_before = load()
    tee = _Tee(sys.stdout)
    sys.stdout = tee  # type: ignore[assignment]  # what print needs: write and flush
    try:
        code = main()
    finally:
        sys.stdout = tee.out
    written = record_results(
        section_name(name, argv, keyed_by),
        shlex.join(["python", str(shown), *argv]),
        tee.copy.getvalue(),
        note=f"load average {load_before} at the start, {load()} at the end; exit code {code}",
    )
    if written is not None:
        progress(f"recorded in {written}")
    return code
