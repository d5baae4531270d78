"""Asking early: what a graph needs and memory lacks, asked before its first tool runs.

A question is worth most before work starts: once part of the work is done on a
guess, the answer may undo it. So before a graph runs a single tool, every required
requirement its nodes declare (``ask="early"``, the default) is checked against
memory, and each one memory cannot answer is asked, once however many nodes need
it. The nodes then decide with the answers in memory, and with the questions
answered in their inputs, so a replay rebuilds exactly the same steps.

The same check decides every node whose requirements are all checked early: when
memory holds them all and nothing is asked, that is the node's decision, and the
node needs no decide step of its own once the tools start to compete for the process.
"""

from __future__ import annotations

from typing import NamedTuple

from autopersona_flows import _json
from autopersona_flows.agent.decisions import (
    ClarifyDecision,
    FinalDecision,
    NodeInfo,
    Requirement,
    parse_decision,
)
from autopersona_flows.flows.context import AnsweredQuestion
from autopersona_flows.flows.graph import TaskGraph, TaskNode
from autopersona_flows.flows.tasks import NodeSteps, node_request

__all__ = ["Early", "ask_early", "early_requirements"]


def _early(requirement: Requirement) -> bool:
    return requirement.required and requirement.ask == "early"


def early_requirements(graph: TaskGraph) -> list[tuple[TaskNode, Requirement]]:
    """The required requirements of ``graph`` to check before it runs, each name once.

    In the order the graph runs its nodes; a requirement several nodes declare is
    checked (and asked) at the first of them.
    """
    seen: set[str] = set()
    found = []
    for node_id in graph.order:
        node = graph.nodes[node_id]
        for requirement in node.requires:
            name = requirement.name.casefold()
            if _early(requirement) and name not in seen:
                seen.add(name)
                found.append((node, requirement))
    return found


class Early(NamedTuple):
    """What asking early found out, by node.

    Attributes:
        answers: The questions of each node's requirements answered early.
        decided: The final decisions of the nodes the check decided with their own
            request (a node whose one requirement was checked, or whose requirements
            are all early), if nothing was asked: an answer learned early may
            change what any node is told.
    """

    answers: dict[str, list[AnsweredQuestion]]
    decided: dict[str, FinalDecision]


def ask_early(
    steps: NodeSteps,
    graph: TaskGraph,
    infos: dict[str, NodeInfo],
    *,
    user_id: str,
    query: str,
    tools: list[str],
) -> Early:
    """Ask what the graph needs and memory lacks, before any of its tools runs.

    One check step decides each early requirement on its own (a request naming
    only it), so the agent says for each whether memory holds it; each it asks
    about is asked now and its answer learned, in steps of the node that declares it
    first. Nothing is asked if memory holds everything. The step also decides each
    other node whose requirements are all early (see `Early.decided`). ``infos`` are
    the graph's nodes as the agent is told of them, by id.
    """
    checks = early_requirements(graph)
    if not checks:
        return Early({}, {})
    # Each early requirement on its own, at the first node that declares it; then each
    # other node whose requirements are all early, with its own request.
    own = {node.id for node, requirement in checks if node.requires == [requirement]}
    whole = [
        node
        for node in (graph.nodes[node_id] for node_id in graph.order)
        if node.id not in own and node.requires and all(map(_early, node.requires))
    ]
    asked = [(node, [requirement]) for node, requirement in checks]
    requests = [
        node_request(infos[node.id], requirements, user_id=user_id, query=query, tools=tools)
        for node, requirements in [*asked, *((node, node.requires) for node in whole)]
    ]
    made = [parse_decision(_json.dumps(raw)) for raw in steps.check_requirements(requests)]
    checked, rest = made[: len(checks)], made[len(checks) :]
    questions = [
        # The request names only this requirement: the question is about it.
        (node.id, decision.model_copy(update={"requirement": requirement.name}))
        for (node, requirement), decision in zip(checks, checked, strict=True)
        if isinstance(decision, ClarifyDecision)
    ]
    # The decisions of the nodes' own requests are theirs if nothing was asked: an
    # answer learned now may change what any node is told.
    theirs = [(node, d) for (node, _), d in zip(checks, checked, strict=True) if node.id in own]
    theirs += zip(whole, rest, strict=True)
    decided = (
        {}
        if questions
        else {node.id: decision for node, decision in theirs if isinstance(decision, FinalDecision)}
    )
    answered: dict[str, AnsweredQuestion] = {}  # by requirement name, casefolded
    if questions:
        given = steps.answers(questions, user_id, [], where="start")
        for (node_id, decision), answer in zip(questions, given, strict=True):
            learned = steps.remember(node_id, "-early", user_id, decision, answer)
            answered[str(decision.requirement).casefold()] = learned
    answers = {
        node_id: [
            answered[r.name.casefold()] for r in node.requires if r.name.casefold() in answered
        ]
        for node_id, node in graph.nodes.items()
    }
    return Early(answers, decided)
