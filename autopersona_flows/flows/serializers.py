"""Result serialisation as JSON, so cached node results are readable and portable."""

from __future__ import annotations

from typing import Any, Literal

import orjson
from prefect.serializers import Serializer, prefect_json_object_decoder
from prefect.utilities.importtools import to_qualified_name

__all__ = ["OrjsonSerializer"]

_EXCEPTION = frozenset({"__exc_type__", "message"})


# Not `Serializer[Any]`: subscripting makes a pydantic subclass that Prefect's type registry
# refuses at import (it has no dispatch key).
class OrjsonSerializer(Serializer):
    """Serialise results with orjson (sorted keys).

    Prefect records the serializer by its ``type``; a process that reads cached
    results imports this module through ``autopersona_flows.flows`` first.

    Prefect also persists a failed task's exception with its task's serializer. One
    is stored as Prefect's own JSON serializer stores it, never pickled:
    ``{"__exc_type__": "<module>.<class>", "message": str(exc)}``, and read back as
    that type with that message (a `RuntimeError` naming them when the type cannot be
    imported or built from a message). A top-level object of exactly those two keys
    therefore reads back as an exception; no persona task returns one.
    """

    type: Literal["autopersona-orjson"] = "autopersona-orjson"

    def dumps(self, obj: Any) -> bytes:
        """Serialise a JSON value, or a failed task's exception."""
        if isinstance(obj, BaseException):
            obj = {"__exc_type__": to_qualified_name(type(obj)), "message": str(obj)}
        return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)

    def loads(self, blob: bytes) -> Any:
        """Read it back."""
        value = orjson.loads(blob)
        if isinstance(value, dict) and value.keys() == _EXCEPTION:
            try:
                return prefect_json_object_decoder(value)
            except (ValueError, TypeError):  # not importable, or wants other arguments
                return RuntimeError(f"{value['__exc_type__']}: {value['message']}")
        return value
