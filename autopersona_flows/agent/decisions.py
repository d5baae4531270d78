"""What the PersonaAgent is asked, and what it answers: final guidance or one question."""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
)

from autopersona_flows.errors import PolicyError
from autopersona_flows.memory.records import LAYERS, MemoryLayer, UtcDatetime, non_blank
from autopersona_flows.memory.retrieval import MemoryBundle
from autopersona_flows.memory.users import check_user_id

__all__ = [
    "ClarifyDecision",
    "Constraint",
    "FinalDecision",
    "NodeInfo",
    "PersonaDecision",
    "PersonaRequest",
    "Requirement",
    "parse_decision",
]


NonBlank = Annotated[str, AfterValidator(non_blank)]


class _Model(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class Requirement(_Model):
    """Something a task node needs to know about the person or their workspace.

    ``Requirement("citation style", options=["APA", "MLA"])`` names it positionally.

    Attributes:
        name: What is needed, e.g. ``"citation style"``; also the topic an answer
            is remembered under.
        description: More words to search memory with.
        question: The question to ask when it is missing (one is composed if not).
        options: The allowed answers, if the answer is a choice.
        layers: Where evidence for it may come from: by default every layer, so that
            choices repeated in past tasks count too.
        required: Whether the node must not run without it.
        ask: When to ask for it if memory lacks it: ``"early"``, before a graph's
            first tool runs, together with every other missing requirement; or
            ``"at_node"``, when its node is reached (for what depends on the work
            done before it).
        allow_other: Whether an answer may be other words than the ``options``
            (they are then suggestions, and the form a text field).
        default: The value to run with if nobody answers in time (or the run's
            question budget is spent), when the run's ``on_timeout`` says so. Never
            learned as the person's preference. The question's form preselects it.
        example: An example answer, shown with a composed question whose answer is
            free text ("vegetarian, no nuts"); the ``default`` is shown if not given.
    """

    name: NonBlank
    description: str = ""
    question: NonBlank | None = None
    options: list[NonBlank] = Field(default_factory=list)
    # Not strict: the positional __init__ below makes pydantic validate JSON input in
    # Python mode, where a strict tuple would refuse the JSON array.
    layers: Annotated[tuple[MemoryLayer, ...], Field(strict=False)] = LAYERS
    required: bool = True
    ask: Literal["early", "at_node"] = "early"
    allow_other: bool = False
    default: NonBlank | None = None
    # Left out while unset: requests hash into cache keys, which must not move.
    example: Annotated[NonBlank | None, Field(exclude_if=lambda value: value is None)] = None

    def __init__(self, name: str | None = None, /, **data: Any) -> None:
        if name is not None:
            data["name"] = name
        super().__init__(**data)

    @field_validator("layers")
    @classmethod
    def _layers(cls, layers: tuple[MemoryLayer, ...]) -> tuple[MemoryLayer, ...]:
        if not layers:
            raise ValueError("a requirement needs at least one layer")
        if len(set(layers)) != len(layers):
            raise ValueError(f"layers repeat: {layers}")
        return layers

    @field_validator("options")
    @classmethod
    def _options(cls, options: list[str]) -> list[str]:
        if len(set(options)) != len(options):
            raise ValueError(f"options repeat: {options}")
        return options


class NodeInfo(_Model):
    """The task node a request is made for.

    Attributes:
        id: The node's id in its graph.
        instruction: What the node does.
    """

    id: NonBlank
    instruction: str = ""


class PersonaRequest(_Model):
    """One question to the PersonaAgent: what does this person need here?

    Attributes:
        user_id: Whose memory to consult.
        query: The user's request, as given.
        node: The task node being prepared, when called from a graph.
        requirements: What the node needs to know; each one missing is asked for.
        additional_tools: Names of tools the node may use (context for the policy).
        retrieval_top_k: Overrides the agent's ``top_k`` for this request only.
        retrieval_min_similarity: Overrides the agent's ``min_similarity`` for this
            request only (a high-risk step can demand stronger evidence).
        as_of: Decide with memory as it stood then: only what was stated by then
            and had not expired (see `MemoryRetriever.retrieve`); now by default.
    """

    user_id: Annotated[str, AfterValidator(check_user_id)]
    query: str
    node: NodeInfo | None = None
    requirements: list[Requirement] = Field(default_factory=list)
    additional_tools: list[str] = Field(default_factory=list)
    retrieval_top_k: Annotated[int, Field(ge=1)] | None = None
    retrieval_min_similarity: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    # Left out while unset: requests hash into cache keys, which must not move.
    as_of: Annotated[UtcDatetime | None, Field(exclude_if=lambda value: value is None)] = None

    @field_validator("requirements")
    @classmethod
    def _unique(cls, requirements: list[Requirement]) -> list[Requirement]:
        names = [r.name for r in requirements]
        if len(set(names)) != len(names):
            raise ValueError(f"requirement names repeat: {names}")
        return requirements

    @field_validator("retrieval_min_similarity")
    @classmethod
    def _finite(cls, value: float | None) -> float | None:
        if value is not None and not math.isfinite(value):
            raise ValueError("must be finite")
        return value


class Constraint(_Model):
    """One thing the node must respect, traced to the memories it came from.

    Attributes:
        text: The constraint, ready to show a tool or a person.
        requirement: The requirement it satisfies, if any.
        memory_id: The memory it came from (the newest, when several agree).
        layer: That memory's layer.
        score: How clearly it answers the requirement (the judge's strength), or for
            other guidance how relevant it is, in [0, 1].
        value: The value it gives the requirement: a declared option, or the
            memory's own words.
        evidence: Every memory it rests on, ``memory_id`` first (e.g. the past tasks
            that made the same choice).
        reason: Why it answers the requirement, or why it applies to the node.
    """

    text: NonBlank
    requirement: str | None = None
    memory_id: str
    layer: MemoryLayer
    score: Annotated[float, Field(ge=0.0, le=1.0)]
    value: str | None = None
    evidence: list[str] = Field(default_factory=list)
    reason: str = ""


class FinalDecision(_Model):
    """Enough is known: proceed with this guidance.

    Attributes:
        action: Always ``"final"``.
        guidance: What to do for this person, in words.
        constraints: The constraints that apply, each with its evidence.
        memories: Everything retrieval found for the request.
    """

    action: Literal["final"] = "final"
    guidance: str
    constraints: list[Constraint] = Field(default_factory=list)
    memories: MemoryBundle = Field(default_factory=MemoryBundle)


class ClarifyDecision(_Model):
    """Something essential is missing: ask this one question first.

    Attributes:
        action: Always ``"clarify"``.
        question: The question, naming what is missing and what it is for.
        requirement: The requirement it asks about, if any.
        options: Suggested answers (declared ones, or the user's earlier choices).
        memories: Everything retrieval found for the request.
        request: The request it answers (set by `PersonaAgent`): `PersonaAgent.learn`
            remembers the answer under everything the requirement was called there.
    """

    action: Literal["clarify"] = "clarify"
    question: NonBlank
    requirement: str | None = None
    options: list[str] = Field(default_factory=list)
    memories: MemoryBundle = Field(default_factory=MemoryBundle)
    request: PersonaRequest | None = None


PersonaDecision = Annotated[FinalDecision | ClarifyDecision, Discriminator("action")]
"""Final guidance or one clarifying question, told apart by ``action``."""

_DECISION: TypeAdapter[FinalDecision | ClarifyDecision] = TypeAdapter(PersonaDecision)


def parse_decision(value: Any) -> FinalDecision | ClarifyDecision:
    """Validate a policy's answer (a decision, a dict, or JSON text) into a decision.

    Raises:
        PolicyError: For anything else: an unknown action, a clarification
            without a question, a missing or mistyped field.
    """
    if isinstance(value, FinalDecision | ClarifyDecision):
        return value
    try:
        if isinstance(value, str | bytes):
            return _DECISION.validate_json(value)
        return _DECISION.validate_python(value)
    except ValidationError as exc:
        raise PolicyError(f"the policy returned an invalid decision:\n{exc}") from exc
