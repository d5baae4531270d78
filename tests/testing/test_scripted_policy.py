"""`ScriptedPolicy` decides as scripted, asks until memory answers, and records requests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from autopersona_flows.agent.agent import PersonaAgent
from autopersona_flows.agent.decisions import (
    ClarifyDecision,
    FinalDecision,
    NodeInfo,
    PersonaRequest,
    Requirement,
)
from autopersona_flows.errors import PolicyError
from autopersona_flows.memory.retrieval import MemoryBundle
from autopersona_flows.testing import (
    Clarify,
    InMemoryMemoryStore,
    Proceed,
    ScriptedPolicy,
    UnscriptedNodeError,
)

CITATION = Requirement("citation style", options=["APA", "MLA"])
SIZE = Requirement("paper size", question="Which paper size should it be printed on?")


def request(node: str, *requirements: Requirement) -> PersonaRequest:
    return PersonaRequest(
        user_id="ada",
        query="Finish my paper",
        node=NodeInfo(id=node),
        requirements=list(requirements),
    )


@pytest.fixture
def agent(agent_over: Callable[..., PersonaAgent]) -> Callable[[ScriptedPolicy], PersonaAgent]:
    return lambda policy: agent_over(InMemoryMemoryStore(), policy)


def test_requirement_values_become_constraints_the_tool_reads(agent) -> None:
    policy = ScriptedPolicy({"draft": {"citation style": "APA", "paper size": "A4"}})
    decision = agent(policy).decide(request("draft", CITATION, SIZE))
    assert isinstance(decision, FinalDecision)
    assert [(c.requirement, c.value, c.text, c.memory_id) for c in decision.constraints] == [
        ("citation style", "APA", "citation style: APA", "scripted"),
        ("paper size", "A4", "paper size: A4", "scripted"),
    ]
    assert [r.node.id for r in policy.requests if r.node] == ["draft"]


def test_clarify_asks_until_memory_holds_the_answer(agent) -> None:
    policy = ScriptedPolicy({"draft": {"citation style": Clarify(), "paper size": "A4"}})
    persona = agent(policy)
    asked = persona.decide(request("draft", CITATION, SIZE))
    assert isinstance(asked, ClarifyDecision)
    assert (asked.question, asked.requirement, asked.options) == (
        "To finish your paper, which citation style would you like? APA or MLA?",
        "citation style",
        ["APA", "MLA"],  # the requirement's declared options
    )
    learned = persona.learn("ada", asked, "MLA")
    again = persona.decide(request("draft", CITATION, SIZE))
    assert isinstance(again, FinalDecision)
    assert [(c.requirement, c.value) for c in again.constraints] == [
        ("citation style", "MLA"),
        ("paper size", "A4"),
    ]
    assert learned.record is not None
    assert again.constraints[0].memory_id == learned.record.id  # the answer, traced
    assert policy.count("draft") == 2
    assert policy.count("share") == 0


def test_a_clarify_step_takes_its_requirement_s_question_or_its_own(agent) -> None:
    policy = ScriptedPolicy(
        {
            "print": Clarify("paper size"),
            "share": Clarify(
                "sharing channel", question="Where shall I post it?", options=("Slack",)
            ),
        }
    )
    persona = agent(policy)
    printing = persona.decide(request("print", SIZE))
    sharing = persona.decide(request("share"))  # a node that declares nothing may still ask
    assert isinstance(printing, ClarifyDecision)
    assert isinstance(sharing, ClarifyDecision)
    assert (printing.question, printing.options) == (
        "Which paper size should it be printed on?",
        [],
    )
    assert (sharing.question, sharing.requirement, sharing.options) == (
        "Where shall I post it?",
        "sharing channel",
        ["Slack"],
    )


def test_a_request_naming_requirements_is_decided_on_those_only(agent) -> None:
    # A graph's early check asks about each early requirement in a request of its own.
    policy = ScriptedPolicy({"draft": {"citation style": Clarify(), "paper size": "A4"}})
    decision = agent(policy).decide(request("draft", SIZE))
    assert isinstance(decision, FinalDecision)
    assert [(c.requirement, c.value) for c in decision.constraints] == [("paper size", "A4")]


def test_an_unscripted_node_is_a_typed_error_unless_there_is_a_default(agent) -> None:
    strict = ScriptedPolicy({"draft": {"citation style": "APA"}})
    with pytest.raises(UnscriptedNodeError, match=r"node 'fetch'.*default=Proceed\(\)") as info:
        agent(strict).decide(request("fetch"))
    assert isinstance(info.value, PolicyError)
    assert strict.count() == 1  # recorded all the same
    lenient = ScriptedPolicy({}, default=Proceed("Use the library catalogue."))
    decision = agent(lenient).decide(request("fetch"))
    assert isinstance(decision, FinalDecision)
    assert (decision.guidance, decision.constraints) == ("Use the library catalogue.", [])


def test_decisions_and_functions_are_steps_too(agent) -> None:
    seen: list[tuple[str, int]] = []

    def by_hand(req: PersonaRequest, memories: MemoryBundle) -> dict[str, Any]:
        seen.append((req.node.id if req.node else "", len(memories)))
        return {"action": "final", "guidance": "by hand"}

    fixed = ClarifyDecision(question="Which venue?", requirement="venue")
    policy = ScriptedPolicy({"venue": fixed, "draft": by_hand})
    persona = agent(policy)
    venue = persona.decide(request("venue"))
    assert isinstance(venue, ClarifyDecision)
    assert (venue.question, venue.requirement) == ("Which venue?", "venue")
    draft = persona.decide(request("draft"))
    assert isinstance(draft, FinalDecision)
    assert draft.guidance == "by hand"
    assert seen == [("draft", 0)]


@pytest.mark.parametrize(
    ("script", "error", "message"),
    [
        ({"draft": 42}, TypeError, "'draft' is a int"),
        ({"draft": Clarify()}, ValueError, "no requirement"),
        ({"draft": {"style": Clarify("tone")}}, ValueError, "the key names it"),
        ({"draft": {"style": 3}}, TypeError, "a value is a str, or Clarify"),
    ],
)
def test_a_malformed_script_is_refused_when_made(
    script: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        ScriptedPolicy(script)
