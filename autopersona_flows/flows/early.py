"""Asking early: what a graph needs and memory lacks, asked before its first tool runs.

A question is worth most before work starts: once part of the work is done on a
guess, the answer may undo it. So before a graph runs a single tool, every required
requirement its nodes declare (``ask="early"``, the default) is checked against
memory, and each one memory cannot answer is asked, once however many nodes need
it. The nodes then decide with the answers in memory, and with the questions
answered in their inputs, so a replay rebuilds exactly the same steps.

The same check decides every node whose requirements are all checked early: when
memory holds them all and nothing is asked, that is the node's decision, and the
node is settled with no step of its own (the batch form of `Settler.settle`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

from autopersona_flows.agent.decisions import ClarifyDecision, FinalDecision, Requirement
from autopersona_flows.flows.context import AnsweredQuestion
from autopersona_flows.flows.graph import TaskGraph, TaskNode
from autopersona_flows.flows.settle import NodePlan, Settled, Settler

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
        settled: The nodes the check settled with their own request (a node whose
            one requirement was checked, or whose requirements are all early), if
            nothing was asked: an answer learned early may change what any node is
            told.
        operations: What learning the answers did to memory.
    """

    answers: dict[str, list[AnsweredQuestion]]
    settled: dict[str, Settled]
    operations: list[dict[str, str]]


def ask_early(settler: Settler, graph: TaskGraph, plans: dict[str, NodePlan]) -> Early:
    """Ask what the graph needs and memory lacks, before any of its tools runs.

    `Settler.settle_all` decides each early requirement on its own (a request naming
    only it), so the agent says for each whether memory holds it;
    each it asks about is asked now and its answer learned, in steps of the node
    that declares it first. Nothing is asked if memory holds everything. It also
    decides each other node whose requirements are all early (see
    `Early.settled`). ``plans`` are the graph's nodes as they are settled, by id.
    """
    checks = {
        f"{node.id}/{requirement.name}": (node.id, requirement)
        for node, requirement in early_requirements(graph)
    }
    if not checks:
        return Early({}, {}, [])
    # Each early requirement on its own, at the first node that declares it; then each
    # other node whose requirements are all early, with its own request.
    own = {
        node_id
        for node_id, requirement in checks.values()
        if plans[node_id].requirements == [requirement]
    }
    whole = [
        node_id
        for node_id in graph.order
        if node_id not in own
        and plans[node_id].requirements
        and all(map(_early, plans[node_id].requirements))
    ]
    requests = {
        check: replace(plans[node_id], requirements=[requirement])
        for check, (node_id, requirement) in checks.items()
    }
    # Steps of their own: once an answer is learned here, each node decides again.
    made = settler.settle_all(requests | {n: plans[n] for n in whole}, kind="check")
    questions = [
        # The request names only this requirement: the question is about it.
        (node_id, decision.model_copy(update={"requirement": requirement.name}))
        for check, (node_id, requirement) in checks.items()
        if isinstance(decision := made[check], ClarifyDecision)
    ]
    if questions:
        return _asked(settler, graph, questions, next(iter(plans.values())).user_id)
    # The decisions of the nodes' own requests are theirs: nothing was learned.
    theirs = {node_id: made[check] for check, (node_id, _) in checks.items() if node_id in own}
    theirs |= {node_id: made[node_id] for node_id in whole}
    settled = {
        node_id: Settled(decision, [], [])
        for node_id, decision in theirs.items()
        if isinstance(decision, FinalDecision)
    }
    return Early({}, settled, [])


def _asked(
    settler: Settler,
    graph: TaskGraph,
    questions: list[tuple[str, ClarifyDecision]],
    user_id: str,
) -> Early:
    """Ask ``questions`` in one form and learn the answers; each node gets those of its own."""
    answered: dict[str, AnsweredQuestion] = {}  # by requirement name, casefolded
    operations: list[dict[str, str]] = []
    given = settler.ask(questions, user_id, [])
    for (node_id, decision), answer in zip(questions, given, strict=True):
        learned, operation = settler.remember(node_id, "-early", user_id, decision, answer)
        answered[str(decision.requirement).casefold()] = learned
        operations += operation
    answers = {
        node_id: [
            answered[r.name.casefold()] for r in node.requires if r.name.casefold() in answered
        ]
        for node_id, node in graph.nodes.items()
    }
    return Early(answers, {}, operations)
