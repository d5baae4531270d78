"""The ``autopersona`` Typer app, its entry point and what every command shares.

Commands print counts and digests, never memory contents, so their output is safe
to paste into a ticket or a CI log; only ``autopersona memories`` shows contents,
because a person asked for them. A store's password is never printed.

Every command works on the store deployments use (the ``store`` setting, else
``$PREFECT_HOME/autopersona/memory``) unless ``--store`` names another; the store
given as a first argument, as before ``--store`` existed, still works.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any, TypeVar
from urllib.parse import urlsplit

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from typer.core import TyperCommand

from autopersona_flows.errors import AutopersonaError, MemoryStoreError
from autopersona_flows.memory.protocol import MemoryStore
from autopersona_flows.memory.stores import is_postgres, open_store

__all__ = [
    "EMBEDDER_HELP",
    "STORE_HELP",
    "OldStore",
    "Steps",
    "StoreCommand",
    "StoreOption",
    "app",
    "console",
    "existing_store",
    "main",
    "shown",
    "store_address",
    "store_and",
]

_T = TypeVar("_T")

EMBEDDER_HELP = "semantic (default: the shipped encoder), hashing, minilm, or package.module:attr"
STORE_HELP = "jsonl:FOLDER (or a folder) or postgresql://user:password@host:port/db"
_SETTING = "PREFECT_INTEGRATIONS_AUTOPERSONA_STORE"

StoreOption = Annotated[
    str | None,
    typer.Option(
        "--store",
        metavar="STORE",
        help=f"The memory store: {STORE_HELP}. Default: the store deployments use, the "
        f"{_SETTING} setting (environment, prefect.toml or pyproject.toml), else "
        "$PREFECT_HOME/autopersona/memory.",
        show_default=False,
    ),
]
"""``--store``: `store_and` or `store_address` turn it into the store's address."""

OldStore = Annotated[str | None, typer.Argument(hidden=True, metavar="STORE", show_default=False)]
"""One positional argument more than a command's usage shows: the store, as scripts
written before ``--store`` give it first (``autopersona memories STORE USER``)."""

app = typer.Typer(
    name="autopersona",
    help="Manage autopersona-flows memory stores: look at, correct, move and check "
    "what the assistant remembers of each person. Commands work on the store "
    "deployments use (PREFECT_INTEGRATIONS_AUTOPERSONA_STORE, else "
    "$PREFECT_HOME/autopersona/memory) unless --store names another.",
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


class StoreCommand(TyperCommand):
    """A command whose usage line leaves out its hidden argument (`OldStore`).

    Click lists hidden arguments in the usage line; the old positional store is
    accepted, not advertised.
    """

    # ctx is Click's Context, which Typer 0.29 vendors (typer._click) and older Typers
    # import: Any, rather than a private module's class.
    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        """The options' placeholder, then each argument's, hidden ones left out."""
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if not getattr(param, "hidden", False):
                pieces.extend(param.get_usage_pieces(ctx))
        return pieces


def store_address(option: str | None, old: str | None = None) -> str:
    """The address of the store a command works on.

    The one given (``--store``, or the old positional argument), else the store
    setting as Prefect reads it, else ``$PREFECT_HOME/autopersona/memory``: the
    store deployments use. A store not given is announced on stderr, with where it
    came from, so that a person knows which store was read or written.

    Raises:
        typer.BadParameter: If the store is given both ways.
        FlowConfigurationError: If a setting has an invalid value.
    """
    if option is not None and old is not None:
        raise typer.BadParameter(
            f"the store is given twice, as {shown(old)} and as --store {shown(option)}",
            param_hint="--store",
        )
    given = option if option is not None else old
    if given is not None:
        return given
    # Imported here: Prefect's settings cost a second to import, which a command given
    # --store, and --help, never pay.
    from autopersona_flows.flows.settings import load_settings  # noqa: PLC0415

    settings = load_settings()
    address = settings.store_address()
    if settings.store is None:
        origin = f"the default: {_SETTING} is not set; --store names another"
    else:
        origin = f"the {_SETTING} setting"
    print(f"store: {shown(address)} ({origin})", file=sys.stderr)
    return address


def store_and(
    option: str | None, arguments: Sequence[str], extra: str | None
) -> tuple[str, list[str]]:
    """The store's address and a command's other arguments, however the store was given.

    Args:
        option: ``--store``.
        arguments: The positional arguments the command's usage shows, as parsed.
        extra: `OldStore`'s: one argument more, set only when the store came first
            as before ``--store`` (``memories STORE USER`` parses as user ``STORE``
            and ``USER`` more); every argument then moves up by one.

    Returns:
        The address (see `store_address`) and the command's arguments, in order.
    """
    if extra is None:
        return store_address(option), list(arguments)
    old, *rest = arguments
    return store_address(option, old), [*rest, extra]


def shown(address: str | Path) -> str:
    """``address`` as it may be printed: a PostgreSQL URL's password as ``***``."""
    text = str(address)
    if not is_postgres(text):
        return text
    parts = urlsplit(text)
    netloc = parts.netloc
    if parts.password is not None:
        credentials, _, host = netloc.rpartition("@")
        netloc = f"{credentials.partition(':')[0]}:***@{host}"
    query = re.sub(r"(^|&)password=[^&]*", r"\1password=***", parts.query)
    return parts._replace(netloc=netloc, query=query).geturl()


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
