"""`ScriptedPolicy`: decisions scripted per node, for tests that must not depend on retrieval."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from autopersona_flows.agent.decisions import (
    ClarifyDecision,
    Constraint,
    FinalDecision,
    PersonaDecision,
    PersonaRequest,
    Requirement,
)
from autopersona_flows.agent.questions import compose_question
from autopersona_flows.errors import PolicyError
from autopersona_flows.memory.records import PersonaMemory
from autopersona_flows.memory.retrieval import MemoryBundle

__all__ = ["Clarify", "Proceed", "ScriptedPolicy", "Step", "UnscriptedNodeError"]

_SCRIPTED = "scripted"  # the memory id of a value the script gave: no memory holds it


class UnscriptedNodeError(PolicyError):
    """A `ScriptedPolicy` was asked to decide for a node its script does not cover."""


@dataclass(frozen=True)
class Clarify:
    """Ask about one requirement, unless memory already holds the person's answer to it.

    Once the answer is learned (the agent writes it as a persona memory on that
    topic) the next decision for the node finds it among the memories retrieved
    and goes ahead with it, as a real policy would: a node asks once, and a later
    run of the graph does not ask again.

    Attributes:
        requirement: What to ask about. Inside a node's mapping of requirement
            values, leave it out: the key names it.
        question: The question; the requirement's own, or one `compose_question`
            words from it (and the node's instruction) if not given.
        options: The suggested answers; the requirement's declared options if not given.
    """

    requirement: str | None = None
    question: str | None = None
    options: Sequence[str] | None = None


@dataclass(frozen=True)
class Proceed:
    """Go ahead with this guidance and these requirement values.

    Attributes:
        guidance: What the tool reads as `NodeContext.guidance`.
        values: A value for each requirement (name to value): the tool reads each
            with `NodeContext.requirement` (its ``memory_id`` is ``"scripted"``).
    """

    guidance: str = ""
    values: Mapping[str, str] = field(default_factory=dict)


Step: TypeAlias = (
    Proceed
    | Clarify
    | Mapping[str, str | Clarify]
    | FinalDecision
    | ClarifyDecision
    | Callable[[PersonaRequest, MemoryBundle], Any]
)
"""What a node is scripted to do.

* a mapping of requirement values, ``{"citation style": "APA"}``: go ahead with
  them; a value may be `Clarify()` instead, asked (the first of them) until
  memory holds its answer;
* `Proceed`: go ahead, with guidance too; `Clarify`: ask;
* a `FinalDecision` or `ClarifyDecision`: returned as it is;
* a callable ``(request, memories) -> decision``, as `FunctionPolicy` takes.
"""


@dataclass(frozen=True)
class _Script:
    """A node's step in one form: guidance, and per requirement a value or a question."""

    guidance: str
    values: dict[str, str | Clarify]


def _script(node: str, step: Any) -> _Script | FinalDecision | ClarifyDecision | Callable[..., Any]:
    if isinstance(step, FinalDecision | ClarifyDecision):
        return step
    if isinstance(step, Proceed):
        return _Script(step.guidance, dict(step.values))
    if isinstance(step, Clarify):
        if not step.requirement:
            raise ValueError(
                f"the script of {node!r} asks Clarify() about no requirement: name one"
            )
        return _Script("", {step.requirement: step})
    if isinstance(step, Mapping):
        values: dict[str, str | Clarify] = {}
        for name, value in step.items():
            if isinstance(value, Clarify) and value.requirement not in (None, name):
                raise ValueError(
                    f"the script of {node!r} puts Clarify({value.requirement!r}) under "
                    f"{name!r}: leave the requirement out, the key names it"
                )
            if not isinstance(value, str | Clarify):
                raise TypeError(
                    f"the script of {node!r} gives {name!r} a {type(value).__name__}: "
                    "a value is a str, or Clarify() to ask for it"
                )
            values[name] = value
        return _Script("", values)
    if callable(step):
        return step
    raise TypeError(
        f"the script of {node!r} is a {type(step).__name__}: use a mapping of requirement "
        "values, Proceed(...), Clarify(...), a decision, or a callable (request, memories)"
    )


class ScriptedPolicy:
    """A `Policy` that decides what its script says, node by node, and records each request.

    Example::

        policy = ScriptedPolicy(
            {
                "draft": {"citation style": "APA"},  # go ahead with this value
                "share": Clarify("sharing channel"),  # ask, until memory holds the answer
            },
            default=Proceed(),  # every other node goes ahead
        )
        agent = PersonaAgent(MemoryBank(InMemoryMemoryStore(), HashingEmbedder()), policy)
        ...
        assert policy.count("share") == 2  # asked, then decided again with the answer

    Whatever memory holds is ignored except for a `Clarify`'s own answer, so a test
    controls every decision; the agent still retrieves (and the flow still keeps
    each decision, asks and learns) as it does with any policy. A request that names
    requirements is decided on the script's entries for those only (a graph's
    early check asks about each early requirement in a request of its own); one
    that names none, on all of them.

    Args:
        script: For each node id, its `Step` (see there).
        default: The step of a node the script does not name; without one, such a
            node raises `UnscriptedNodeError`.

    Attributes:
        requests: Every request decided, in order (from any thread).

    Raises:
        TypeError: If a step is none of the kinds a `Step` may be.
        ValueError: If a `Clarify` names no requirement, or another than its key.
    """

    def __init__(self, script: Mapping[str, Step], *, default: Step | None = None) -> None:
        self._script = {node: _script(node, step) for node, step in script.items()}
        self._default = None if default is None else _script("default", default)
        self.requests: list[PersonaRequest] = []
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"ScriptedPolicy({sorted(self._script)})"

    def count(self, node_id: str | None = None) -> int:
        """How many requests were decided for ``node_id`` (for any node if ``None``)."""
        with self._lock:
            if node_id is None:
                return len(self.requests)
            return Counter(r.node.id if r.node else None for r in self.requests)[node_id]

    def decide(self, request: PersonaRequest, memories: MemoryBundle) -> PersonaDecision:
        """Decide for ``request`` as its node's script says.

        Raises:
            UnscriptedNodeError: If the script does not name the request's node and
                no ``default`` was given.
        """
        with self._lock:
            self.requests.append(request)
        node = request.node.id if request.node is not None else None
        step = self._script.get(node) if node is not None else None
        if step is None:
            step = self._default
        if step is None:
            where = f"node {node!r}" if node is not None else "a request with no node"
            raise UnscriptedNodeError(
                f"{self!r} has no script for {where}: add it to the script, or pass "
                "default=Proceed() for every node the test does not care about"
            )
        if isinstance(step, _Script):
            return _decision(step, request, memories)
        if isinstance(step, FinalDecision | ClarifyDecision):
            return step
        decided: PersonaDecision = step(request, memories)  # validated by the agent
        return decided


def _decision(script: _Script, request: PersonaRequest, memories: MemoryBundle) -> PersonaDecision:
    declared = {r.name: r for r in request.requirements}
    constraints = []
    for name, value in script.values.items():
        if declared and name not in declared:
            continue  # a request naming requirements is decided on those (the early check's)
        if isinstance(value, str):
            constraints.append(_constraint(name, value, _SCRIPTED, "scripted"))
            continue
        learned = _answer_in(memories, name)
        if learned is None:
            return _question(name, value, declared.get(name), request)
        memory_id, preference = learned
        constraints.append(_constraint(name, preference, memory_id, "the person's answer"))
    return FinalDecision(guidance=script.guidance, constraints=constraints)


def _constraint(name: str, value: str, memory_id: str, reason: str) -> Constraint:
    return Constraint(
        text=f"{name}: {value}",
        requirement=name,
        memory_id=memory_id,
        layer="persona",
        score=1.0,
        value=value,
        evidence=[memory_id],
        reason=reason,
    )


def _question(
    name: str, clarify: Clarify, declared: Requirement | None, request: PersonaRequest
) -> ClarifyDecision:
    options = (
        clarify.options
        if clarify.options is not None
        else (tuple(declared.options) if declared else ())
    )
    question = clarify.question or compose_question(
        declared or Requirement(name), request, list(options)
    )
    return ClarifyDecision(question=question, requirement=name, options=list(options))


def _answer_in(memories: MemoryBundle, requirement: str) -> tuple[str, str] | None:
    """The id and preference of the first persona memory retrieved about ``requirement``.

    About it: its topic, or one of its aliases, is the requirement's name.
    """
    wanted = requirement.casefold()
    for found in memories.persona:
        content = found.record.content
        if isinstance(content, PersonaMemory) and wanted in {
            name.casefold() for name in (content.topic, *content.aliases)
        }:
            return found.record.id, content.preference
    return None
