"""How a flow finds its PersonaAgent: the runtime of a `persona_runtime` block, or the settings'.

A run with no block (one started from a deployment) gets its runtime from
`AutopersonaSettings`. This module builds on ``settings.py``, never the other way
round; what a tool receives is in ``context.py``, which needs neither.
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal
from uuid import UUID

from prefect.context import FlowRunContext
from prefect.filesystems import WritableFileSystem
from prefect.futures import PrefectFuture

from autopersona_flows.agent.agent import PersonaAgent
from autopersona_flows.errors import FlowConfigurationError
from autopersona_flows.flows.reports import StepCounter
from autopersona_flows.flows.settings import (
    AutopersonaSettings,
    PauseMode,
    agent_from_settings,
    load_settings,
)
from autopersona_flows.memory.bank import MemoryBank

__all__ = [
    "PersonaRuntime",
    "current_flow_run_id",
    "current_runtime",
    "persona_runtime",
    "runtime_from_settings",
]


@dataclass
class _RunState:
    futures: list[PrefectFuture[Any]] = field(default_factory=list)
    settling: threading.RLock = field(default_factory=threading.RLock)
    counter: StepCounter = field(default_factory=StepCounter)


class InFlight:
    """What the persona tasks of each flow run of a `persona_runtime` block share.

    The runs they submitted and have not seen finish: a question waits for them
    before it pauses or suspends (see `Settler.settle`), so a suspended run loses no
    work in flight. One settling at a time, and one count of the questions asked
    (the run's ``question_budget``). The latest `_RUNS_KEPT` flow runs are kept.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: OrderedDict[UUID, _RunState] = OrderedDict()

    def _of(self, flow_run_id: UUID) -> _RunState:
        with self._lock:
            state = self._runs.get(flow_run_id)
            if state is None:
                state = self._runs[flow_run_id] = _RunState()
                if len(self._runs) > _RUNS_KEPT:
                    self._runs.popitem(last=False)
            return state

    @contextlib.contextmanager
    def settling(self, flow_run_id: UUID) -> Iterator[None]:
        """Settle one persona task of ``flow_run_id`` at a time.

        Async persona tasks awaited together (``asyncio.gather``) run their pre-hooks
        in threads at once; a run waits on one form at a time, so the second asks
        once the first has its answer (and may find it needs none).
        """
        with self._of(flow_run_id).settling:
            yield

    def counter(self, flow_run_id: UUID) -> StepCounter:
        """The count of the decisions and questions of ``flow_run_id``'s persona tasks."""
        return self._of(flow_run_id).counter

    def add(self, flow_run_id: UUID, futures: Sequence[PrefectFuture[Any]]) -> None:
        """Note ``futures`` as submitted by ``flow_run_id`` (and forget what finished)."""
        state = self._of(flow_run_id)
        with self._lock:
            state.futures[:] = [f for f in state.futures if not _done(f)] + list(futures)

    def of(self, flow_run_id: UUID) -> list[PrefectFuture[Any]]:
        """What ``flow_run_id`` submitted and has not seen finish."""
        state = self._of(flow_run_id)
        with self._lock:
            return list(state.futures)


_RUNS_KEPT = 64  # flow runs at once in one process; an evicted one is long over


def _done(future: PrefectFuture[Any]) -> bool:
    wrapped = getattr(future, "wrapped_future", None)  # a thread's or Dask's future
    return wrapped is None or bool(wrapped.done())


@dataclass(frozen=True)
class PersonaRuntime:
    """The live parts and options of persona-aware runs (never flow parameters).

    Attributes:
        agent: Decides for each node and learns answers.
        user_id: The user of `persona_task` calls (graph runs pass their own).
        query: The request of `persona_task` calls.
        pause_mode: How to wait for an answer; see `PauseMode`.
        pause_timeout: Seconds to wait for an answer before the run fails.
        poll_interval: Seconds between checks while paused (Prefect's default is 10).
        result_storage: Where node results are persisted (a folder or a Prefect
            file-system block); Prefect's default storage if ``None``. Every
            worker that may resume a run must see it.
        episode_id: Ties cache keys to one episode (default: the flow run's id).
        on_timeout: What a run does when nobody answers within ``pause_timeout``:
            ``"fail"`` (raise `ClarificationTimeoutError`), or ``"default"``: run with
            each unanswered requirement's declared ``default``, recorded as such and
            never learned (a requirement without one still fails the run).
        question_budget: The most questions one run may ask (``None``: no limit).
            Past it, a missing requirement with a ``default`` runs with it; one
            without fails the run (`ClarificationBudgetError`).
        in_flight: What the block's persona tasks share, by flow run (`InFlight`);
            nested blocks share it.
    """

    agent: PersonaAgent
    user_id: str | None = None
    query: str = ""
    pause_mode: PauseMode = "auto"
    pause_timeout: int = 3600
    poll_interval: float = 1.0
    result_storage: Path | WritableFileSystem | None = None
    episode_id: str | None = None
    on_timeout: Literal["fail", "default"] = "fail"
    question_budget: int | None = None
    in_flight: InFlight = field(default_factory=InFlight, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.agent, PersonaAgent):
            raise FlowConfigurationError(f"agent must be a PersonaAgent, got {self.agent!r}")
        if self.pause_mode not in ("auto", "pause", "suspend"):
            raise FlowConfigurationError(
                f"pause_mode must be auto, pause or suspend: {self.pause_mode!r}"
            )
        if self.on_timeout not in ("fail", "default"):
            raise FlowConfigurationError(f"on_timeout must be fail or default: {self.on_timeout!r}")
        if self.question_budget is not None and self.question_budget < 0:
            raise FlowConfigurationError(
                f"question_budget must be a count of questions: {self.question_budget!r}"
            )
        if self.pause_timeout <= 0 or self.poll_interval <= 0:
            raise FlowConfigurationError("pause_timeout and poll_interval must be positive")
        if isinstance(self.result_storage, str):
            raise FlowConfigurationError(
                "result_storage must be a Path or a file-system block; Prefect reads a str as "
                "a block slug, not a folder"
            )

    @property
    def bank(self) -> MemoryBank:
        """The agent's memory: its store, embedder, retriever and updater."""
        return self.agent.bank


_RUNTIME: ContextVar[PersonaRuntime | None] = ContextVar("autopersona_runtime", default=None)


@contextlib.contextmanager
def persona_runtime(agent: PersonaAgent | None = None, **options: Any) -> Iterator[PersonaRuntime]:
    """Provide the PersonaAgent (and options) to persona tasks and graphs in this block.

    Nested blocks inherit what they do not set, like Prefect's ``tags``::

        with persona_runtime(agent, user_id="ada", query="Finish my paper"):
            my_flow()

    Args:
        agent: The agent; inherited from an enclosing block, or built from the
            settings (see `current_runtime`), if omitted.
        **options: Any other field of `PersonaRuntime`.
    """
    outer = _RUNTIME.get()
    if agent is None:
        runtime = replace(current_runtime(), **options)
    else:
        base = {} if outer is None else {k: v for k, v in vars(outer).items() if k != "agent"}
        runtime = PersonaRuntime(agent=agent, **(base | options))
    token = _RUNTIME.set(runtime)
    try:
        yield runtime
    finally:
        _RUNTIME.reset(token)


def current_runtime() -> PersonaRuntime:
    """The innermost `persona_runtime` block's runtime, else one built from the settings.

    Runs started from a deployment have no caller to open a block, so they get their
    agent and options from `AutopersonaSettings` (``PREFECT_INTEGRATIONS_AUTOPERSONA_*``).

    Raises:
        FlowConfigurationError: If there is no block and the settings are invalid.
        EmbedderError: If there is no block and the embedder setting names none.
    """
    runtime = _RUNTIME.get()
    return runtime_from_settings() if runtime is None else runtime


def runtime_from_settings(settings: AutopersonaSettings | None = None) -> PersonaRuntime:
    """The runtime a run uses when no `persona_runtime` block configures one.

    Raises:
        FlowConfigurationError: If a setting has an invalid value or names a policy
            that cannot be built.
        EmbedderError: If the embedder setting names no embedder.
    """
    settings = settings or load_settings()
    return PersonaRuntime(
        agent=agent_from_settings(settings),
        pause_mode=settings.pause_mode,
        pause_timeout=settings.pause_timeout,
        poll_interval=settings.poll_interval,
        on_timeout=settings.on_timeout,
        question_budget=settings.question_budget,
        result_storage=settings.results.expanduser() if settings.results else None,
    )


def current_flow_run_id() -> UUID:
    """The id of the flow run this code runs in.

    Raises:
        FlowConfigurationError: Outside a Prefect flow run.
    """
    context = FlowRunContext.get()
    if context is None or context.flow_run is None:
        raise FlowConfigurationError("persona tasks must be called inside a Prefect flow")
    return context.flow_run.id
