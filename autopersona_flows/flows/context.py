"""What a tool receives, and how a flow finds its PersonaAgent."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from prefect.filesystems import WritableFileSystem
from pydantic import BaseModel, ConfigDict, Field

from autopersona_flows.agent.agent import PersonaAgent
from autopersona_flows.agent.decisions import ClarifyDecision, Constraint, FinalDecision, NodeInfo
from autopersona_flows.errors import FlowConfigurationError
from autopersona_flows.memory.records import JsonValue
from autopersona_flows.memory.retrieval import MemoryBundle

__all__ = [
    "AnsweredQuestion",
    "NodeContext",
    "PauseMode",
    "PersonaRuntime",
    "RequirementValue",
    "current_runtime",
    "persona_runtime",
]

PauseMode = Literal["auto", "pause", "suspend"]
"""How a run waits for an answer: ``suspend`` frees the worker (deployments only),
``pause`` keeps the process polling, ``auto`` suspends when the run has a deployment."""


class AnsweredQuestion(BaseModel):
    """A question a node asked in this episode, and the person's answer.

    Attributes:
        question: The question, as asked.
        requirement: The requirement it asked about, if any.
        answer: The person's answer.
        memory_id: The persona memory the answer was learned as, if one was written.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    question: str
    requirement: str | None = None
    answer: str
    memory_id: str | None = None


