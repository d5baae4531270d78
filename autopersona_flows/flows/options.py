"""Prefect's task options on persona tasks: what passes through, the defaults, the task built."""

from __future__ import annotations

import inspect
import string
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, TypedDict, cast

from prefect import Task, task
from prefect.client.schemas.objects import State, TaskRun
from prefect.filesystems import WritableFileSystem
from prefect.tasks import RetryConditionCallable, StateHookCallable
from prefect.transactions import IsolationLevel

from autopersona_flows.errors import (
    AutopersonaError,
    FlowConfigurationError,
    StoreUnavailableError,
)
from autopersona_flows.flows.cache_policies import NodeCachePolicy
from autopersona_flows.flows.locks import step_locks
from autopersona_flows.flows.serializers import OrjsonSerializer

__all__ = [
    "DEFAULT_TASK_OPTIONS",
    "PersonaTaskOptions",
    "RetryUnlessOurs",
    "RunName",
    "build_task",
    "check_task_options",
]


class PersonaTaskOptions(TypedDict, total=False):
    """Prefect task options for the task that runs a persona function (or a graph node's tool).

    They go to ``prefect.task`` as they are, with two exceptions: ``retry_condition_fn``
    is asked only about the function's own failures and an unreachable store (see
    `RetryUnlessOurs`), and a
    ``task_run_name`` template is formatted with the function's arguments (see
    `RunName`). They configure the task that runs the function; the pre-hook's steps
    (``decide-…``, ``learn-…``) keep their own settings.

    Prefect's other options are ours, and refused (see `check_task_options`):
    ``cache_policy``, ``cache_key_fn``, ``persist_result``, ``result_serializer``,
    ``result_storage_key`` and ``cache_result_in_memory`` are what make a resumed run
    get results back instead of running again; ``name`` is the node id.
    """

    description: str
    """Shown in the UI; the function's docstring by default."""
    tags: Collection[str]
    """Tags of the task runs (Prefect's tag concurrency limits apply)."""
    version: str
    task_run_name: str | Callable[..., str]
    """A template formatted with the function's arguments (``"format-{style}"``), or a
    callable, given those arguments as ``parameters`` if it takes them."""
    retries: int
    """How often Prefect retries the function when it raises (0: never)."""
    retry_delay_seconds: float | list[float] | Callable[[int], list[float]]
    retry_jitter_factor: float
    retry_condition_fn: RetryConditionCallable
    """Asked whether to retry a failure of the function itself; ours never are."""
    timeout_seconds: float
    """Fails the run after this long. Reliable for ``async def`` functions; a sync one
    running in a worker thread (``.submit()``, ``.map()``, graph nodes) is stopped only
    after a blocking call returns."""
    log_prints: bool
    cache_expiration: timedelta
    """How long a result is reused: a replay after it expired runs the function again."""
    refresh_cache: bool
    """Run the function again even when a result is cached (and replace it)."""
    result_storage: Path | WritableFileSystem
    """Where the function's results go; the runtime's ``result_storage`` by default."""
    on_completion: list[StateHookCallable]
    on_failure: list[StateHookCallable]
    on_running: list[StateHookCallable]


DEFAULT_TASK_OPTIONS: PersonaTaskOptions = {
    "retries": 0,  # each attempt repeats the function's side effects: only when asked
}
"""The options every persona run task starts from; a task's own are merged over them
with ``|``."""


def _no(task: Any, task_run: TaskRun, state: State[Any]) -> bool:
    return False


PRE_HOOK_OPTIONS: PersonaTaskOptions = {
    "retries": 3,
    "retry_delay_seconds": 1,
    "retry_condition_fn": _no,  # so only a store outage is retried (see `RetryUnlessOurs`)
}
"""The options of the pre-hook's steps (``decide-…``, ``learn-…``): they read and
write the store, so a store outage is retried; nothing else is."""

_OURS = {
    "name": "it is the node id: pass `name=` to `persona_task`",
    "cache_policy": "NodeCachePolicy keys every step by episode, node and inputs, which is "
    "what lets a resumed run get results back instead of running the function again",
    "cache_key_fn": "see cache_policy",
    "persist_result": "results must be persisted for a resumed run to find them",
    "result_serializer": "results are JSON (OrjsonSerializer), never pickled",
    "result_storage_key": "the key is the cache key (see cache_policy)",
    "cache_result_in_memory": "results are read back from the result storage",
}


def check_task_options(options: Mapping[str, Any], where: str) -> PersonaTaskOptions:
    """Return ``options`` if they are `PersonaTaskOptions`, for the task named ``where``.

    Raises:
        FlowConfigurationError: For one of Prefect's options that persona tasks set
            themselves (with the reason), an unknown option, or a ``result_storage``
            given as a string.
    """
    for key in options:
        if key in _OURS:
            raise FlowConfigurationError(
                f"{where!r}: persona tasks set Prefect's {key!r} themselves: {_OURS[key]}"
            )
        if key not in PersonaTaskOptions.__annotations__:
            known = ", ".join(sorted(PersonaTaskOptions.__annotations__))
            raise FlowConfigurationError(f"{where!r}: unknown task option {key!r}; known: {known}")
    if isinstance(options.get("result_storage"), str):
        raise FlowConfigurationError(
            f"{where!r}: result_storage must be a Path or a file-system block; Prefect reads a "
            "str as a block slug, not a folder"
        )
    template = options.get("task_run_name")
    if template is not None and not isinstance(template, str) and not callable(template):
        raise FlowConfigurationError(
            f"{where!r}: task_run_name must be a template string or a callable, "
            f"not {type(template).__name__}"
        )
    return cast(PersonaTaskOptions, dict(options))  # its keys are checked above


