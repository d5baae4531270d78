"""Fixtures for the Prefect flow tests: recording tools (the server is ``prefect_harness``,
in ``tests/conftest.py``). The tools are module-level functions (importable, picklable): each
counts its calls per node id, keeps the `NodeContext` it received, and returns JSON.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import textwrap
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import pytest
from prefect.client.orchestration import get_client

from autopersona_flows.agent import PersonaAgent
from autopersona_flows.flows import NodeContext, PendingClarification, pending_clarifications
from autopersona_flows.memory import JsonlMemoryStore, MemoryRetriever

# --------------------------------------------------------------------------- harness


@pytest.fixture
def run_async() -> Callable[[Coroutine[Any, Any, Any]], Any]:
    """``asyncio.run``, for async flows; a test using it needs ``ignore:unclosed:ResourceWarning``.

    Prefect 3.9.1 leaves sockets of its async client open when the loop of an async
    flow run closes (an empty ``@flow async def`` does it), and ResourceWarning is an
    error here. The sockets are collected before the test ends, so the warnings
    that test ignores do not surface in another.
    """

    def run(coroutine: Coroutine[Any, Any, Any]) -> Any:
        try:
            return asyncio.run(coroutine)
        finally:
            gc.collect()

    return run


# --------------------------------------------------------------------------- tools

CALLS: Counter[str] = Counter()
CONTEXTS: dict[str, list[NodeContext]] = defaultdict(list)
_LOCK = threading.Lock()
BARRIER: list[threading.Barrier] = []  # the one the barrier tool waits on, set by a test
SECOND_CALL = threading.Event()  # set when a node's tool is called a second time


def _record(ctx: NodeContext) -> int:
    with _LOCK:
        CALLS[ctx.node.id] += 1
        CONTEXTS[ctx.node.id].append(ctx)
        return CALLS[ctx.node.id]


def _output(ctx: NodeContext) -> dict[str, Any]:
    return {
        "node": ctx.node.id,
        "guidance": ctx.guidance,
        "answer": ctx.answer,
        "inputs": sorted(ctx.inputs),
    }


def record_tool(ctx: NodeContext) -> dict[str, Any]:
    """Count the call, keep the context, return JSON describing what it saw."""
    _record(ctx)
    return _output(ctx)


def failing_tool(ctx: NodeContext) -> dict[str, Any]:
    """Always raises."""
    _record(ctx)
    raise RuntimeError(f"tool of {ctx.node.id} exploded")


def flaky_tool(ctx: NodeContext) -> dict[str, Any]:
    """Raises on the first call for its node, succeeds afterwards."""
    if _record(ctx) == 1:
        raise RuntimeError(f"transient failure in {ctx.node.id}")
    return _output(ctx)


def set_tool(ctx: NodeContext) -> Any:
    """Returns a set, which is not a JSON value."""
    _record(ctx)
    return {"not", "json"}


async def async_record_tool(ctx: NodeContext) -> dict[str, Any]:
    """`record_tool` as a coroutine, which yields to the event loop once."""
    await asyncio.sleep(0)
    _record(ctx)
    return _output(ctx)


async def sleeping_tool(ctx: NodeContext) -> dict[str, Any]:
    """Sleeps 30 s (without blocking its event loop): a timeout stops it."""
    _record(ctx)
    await asyncio.sleep(30)
    return _output(ctx)


def barrier_tool(ctx: NodeContext) -> dict[str, Any]:
    """Waits until another tool reaches the shared barrier (fails after its timeout)."""
    _record(ctx)
    BARRIER[0].wait()
    return _output(ctx)


def lingering_tool(ctx: NodeContext) -> dict[str, Any]:
    """Lingers up to 8 s for a second call of its node: runs that can both call it, do."""
    if _record(ctx) > 1:
        SECOND_CALL.set()
    else:
        SECOND_CALL.wait(8)
    return _output(ctx)


@dataclass
class FlowKit:
    """A fresh store and agent for one test, the tools, and what they recorded."""

    store: JsonlMemoryStore
    agent: PersonaAgent
    results: Path
    calls: Counter[str] = field(default_factory=lambda: CALLS)
    contexts: dict[str, list[NodeContext]] = field(default_factory=lambda: CONTEXTS)

    record = staticmethod(record_tool)
    arecord = staticmethod(async_record_tool)
    sleeps = staticmethod(sleeping_tool)
    failing = staticmethod(failing_tool)
    flaky = staticmethod(flaky_tool)
    returns_set = staticmethod(set_tool)
    waits_at_barrier = staticmethod(barrier_tool)
    lingers = staticmethod(lingering_tool)

    def barrier(self, parties: int, timeout: float) -> threading.Barrier:
        """The barrier `waits_at_barrier` waits on."""
        BARRIER[:] = [threading.Barrier(parties, timeout=timeout)]
        return BARRIER[0]


def _reset() -> None:
    CALLS.clear()
    CONTEXTS.clear()
    for barrier in BARRIER:
        barrier.abort()  # release a tool still waiting after a failed test
    BARRIER.clear()
    SECOND_CALL.clear()


@pytest.fixture
def kit(tmp_path: Path) -> Iterator[FlowKit]:
    _reset()
    store = JsonlMemoryStore(tmp_path / "store")
    yield FlowKit(
        store=store, agent=PersonaAgent(MemoryRetriever(store)), results=tmp_path / "results"
    )
    _reset()


# --------------------------------------------------------------------------- tool modules

_ALLOWED_TOOLS = """
import {forbidden} as forbidden  # reachable as '{allowed}:forbidden.record'
from {forbidden} import record  # a re-export: defined in {forbidden}, not here


