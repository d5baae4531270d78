"""Result serialisation as JSON, so cached node results are readable and portable."""

from __future__ import annotations

from typing import Any, Literal

import orjson
from prefect.serializers import Serializer

__all__ = ["OrjsonSerializer"]


class OrjsonSerializer(Serializer):  # type: ignore[type-arg]
    """Serialise results with orjson (sorted keys).

    Prefect records the serializer by its ``type``; a process that reads cached
    results imports this module through ``autopersona_flows.flows`` first.
    """

    type: Literal["autopersona-orjson"] = "autopersona-orjson"

    def dumps(self, obj: Any) -> bytes:
        """Serialise a JSON value."""
        return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)

    def loads(self, blob: bytes) -> Any:
        """Read it back."""
        return orjson.loads(blob)
