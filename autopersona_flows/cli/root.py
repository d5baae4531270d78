"""The ``autopersona`` Typer app, its entry point and what every command shares.

Commands print counts and digests, never memory contents, so their output is safe
to paste into a ticket or a CI log; only ``autopersona memories`` shows contents,
because a person asked for them.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from autopersona_flows.errors import AutopersonaError, MemoryStoreError
from autopersona_flows.memory.protocol import MemoryStore
from autopersona_flows.memory.stores import is_postgres, open_store

__all__ = [
    "EMBEDDER_HELP",
    "STORE_HELP",
    "Steps",
    "app",
    "console",
    "existing_store",
    "main",
]

_T = TypeVar("_T")

EMBEDDER_HELP = "semantic (default: the shipped encoder), hashing, minilm, or package.module:attr"
STORE_HELP = "jsonl:FOLDER (or a folder) or postgresql://user:password@host:port/db"

app = typer.Typer(
    name="autopersona",
    help="Manage autopersona-flows memory stores: look at, correct, move and check "
    "what the assistant remembers of each person.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def console(*, stderr: bool = False) -> Console:
    """A Rich console on stdout (or stderr), as wide as a table needs off a terminal.

    Made per use, not at import: tests and callers swap ``sys.stdout``.
    """
    out = Console(stderr=stderr)
    # Piped into a file or a CI log, Rich would wrap tables at 80 columns.
    return out if out.is_terminal else Console(stderr=stderr, width=160)


def existing_store(address: str | Path) -> MemoryStore:
    """The store at ``address``, which must exist (a JSONL folder is not created).

    Raises:
        MemoryStoreError: If a JSONL store's folder does not exist.
    """
    if not is_postgres(address):
        root = Path(str(address).removeprefix("jsonl:"))
        if not root.is_dir():
            raise MemoryStoreError(f"no memory store at {root}: the folder does not exist")
    return open_store(address)


class Steps:
    """Progress through ``total`` steps: a Rich bar on a terminal, else lines on stderr.

    Off a terminal (a CI log, a pipe) long work still says how far it got: a line
    ``"  done/total unit (pct%)"`` every twentieth of the way, from 100 steps on.
    Print results after the block: while it runs, the bar holds the terminal.

    Args:
        description: What is being done, beside the bar.
        total: How many steps; ``None`` for work that cannot say (a pulsing bar).
        unit: What a step is, in the lines (``"tasks"``, ``"users"``).
    """

    def __init__(self, description: str, total: int | None, unit: str) -> None:
        self.total, self.unit, self.done = total, unit, 0
        err = Console(stderr=True)
        self._bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=err,
            # Results go to stdout after the bar: redirected into the bar's console they
            # would land on stderr, or on the terminal of a command piped into a file.
            redirect_stdout=False,
            redirect_stderr=False,
            transient=True,
            disable=not err.is_terminal,
        )
        self._task = self._bar.add_task(description, total=total)
        self._lines = not err.is_terminal and total is not None and total >= 100
        self._every = max(1, (total or 0) // 20)

    def __enter__(self) -> Steps:
        self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._bar.stop()

    def advance(self) -> None:
        """One more step done."""
        self.done += 1
        self._bar.advance(self._task)
        if self._lines and self.total and (self.done % self._every == 0 or self.done == self.total):
            percent = 100 * self.done // self.total
            print(f"  {self.done}/{self.total} {self.unit} ({percent}%)", file=sys.stderr)

    def over(self, items: Iterable[_T]) -> Iterator[_T]:
        """Yield ``items``, one step each (counted once the caller is done with it)."""
        for item in items:
            yield item
            self.advance()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit code (0 ok, 1 failed, 2 usage).

    The commands are those registered on `app`: importing ``autopersona_flows.cli``
    registers them all.
    """
    # What the library warns about (e.g. a corrupt file a restore set aside) is for the
    # person at the terminal, whether or not anything configured logging.
    warnings = logging.StreamHandler(sys.stderr)
    warnings.setLevel(logging.WARNING)
    warnings.setFormatter(logging.Formatter("warning: %(message)s"))
    logger = logging.getLogger("autopersona_flows")
    logger.addHandler(warnings)
    command = typer.main.get_command(app)
    try:
        # Standalone: usage errors are drawn (Rich's panel, as Prefect's CLI shows them)
        # and exit 2, --help exits 0; errors of ours pass through to be said plainly.
        command(
            args=list(sys.argv[1:] if argv is None else argv),
            prog_name="autopersona",
            standalone_mode=True,
        )
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
    except AutopersonaError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # the file system said no: say what and where, no traceback
        where = f" ({exc.filename})" if exc.filename else ""
        print(f"error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 1
    finally:
        logger.removeHandler(warnings)
    return 0