def summarise(context):
    return {{"summary": "short", "node": context.node.id}}
"""

_FORBIDDEN = """
CALLS = []


def record(*args, **kwargs):
    CALLS.append(args)
    return "forbidden code ran"
"""


@dataclass
class ToolModules:
    """Importable modules for the tool allow-list, under fresh names.

    ``allowed`` (a module of package ``package``) defines the tool ``summarise`` and
    imports ``forbidden``, whose ``record`` appends to its ``CALLS`` when anything
    calls it; ``unimported`` has the same ``record`` and nothing imports it.
    """

    package: str
    allowed: str
    forbidden: str
    unimported: str

    def forbidden_calls(self) -> list[Any]:
        """What called ``record`` in ``forbidden`` or ``unimported``, imported or not."""
        return [
            *sys.modules[self.forbidden].CALLS,
            *(sys.modules[self.unimported].CALLS if self.unimported in sys.modules else []),
        ]


@pytest.fixture
def tool_modules(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> ToolModules:
    suffix = uuid4().hex
    modules = ToolModules(
        package=f"tools_{suffix}",
        allowed=f"tools_{suffix}.reading",
        forbidden=f"forbidden_{suffix}",
        unimported=f"unimported_{suffix}",
    )
    folder = tmp_path / "importable"
    (folder / modules.package).mkdir(parents=True)
    (folder / modules.package / "__init__.py").write_text("")
    (folder / modules.package / "reading.py").write_text(
        textwrap.dedent(_ALLOWED_TOOLS.format(forbidden=modules.forbidden, allowed=modules.allowed))
    )
    (folder / f"{modules.forbidden}.py").write_text(_FORBIDDEN)
    (folder / f"{modules.unimported}.py").write_text(_FORBIDDEN)
    monkeypatch.syspath_prepend(str(folder))
    __import__(modules.forbidden)  # so that forbidden_calls can always read it
    return modules


# --------------------------------------------------------------------------- resuming


class PausedRunWatcher(threading.Thread):
    """Waits (in its own thread) for a run to ask a question and hands it to ``on_paused``.

    It waits for `pending_clarifications`, not for the Paused state: Prefect sets the
    state before it saves the run's form, and an answer sent in between is refused.
    Assertions cannot fail a test from another thread, so whatever ``on_paused``
    raises is kept in ``error`` for the test to re-raise after `join`.
    """

    def __init__(
        self, on_paused: Callable[[PendingClarification], None], *, deadline: float = 120.0
    ) -> None:
        super().__init__(daemon=True)
        self.on_paused = on_paused
        self.deadline = deadline
        self.waiting: PendingClarification | None = None
        self.error: BaseException | None = None
        self.halt = threading.Event()

    def run(self) -> None:
        try:
            until = time.monotonic() + self.deadline
            while not self.halt.is_set() and time.monotonic() < until:
                pending = pending_clarifications()
                if pending:
                    self.waiting = pending[0]
                    self.on_paused(pending[0])
                    return
                time.sleep(0.1)
            if not self.halt.is_set():
                raise TimeoutError(f"no run asked a question within {self.deadline} s")
        except BaseException as exc:  # re-raised by the test in finish()
            self.error = exc

    def finish(self, timeout: float = 30.0) -> UUID:
        """Stop waiting, join, re-raise what went wrong; return the paused run's id."""
        self.halt.set()
        self.join(timeout)
        assert not self.is_alive(), "the resuming thread did not finish"
        if self.error is not None:
            raise self.error
        assert self.waiting is not None, "no run paused"
        return self.waiting.flow_run_id


@pytest.fixture
def watch_for_pause() -> Iterator[
    Callable[[Callable[[PendingClarification], None]], PausedRunWatcher]
]:
    """Start a `PausedRunWatcher`; any still running at teardown are stopped and joined."""
    started: list[PausedRunWatcher] = []

    def start(on_paused: Callable[[PendingClarification], None]) -> PausedRunWatcher:
        watcher = PausedRunWatcher(on_paused)
        started.append(watcher)
        watcher.start()
        return watcher

    yield start
    for watcher in started:
        watcher.halt.set()
        watcher.join(30)


@pytest.fixture
def settled_task_run() -> Callable[..., Any]:
    """`read_settled_task_run`, for tests that read task runs back from the API."""
    return read_settled_task_run


def read_settled_task_run(run_id: Any, timeout: float = 20.0) -> Any:
    """The task run as the API has it once recorded in a final state.

    Prefect records task runs from the events the engine sends, asynchronously: read
    right after the flow returns, a run may not be there yet, or not in its last state.
    """
    from prefect.exceptions import ObjectNotFound

    until = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        while True:
            try:
                run = client.read_task_run(run_id)
                if run.state is not None and run.state.is_final():
                    return run
            except ObjectNotFound:
                pass
            if time.monotonic() > until:
                raise TimeoutError(f"task run {run_id} was not recorded as final in {timeout} s")
            time.sleep(0.1)
