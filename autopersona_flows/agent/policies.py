"""Decision policies: from a request and the retrieved memories to final or clarify."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from autopersona_flows.agent.decisions import PersonaDecision, PersonaRequest
from autopersona_flows.memory.retrieval import MemoryBundle

__all__ = ["FunctionPolicy", "Policy"]


@runtime_checkable
class Policy(Protocol):
    """Decides, from what memory holds, whether a node can proceed.

    Contract: return a `PersonaDecision` (or a dict that validates as one): final
    guidance with the constraints that apply, or a clarification asking one
    question about what is missing. ``memories`` were retrieved for ``request``
    from its user's bank only.

    A policy may also declare ``asks_without_requirements = False``: a promise never
    to clarify a request without required requirements. Graphs then settle such
    nodes all at once before the first one runs, in one kept record; a policy
    that breaks the promise fails the node with a `PolicyError` before its tool
    runs. Without the attribute a policy is assumed to ask anywhere.
    """

    def decide(self, request: PersonaRequest, memories: MemoryBundle) -> PersonaDecision:
        """Decide for ``request``."""
        ...


class FunctionPolicy:
    """Adapt a callable ``(request, memories) -> PersonaDecision | dict``."""

    def __init__(self, fn: Callable[[PersonaRequest, MemoryBundle], Any]) -> None:
        self._fn = fn

    def __repr__(self) -> str:
        return f"FunctionPolicy({self._fn!r})"

    def decide(self, request: PersonaRequest, memories: MemoryBundle) -> PersonaDecision:
        """Call the function; `PersonaAgent` validates what it returns."""
        return self._fn(request, memories)