class RequirementValue(BaseModel):
    """The value a node runs with for one of its requirements, and where it came from.

    Attributes:
        name: The requirement.
        value: The value: a declared option, or the words of the memory or answer.
        source: ``"answered"`` if the person answered it in this episode,
            ``"memory"`` if memory held it already.
        memory_id: The memory it rests on (for an answer, the one it was learned as).
        text: The constraint as the agent put it (``"citation style: APA"``).
        evidence: Every memory it rests on, ``memory_id`` first.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    value: str | None
    source: Literal["memory", "answered"]
    memory_id: str | None = None
    text: str = ""
    evidence: list[str] = Field(default_factory=list)


class NodeContext(BaseModel):
    """Everything a node's tool knows when it runs.

    Attributes:
        node: The node (id and instruction).
        user_id: The person the graph runs for.
        query: Their request.
        guidance: What to do for this person, in words.
        constraints: The constraints that apply, each traced to its memory.
        memories: What retrieval found for this node.
        inputs: The outputs of the nodes this one depends on, by node id.
        tools: Names of the other tools of the graph.
        requirements: The value of each requirement the node runs with, by name:
            from memory or answered in this episode (see `requirement`). A
            requirement neither answered is absent.
        answers: The questions this node asked and their answers, in order.
        answer: The last answer, if this node asked.
        question: The last question asked, if any.
    """

    model_config = ConfigDict(frozen=True)

    node: NodeInfo
    user_id: str
    query: str
    guidance: str = ""
    constraints: list[Constraint] = Field(default_factory=list)
    memories: MemoryBundle = Field(default_factory=MemoryBundle)
    inputs: dict[str, JsonValue] = Field(default_factory=dict)
    tools: list[str] = Field(default_factory=list)
    requirements: dict[str, RequirementValue] = Field(default_factory=dict)
    answers: list[AnsweredQuestion] = Field(default_factory=list)
    answer: str | None = None
    question: str | None = None

    def requirement(self, name: str) -> RequirementValue | None:
        """The value the node runs with for requirement ``name``, or None if it has none."""
        return self.requirements.get(name)

    @classmethod
    def build(
        cls,
        *,
        node: NodeInfo,
        user_id: str,
        query: str,
        decision: FinalDecision | ClarifyDecision,
        answers: list[AnsweredQuestion],
        inputs: dict[str, Any],
        tools: list[str],
    ) -> NodeContext:
        """Assemble the context from a decision and the answers given before it."""
        last = answers[-1] if answers else None
        if isinstance(decision, FinalDecision):
            guidance, constraints = decision.guidance, decision.constraints
        else:  # the policy asked again what was answered: the answers are the guidance
            guidance = " ".join(f"{a.question} The person answered: {a.answer}" for a in answers)
            constraints = []
        return cls(
            node=node,
            user_id=user_id,
            query=query,
            guidance=guidance,
            constraints=constraints,
            memories=decision.memories,
            inputs=inputs,
            tools=tools,
            requirements=_requirement_values(constraints, answers),
            answers=answers,
            answer=last.answer if last else None,
            question=last.question if last else None,
        )


def _requirement_values(
    constraints: list[Constraint], answers: list[AnsweredQuestion]
) -> dict[str, RequirementValue]:
    answered = {a.requirement: a for a in answers if a.requirement}
    learned = {a.memory_id for a in answers if a.memory_id}
    values: dict[str, RequirementValue] = {}
    for c in constraints:
        if c.requirement is None or c.requirement in values:
            continue
        fresh = c.memory_id in learned or c.requirement in answered
        values[c.requirement] = RequirementValue(
            name=c.requirement,
            value=c.value,
            source="answered" if fresh else "memory",
            memory_id=c.memory_id,
            text=c.text,
            evidence=c.evidence or [c.memory_id],
        )
    for name, a in answered.items():  # answered, yet not among the constraints
        values.setdefault(
            name,
            RequirementValue(
                name=name,
                value=a.answer,
                source="answered",
                memory_id=a.memory_id,
                text=f"{name}: {a.answer}",
                evidence=[a.memory_id] if a.memory_id else [],
            ),
        )
    return values


@dataclass(frozen=True)
class PersonaRuntime:
    """The live parts and options of persona-aware runs (never flow parameters).

    Attributes:
        agent: Decides for each node and learns answers.
        user_id: The user of `persona_task` calls (graph runs pass their own).
        query: The request of `persona_task` calls.
        pause_mode: How to wait for an answer; see `PauseMode`.
        pause_timeout: Seconds to wait for an answer before the run fails.
        poll_interval: Seconds between checks while paused (Prefect's default is 10).
        result_storage: Where node results are persisted (a folder or a Prefect
            file-system block); Prefect's default storage if ``None``. Every
            worker that may resume a run must see it.
        episode_id: Ties cache keys to one episode (default: the flow run's id).
    """

    agent: PersonaAgent
    user_id: str | None = None
    query: str = ""
    pause_mode: PauseMode = "auto"
    pause_timeout: int = 3600
    poll_interval: float = 1.0
    result_storage: Path | WritableFileSystem | None = None
    episode_id: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.agent, PersonaAgent):
            raise FlowConfigurationError(f"agent must be a PersonaAgent, got {self.agent!r}")
        if self.pause_mode not in ("auto", "pause", "suspend"):
            raise FlowConfigurationError(
                f"pause_mode must be auto, pause or suspend: {self.pause_mode!r}"
            )
        if self.pause_timeout <= 0 or self.poll_interval <= 0:
            raise FlowConfigurationError("pause_timeout and poll_interval must be positive")
        if isinstance(self.result_storage, str):
            raise FlowConfigurationError(
                "result_storage must be a Path or a file-system block; Prefect reads a str as "
                "a block slug, not a folder"
            )


_RUNTIME: ContextVar[PersonaRuntime | None] = ContextVar("autopersona_runtime", default=None)


@contextlib.contextmanager
def persona_runtime(agent: PersonaAgent | None = None, **options: Any) -> Iterator[PersonaRuntime]:
    """Provide the PersonaAgent (and options) to persona tasks and graphs in this block.

    Nested blocks inherit what they do not set, like Prefect's ``tags``::

        with persona_runtime(agent, user_id="ada", query="Finish my paper"):
            my_flow()

    Args:
        agent: The agent; inherited from an enclosing block, or built from the
            settings (see `current_runtime`), if omitted.
        **options: Any other field of `PersonaRuntime`.
    """
    outer = _RUNTIME.get()
    if agent is None:
        runtime = replace(current_runtime(), **options)
    else:
        base = {} if outer is None else {k: v for k, v in vars(outer).items() if k != "agent"}
        runtime = PersonaRuntime(agent=agent, **(base | options))
    token = _RUNTIME.set(runtime)
    try:
        yield runtime
    finally:
        _RUNTIME.reset(token)


def current_runtime() -> PersonaRuntime:
    """The innermost `persona_runtime` block's runtime, else one built from the settings.

    Runs started from a deployment have no caller to open a block, so they get their
    agent and options from `AutopersonaSettings` (``PREFECT_INTEGRATIONS_AUTOPERSONA_*``).

    Raises:
        FlowConfigurationError: If there is no block and the settings are invalid.
        EmbedderError: If there is no block and the embedder setting names none.
    """
    runtime = _RUNTIME.get()
    if runtime is None:
        # Imported here: the settings module builds PersonaRuntime objects from this one.
        from autopersona_flows.flows.settings import runtime_from_settings  # noqa: PLC0415

        runtime = runtime_from_settings()
    return runtime
