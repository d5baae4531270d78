"""What a tool receives: its node's context, the requirement values and the answers given."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from autopersona_flows.agent.decisions import ClarifyDecision, Constraint, FinalDecision, NodeInfo
from autopersona_flows.memory.records import JsonValue
from autopersona_flows.memory.retrieval import MemoryBundle

__all__ = ["AnsweredQuestion", "NodeContext", "RequirementValue"]


class AnsweredQuestion(BaseModel):
    """A question a node asked in this episode, and the person's answer.

    Attributes:
        question: The question, as asked.
        requirement: The requirement it asked about, if any.
        answer: The person's answer, or the requirement's default.
        memory_id: The persona memory the answer was learned as, if one was written.
        source: ``"answered"`` by the person, or ``"default"``: nobody answered in
            time (or the run's question budget was spent) and the requirement's
            declared default was used; never learned.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    question: str
    requirement: str | None = None
    answer: str
    memory_id: str | None = None
    source: Literal["answered", "default"] = "answered"


class RequirementValue(BaseModel):
    """The value a node runs with for one of its requirements, and where it came from.

    Attributes:
        name: The requirement.
        value: The value: a declared option, or the words of the memory or answer.
        source: ``"answered"`` if the person answered it in this episode,
            ``"memory"`` if memory held it already, ``"default"`` if nobody answered
            and the requirement's declared default was used.
        memory_id: The memory it rests on (for an answer, the one it was learned as).
        text: The constraint as the agent put it (``"citation style: APA"``).
        evidence: Every memory it rests on, ``memory_id`` first.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    value: str | None
    source: Literal["memory", "answered", "default"]
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
            requirement neither in memory nor answered is absent.
        answers: The questions this node asked and their answers, in order.
        answer: The last answer, if this node asked (``answers[-1]``, kept for tools
            written for one question).
        question: The last question asked, if any.
        declared: The names of the requirements the node declares (``None``: not
            known, for a context built by hand).
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
    declared: list[str] | None = None

    def requirement(self, name: str) -> RequirementValue | None:
        """The value the node runs with for requirement ``name``, or None if it has none.

        Raises:
            KeyError: If the node declares no requirement ``name`` (a typo, or one
                it never asked for), naming those it declares.
        """
        if (
            self.declared is not None
            and name not in self.declared
            and name not in self.requirements
        ):
            declared = ", ".join(map(repr, self.declared)) or "none"
            raise KeyError(
                f"{self.node.id!r} declares no requirement {name!r}; it declares {declared}"
            )
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
        declared: list[str] | None = None,
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
            declared=declared,
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
        if c.requirement in answered and answered[c.requirement].source == "default":
            continue  # memory could not answer it: the default is what the node runs with
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
                source=a.source,
                memory_id=a.memory_id,
                text=f"{name}: {a.answer}",
                evidence=[a.memory_id] if a.memory_id else [],
            ),
        )
    return values