@dataclass(frozen=True)
class RetryUnlessOurs:
    """The ``retry_condition_fn`` of persona run tasks: retry the function's failures only.

    Ours (a non-JSON argument or output, a bad configuration, a policy breaking its
    promise) would fail again the same way, and each attempt would repeat the
    function's side effects. A store that was unreachable (`StoreUnavailableError`)
    is always worth the retries: the next attempt may find it back. For any other
    failure the user's condition decides, if there is one.

    Attributes:
        then: The user's ``retry_condition_fn``, if any.
    """

    then: RetryConditionCallable | None = None

    def __call__(self, task: Any, task_run: TaskRun, state: State[Any]) -> bool | Awaitable[bool]:
        """Whether Prefect should retry after ``state`` (a failure); awaitable in an async task."""
        failure = state.result(raise_on_failure=False)  # the error, not raised
        if inspect.isawaitable(failure):  # in an async task; Prefect awaits what we return
            return self._after(failure, task, task_run, state)
        return self._decide(failure, task, task_run, state)

    async def _after(
        self, failure: Awaitable[Any], task: Any, task_run: TaskRun, state: State[Any]
    ) -> bool:
        retry = self._decide(await failure, task, task_run, state)
        return await retry if inspect.isawaitable(retry) else retry

    def _decide(
        self, failure: Any, task: Any, task_run: TaskRun, state: State[Any]
    ) -> bool | Awaitable[bool]:
        if isinstance(failure, StoreUnavailableError):
            return True  # the store may be back; nothing of the step ran
        if isinstance(failure, AutopersonaError):
            return False
        return True if self.then is None else self.then(task, task_run, state)


@dataclass(frozen=True)
class RunName:
    """The ``task_run_name`` of a run task: the node id, or the user's, from the arguments.

    Prefect calls it with the task's parameters, whose ``resolved`` hold the function's
    resolved ``arguments`` and whose ``inputs``, for an element of a ``.map()``, its
    ``element`` index (named ``<node>[<index>]`` by default).

    Attributes:
        base: The default name.
        template: The user's ``task_run_name``: a template formatted with the arguments,
            or a callable (given them as ``parameters`` if it takes them).
    """

    base: str
    template: str | Callable[..., str] | None = None

    def __call__(self, parameters: dict[str, Any]) -> str:
        """The name of one run, from the task's ``parameters``."""
        if self.template is None:
            element = (parameters.get("inputs") or {}).get("element")
            return self.base if element is None else f"{self.base}[{element}]"
        arguments = (parameters.get("resolved") or {}).get("arguments") or {}
        if isinstance(self.template, str):
            return self.template.format(**arguments)
        if "parameters" in inspect.signature(self.template).parameters:
            return self.template(parameters=arguments)
        return self.template()

    def check(self, names: Collection[str], where: str) -> None:
        """Refuse a template naming a field that is not an argument in ``names``.

        Raises:
            FlowConfigurationError: If it does; Prefect would fail each run instead.
        """
        if not isinstance(self.template, str):
            return
        for _, field, _, _ in string.Formatter().parse(self.template):
            if field is not None and field.split(".")[0].split("[")[0] not in names:
                raise FlowConfigurationError(
                    f"{where!r}: task_run_name {self.template!r} names {field!r}, which is "
                    f"not an argument of the function ({', '.join(names) or 'it takes none'})"
                )


_TASKS: dict[tuple[Any, ...], Task] = {}


def _hashable(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, set | frozenset):
        return frozenset(value)
    return value


def build_task(
    fn: Callable[..., Any],
    kind: str,
    name: str,
    storage: Any,
    options: PersonaTaskOptions,
    *,
    run_name: RunName | None,
    locked: bool = True,
) -> Task:
    """The Prefect task of one persona step, built once per process for each name and options.

    The step's ``options`` pass through; its cache policy, persistence, serializer and
    storage are ours (see `PersonaTaskOptions`), and its retry condition `RetryUnlessOurs`.
    A ``locked`` step is ``SERIALIZABLE`` (see `step_locks`): of two runs of one
    episode at once, the second waits for the first's result instead of running the
    step too (Prefect's cache does not lock). Only runs sharing an episode id need it.
    """
    try:
        key: tuple[Any, ...] | None = (
            fn,
            kind,
            name,
            storage,
            run_name,
            locked,
            tuple(sorted((k, _hashable(v)) for k, v in options.items())),
        )
        hash(key)
    except TypeError:  # blocks, and options holding unhashable values, are built each time
        key = None
    built = _TASKS.get(key) if key is not None else None
    if built is not None:
        return built
    keywords: dict[str, Any] = {
        **options,
        "name": name,
        "task_run_name": run_name or name,
        "cache_policy": (
            NodeCachePolicy(
                kind=kind,
                isolation_level=IsolationLevel.SERIALIZABLE,
                lock_manager=step_locks(storage),
            )
            if locked
            else NodeCachePolicy(kind=kind)
        ),
        "persist_result": True,
        "result_serializer": OrjsonSerializer(),
        "result_storage": storage,
        "retry_condition_fn": RetryUnlessOurs(options.get("retry_condition_fn")),
    }
    built = task(**keywords)(fn)
    if key is not None:
        if len(_TASKS) >= 4096:  # bound a long-lived worker running many graphs
            _TASKS.clear()
        _TASKS[key] = built
    return built
