"""Prefect functions that dispatch on their context, called from sync code in any flow."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar, cast

# Private, but it is the test those functions dispatch on: any other could disagree.
from prefect._internal.compatibility.async_dispatch import is_in_async_context
from prefect.utilities.asyncutils import run_coro_as_sync

__all__ = ["blocking"]

P = ParamSpec("P")
R = TypeVar("R")


def blocking(fn: Callable[P, R | Coroutine[Any, Any, R]]) -> Callable[P, R]:
    """``fn`` run to completion, in a sync or an async flow alike.

    ``pause_flow_run``, ``create_markdown_artifact`` and their like return a
    coroutine whenever the run they are called in is async, even from sync code in
    a worker thread; and their sync implementations call other such functions
    (``pause_flow_run`` saves its form with ``RunInput.save``), whose coroutines
    nobody would await. The pre-hook of a persona task is sync wherever it runs, so
    in an async run it runs the async implementation (Prefect's ``fn.aio``) to
    completion on Prefect's own loop thread.
    """

    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        if not is_in_async_context():
            return cast(R, fn(*args, **kwargs))
        implementation: Callable[..., Coroutine[Any, Any, R]] = getattr(fn, "aio")  # noqa: B009 - set by Prefect's async_dispatch, not declared
        return run_coro_as_sync(implementation(*args, **kwargs))

    return call
