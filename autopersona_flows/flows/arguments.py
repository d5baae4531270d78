"""The arguments of a persona function: bound by name, expanded for ``.map()``, checked as JSON."""

from __future__ import annotations

import inspect
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from prefect.client.schemas.objects import State
from prefect.futures import PrefectFuture
from prefect.utilities.callables import expand_mapping_parameters
from prefect.utilities.collections import visit_collection
from prefect.utilities.engine import resolve_inputs_sync

from autopersona_flows.errors import FlowConfigurationError, NodeOutputError
from autopersona_flows.memory.records import check_json

__all__ = ["ToolArguments"]

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


class _Shape:
    """A callable with the function's signature minus its context, for Prefect's helpers."""

    def __init__(self, signature: inspect.Signature) -> None:
        self.__signature__ = signature

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError  # only its signature is read


class ToolArguments:
    """How a persona function takes its arguments: its signature after the `NodeContext`.

    Arguments are bound by name, defaults applied, so ``f(x)`` and ``f(x, flag=False)``
    are one call with one cache key. Values may hold Prefect futures and states (at
    any depth, as in Prefect): the run task resolves them the way Prefect resolves a
    task's parameters, then checks that what it got is JSON.

    Args:
        fn: The function; its first parameter receives the `NodeContext`.
        node_id: Its node id, for messages.

    Raises:
        FlowConfigurationError: If ``fn`` has no positional first parameter.
    """

    def __init__(self, fn: Callable[..., Any], node_id: str) -> None:
        self.node_id = node_id
        parameters = list(inspect.signature(fn).parameters.values())
        if not parameters or parameters[0].kind not in _POSITIONAL:
            raise FlowConfigurationError(
                f"{node_id!r} must take the NodeContext as its first positional parameter: "
                f"def {getattr(fn, '__name__', node_id)}(context: NodeContext, ...)"
            )
        self.signature = inspect.signature(fn).replace(parameters=parameters[1:])
        self._shape = _Shape(self.signature)
        self._variadic = next(
            (p.name for p in parameters if p.kind == inspect.Parameter.VAR_POSITIONAL), None
        )

    @property
    def names(self) -> list[str]:
        """The names of the arguments."""
        return list(self.signature.parameters)

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The arguments of one call by name, defaults applied.

        Raises:
            TypeError: If the call does not fit the signature (as calling it would).
        """
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{self.node_id}(): {exc}") from None
        bound.apply_defaults()
        return self._listed(dict(bound.arguments))

    def expand(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[dict[str, Any]]:
        """The arguments of each element of ``.map(*args, **kwargs)``, as Prefect maps a task.

        Iterables are mapped over, other values (and those wrapped in ``unmapped``) are
        the same for every element; futures given directly are waited for first, to map
        over their results.

        Raises:
            TypeError: If the call does not fit the signature.
            prefect.exceptions.MappingLengthMismatch: If the iterables differ in length.
            prefect.exceptions.MappingMissingIterable: If there is nothing to map over.
        """
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{self.node_id}.map(): {exc}") from None
        parameters = resolve_inputs_sync(dict(bound.arguments), max_depth=0)
        return [self._listed(p) for p in expand_mapping_parameters(self._shape, parameters)]

    def _listed(self, arguments: dict[str, Any]) -> dict[str, Any]:
        # *args arrive as a tuple; a list is the same call and is JSON.
        if self._variadic is not None and isinstance(arguments.get(self._variadic), tuple):
            arguments[self._variadic] = list(arguments[self._variadic])
        return arguments

    def check(self, arguments: dict[str, Any], *, resolved: bool) -> None:
        """Raise unless every argument is JSON (or, before ``resolved``, a future of it).

        Raises:
            NodeOutputError: Naming the first argument that is not, and the fix.
        """
        for name, value in arguments.items():
            try:
                check_json(value)
            except ValueError as exc:
                if not resolved and _json_but_for_futures(value):
                    continue
                raise NodeOutputError(
                    f"argument {name!r} of {self.node_id!r}"
                    f"{' (as its futures resolved)' if resolved else ''} must be a JSON value: "
                    f"{exc}. A persona task's arguments are part of its cache key, which lets "
                    "a resumed run get the result back instead of calling it again: pass JSON "
                    "data (a list for a tuple or set, str keys, model.model_dump(mode='json') "
                    "for a model), and reach live objects (clients, stores) from the function "
                    "itself, not through its arguments"
                ) from None

    def call(self, arguments: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The positional and keyword arguments to call the function with."""
        bound = inspect.BoundArguments(self.signature, OrderedDict(arguments))
        return bound.args, bound.kwargs


def _pending(value: Any) -> Any:
    return None if isinstance(value, PrefectFuture | State) else value


def _json_but_for_futures(value: Any) -> bool:
    """Whether ``value`` is JSON once its futures and states are left out."""
    try:
        check_json(visit_collection(value, _pending, return_data=True, remove_annotations=True))
    except ValueError:
        return False
    return True
