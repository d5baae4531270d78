"""Search planners: what to retrieve from memory for a request."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from autopersona_flows.agent.decisions import PersonaRequest, Requirement
from autopersona_flows.memory.records import LAYERS
from autopersona_flows.memory.retrieval import SearchRequest

__all__ = [
    "LEARNED",
    "STANDING",
    "DefaultPlanner",
    "FunctionPlanner",
    "SearchPlanner",
    "requirement_label",
    "requirement_text",
]

STANDING = "standing"
"""The label of memories looked up as possible standing constraints (allergies,
access, limits) of the request's work: see `agent.standing` and `PersonaAgent`."""

LEARNED = "learned"
"""The label of answers learned at the request's node or for its request: candidates
for every requirement (see `PersonaAgent`)."""


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
    """Recall for each requirement in its layers, then for the node and the query everywhere.

    A requirement is searched by its name alone (a memory stored under that name
    ranks first) and by `requirement_text`: with its description, its declared
    question and its options (a vague topic such as "travel" whose value names
    "aisle" is found through them); each of its searches carries its label, so that its evidence is
    credited to it (`PersonaAgent` keeps searches distinct per label). The node's
    instruction and the query are searched in every layer with the retrieval's
    ``top_k``.

    Args:
        recall: Memories each requirement search recalls (its ``top_k``): a judge
            decides among them, and a bank full of memories sharing its words
            needs depth.
    """

    def __init__(self, recall: int = 20) -> None:
        if isinstance(recall, bool) or not isinstance(recall, int) or recall < 1:
            raise ValueError(f"recall must be a positive int, got {recall!r}")
        self.recall = recall

    def __repr__(self) -> str:
        return f"DefaultPlanner(recall={self.recall})"

    def plan(self, request: PersonaRequest) -> list[SearchRequest]:
        """Plan the searches for ``request``."""
        searches = [
            SearchRequest(
                layer=layer,
                query=query,
                label=requirement_label(requirement),
                top_k=self.recall,
            )
            for requirement in request.requirements
            for query in _requirement_queries(requirement)
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


def requirement_text(requirement: Requirement) -> str:
    """The requirement as one text: its name, description, question and options.

    What the judge's encoder reads it as, and one of its searches: a memory is
    found through any of its words, and each text of a decision is embedded once.
    """
    parts = [requirement.name.replace("_", " ")]
    if requirement.description.strip():
        parts.append(requirement.description.strip())
    if requirement.question:
        parts.append(requirement.question)
    if requirement.options:
        parts.append(f"options: {', '.join(requirement.options)}")
    return ". ".join(parts)


def _requirement_queries(requirement: Requirement) -> list[str]:
    return list(dict.fromkeys([requirement.name, requirement_text(requirement)]))


class FunctionPlanner:
    """Adapt a callable ``request -> list[SearchRequest]``."""

    def __init__(self, fn: Callable[[PersonaRequest], list[SearchRequest]]) -> None:
        self._fn = fn

    def __repr__(self) -> str:
        return f"FunctionPlanner({self._fn!r})"

    def plan(self, request: PersonaRequest) -> list[SearchRequest]:
        """Call the function."""
        return list(self._fn(request))
