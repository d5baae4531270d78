"""Task graph validation: every malformed graph is a GraphError naming the nodes."""

import pytest
from pydantic import ValidationError

from autopersona_flows.agent import Requirement
from autopersona_flows.errors import GraphError
from autopersona_flows.flows.graph import TaskGraph, TaskNode, resolve_tool


def tool(**_: object) -> str:
    return "done"


def node(node_id: str, *depends_on: str, **fields) -> TaskNode:
    return TaskNode(id=node_id, tool=tool, depends_on=list(depends_on), **fields)


def test_order_is_topological_with_declaration_order_breaking_ties() -> None:
    graph = TaskGraph(
        [
            node("report", "analyse", "charts"),
            node("fetch"),
            node("charts", "fetch"),
            node("analyse", "fetch"),
            node("notify"),
        ]
    )
    assert graph.order == ["fetch", "charts", "analyse", "report", "notify"]
    assert graph.ancestors("report") == {"fetch", "charts", "analyse"}
    assert len(graph) == 5


@pytest.mark.parametrize(
    ("nodes", "message"),
    [
        ([], "at least one node"),
        ([node("a"), node("a")], "'a' is used twice"),
        ([node("a", "ghost")], "'a' depends on unknown node 'ghost'"),
        ([node("a", "a")], "'a' depends on itself"),
        (
            [node("a", "c"), node("b", "a"), node("c", "b")],
            "cycle through 'a' -> 'b' -> 'c' -> 'a'",
        ),
        ([node("x"), node("a", "b", "x"), node("b", "a")], "cycle through"),
        (["not a node"], "must be TaskNode"),
    ],
)
def test_malformed_graphs_are_graph_errors(nodes, message) -> None:
    with pytest.raises(GraphError, match=message):
        TaskGraph(nodes)


def test_a_cycle_message_names_only_the_nodes_on_it() -> None:
    with pytest.raises(GraphError) as info:
        TaskGraph([node("start"), node("a", "start", "b"), node("b", "a"), node("end", "b")])
    assert "'start'" not in str(info.value)
    assert "'end'" not in str(info.value)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"id": "", "tool": tool}, "node id"),
        ({"id": "has space", "tool": tool}, "node id"),
        ({"id": "../x", "tool": tool}, "node id"),
        ({"id": "a", "tool": 42}, "callable or an import path"),
        ({"id": "a", "tool": "not an import path"}, "package.module:function"),
        ({"id": "a", "tool": tool, "depends_on": ["b", "b"]}, "repeats"),
        ({"id": "a", "tool": tool, "requires": [{"name": ""}]}, "requires"),
    ],
)
def test_malformed_nodes_are_validation_errors(fields, message) -> None:
    with pytest.raises(ValidationError, match=message):
        TaskNode(**fields)


def test_tools_resolve_from_import_paths() -> None:
    from autopersona_flows.memory.text import terms

    assert resolve_tool("autopersona_flows.memory.text:terms") is terms
    assert resolve_tool(tool) is tool
    with pytest.raises(GraphError, match="cannot import tool"):
        resolve_tool("no_such_module:thing")
    with pytest.raises(GraphError, match="not a callable"):
        resolve_tool("autopersona_flows.memory:LAYERS")
    requires = [Requirement("citation style", options=["APA", "MLA"])]
    assert (
        TaskNode(id="cite", tool="autopersona_flows.memory.text:terms", requires=requires).requires
        == requires
    )
