"""Search planners: what to retrieve from memory for a request."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from autopersona_flows.agent.decisions import PersonaRequest, Requirement
from autopersona_flows.memory.records import LAYERS
from autopersona_flows.memory.retrieval import SearchRequest

__all__ = ["DefaultPlanner", "FunctionPlanner", "SearchPlanner", "requirement_label"]


def requirement_label(requirement: Requirement) -> str:
    """The label of the search made for ``requirement`` (see `SearchRequest.label`)."""
    return f"requirement:{requirement.name}"


@runtime_checkable
class SearchPlanner(Protocol):
    """Decides which searches to run for a request.

    Contract: return `SearchRequest` objects; a search made for a requirement carries
    ``label=requirement_label(requirement)``, so policies can find its evidence.
    """

    def plan(self, request: PersonaRequest) -> list[SearchRequest]:
        """Return the searches for ``request``, most important first."""
        ...


class DefaultPlanner:
    """Each requirement in its layers, then the node instruction and the query in every layer.

    Requirement searches come first: a memory is returned once per retrieval, to
    the first search that finds it, and a requirement's evidence must be credited
    to that requirement.
    """

    def __repr__(self) -> str:
        return "DefaultPlanner()"

    def plan(self, request: PersonaRequest) -> list[SearchRequest]:
        """Plan the searches for ``request``."""
        searches = [
            SearchRequest(layer=layer, query=query, label=requirement_label(requirement))
            for requirement in request.requirements
            # The name alone finds a learned answer (remembered under the name) even
            # when a long description would dilute the match.
            for query in dict.fromkeys(
                [requirement.name, f"{requirement.name} {requirement.description}".strip()]
            )
            for layer in requirement.layers
        ]
        texts = [(request.node.instruction, "node")] if request.node else []
        texts.append((request.query, "query"))
        searches += [
            SearchRequest(layer=layer, query=text, label=label)
            for text, label in texts
            if text.strip()
            for layer in LAYERS
        ]
        return searches


class FunctionPlanner:
    """Adapt a callable ``request -> list[SearchRequest]``."""

    def __init__(self, fn: Callable[[PersonaRequest], list[SearchRequest]]) -> None:
        self._fn = fn

    def __repr__(self) -> str:
        return f"FunctionPlanner({self._fn!r})"

    def plan(self, request: PersonaRequest) -> list[SearchRequest]:
        """Call the function."""
        return list(self._fn(request))
