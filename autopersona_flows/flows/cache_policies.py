"""The cache policy that makes replay safe: keys from exactly what changes a result."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from prefect.cache_policies import CachePolicy
from prefect.context import TaskRunContext

from autopersona_flows import _json

__all__ = ["NodeCachePolicy", "node_cache_key"]

_UNSAFE = re.compile(r"[^a-z0-9-]+")


def node_cache_key(kind: str, episode_id: str, node_id: str, inputs: Any) -> str:
    """The cache key of one step of a node: readable prefix, then a digest.

    ``kind`` tells the steps of one node apart (``decide``, ``learn``, ``run``), the
    episode ties the key to one run of a graph (or to a caller's stable id), and
    ``inputs`` is the canonical JSON of everything the result depends on.
    """
    slug = _UNSAFE.sub("-", node_id.lower()).strip("-")[:40] or "node"
    digest = _json.digest({"kind": kind, "episode": episode_id, "node": node_id, "inputs": inputs})
    return f"autopersona-{kind}-{slug}-{digest[:32]}"


@dataclass
class NodeCachePolicy(CachePolicy):
    """Keys a persona task on its episode, its node and the canonical JSON of its inputs.

    Why not Prefect's built-ins: ``INPUTS`` alone gives two nodes with equal inputs
    the same key, ``TASK_SOURCE`` is the same for every node (one wrapper runs them
    all), ``RUN_ID`` would break replay under a stable episode id, and their hashes
    of pickled objects are not stable across processes. Live objects (stores,
    agents) are never task inputs, so they cannot leak into a key either.

    The task's parameters must be ``episode_id``, ``node_id`` and ``inputs``
    (JSON values), and may be ``resolved``: more inputs, which Prefect resolves
    (upstream results, arguments), keyed as part of ``inputs``. ``kind`` names the step.
    """

    kind: str = "run"

    def compute_key(
        self,
        task_ctx: TaskRunContext,
        inputs: dict[str, Any],
        flow_parameters: dict[str, Any],
        **kwargs: Any,
    ) -> str | None:
        """Compute the key from the task's ``episode_id``, ``node_id`` and ``inputs``.

        ``inputs`` with ``resolved`` merged in: the key of a run task is the same
        whether its inputs come as one parameter (a `remote_task`'s) or as two.

        None (nothing cached) if the inputs are not JSON: a future among a persona
        task's arguments resolved to something else, which its run task refuses,
        naming the argument, before the function runs.
        """
        try:
            keyed = inputs["inputs"]
            if inputs.get("resolved"):
                keyed = keyed | inputs["resolved"]
            return node_cache_key(self.kind, inputs["episode_id"], inputs["node_id"], keyed)
        except _json.JSONEncodeError:
            return None
