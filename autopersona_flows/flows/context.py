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

__all__ = ["NodeContext", "PauseMode", "PersonaRuntime", "current_runtime", "persona_runtime"]

PauseMode = Literal["auto", "pause", "suspend"]
"""How a run waits for an answer: ``suspend`` frees the worker (deployments only),
``pause`` keeps the process polling, ``auto`` suspends when the run has a deployment."""


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
        answer: The person's answer, if this node asked a question.
        question: The question asked, if any.
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
    answer: str | None = None
    question: str | None = None

    @classmethod
    def build(
        cls,
        *,
        node: NodeInfo,
        user_id: str,
        query: str,
        decision: FinalDecision | ClarifyDecision,
        answer: str | None,
        inputs: dict[str, Any],
        tools: list[str],
    ) -> NodeContext:
        """Assemble the context from a decision (and the answer to it, if any)."""
        if isinstance(decision, FinalDecision):
            guidance, constraints, question = decision.guidance, decision.constraints, None
        else:
            guidance = f"{decision.question} The person answered: {answer}"
            constraints, question = [], decision.question
        return cls(
            node=node,
            user_id=user_id,
            query=query,
            guidance=guidance,
            constraints=constraints,
            memories=decision.memories,
            inputs=inputs,
            tools=tools,
            answer=answer,
            question=question,
        )


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
