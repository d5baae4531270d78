"""Task graph validation: every malformed graph is a GraphError naming the nodes."""

import itertools
import random
import re
import sys
from collections.abc import Callable

import pytest
from prefect.utilities.callables import parameter_schema
from prefect.utilities.schema_tools import validate
from pydantic import ValidationError

from autopersona_flows.agent import Requirement
from autopersona_flows.errors import GraphError
from autopersona_flows.flows import AutopersonaSettings, graph_runner
from autopersona_flows.flows.graph import GraphSpec, NodeSpec, TaskGraph, TaskNode, resolve_tool


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


def test_a_small_cycle_is_named_exactly() -> None:
    with pytest.raises(GraphError) as info:
        TaskGraph([node("start"), node("b", "a"), node("c", "b"), node("a", "start", "c")])
    # Named from the node declared first, in the order the nodes would run.
    assert str(info.value) == (
        "the graph has a cycle through 'b' -> 'c' -> 'a' -> 'b'; "
        "3 nodes in all are on a cycle or depend on one"
    )


def test_the_count_takes_every_node_a_cycle_holds_up() -> None:
    # Two cycles, a node between them and one after: all seven can never run.
    nodes = [
        node("start"),
        node("a", "b", "start"),
        node("b", "a"),
        node("between", "b"),
        node("c", "e", "between"),
        node("d", "c"),
        node("e", "d"),
        node("after", "e"),
    ]
    with pytest.raises(GraphError, match=r"; 7 nodes in all are on a cycle or depend on one$"):
        TaskGraph(nodes)


def test_a_long_cycle_is_named_in_a_bounded_message() -> None:
    size = 2_000
    ids = [f"step-{i:04d}" for i in range(size)]
    nodes = [node(ids[i], ids[i - 1]) for i in range(size)]  # step-0000 needs step-1999
    nodes = [node("root"), *random.Random(7).sample(nodes, size), node("leaf", ids[5])]
    depends_on = {n.id: set(n.depends_on) for n in nodes}

    with pytest.raises(GraphError) as info:
        TaskGraph(nodes)

    message = str(info.value)
    assert len(message) < 1_000
    assert message.endswith(f"; {size + 1} nodes in all are on a cycle or depend on one")
    shown, more, closing = re.fullmatch(
        r"the graph has a cycle through (.*) -> … \((\d+) more\) -> '([^']+)'; .*", message
    ).groups()
    named = [name.strip("'") for name in shown.split(" -> ")]
    assert len(named) == 10
    assert len(named) + int(more) == size
    assert closing == named[0]
    for before, after in itertools.pairwise(named):
        assert before in depends_on[after], f"{after} does not depend on {before}"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"id": "", "tool": tool}, "node id"),
        ({"id": "has space", "tool": tool}, "node id"),
        ({"id": "../x", "tool": tool}, "node id"),
        ({"id": "a", "tool": 42}, "callable or an import path"),
        ({"id": "a", "tool": "not an import path"}, "package.module:function"),
        ({"id": "a", "tool": "json:codecs.sys.exit"}, "not a dotted path"),
        ({"id": "a", "tool": "json..decoder:f"}, "package.module:function"),
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
        resolve_tool("autopersona_flows.memory.records:LAYERS")
    requires = [Requirement("citation style", options=["APA", "MLA"])]
    assert (
        TaskNode(id="cite", tool="autopersona_flows.memory.text:terms", requires=requires).requires
        == requires
    )


@pytest.mark.parametrize("path", ["json:codecs.sys.exit", "examples.reading_group:os.sys.exit"])
def test_a_tool_path_is_one_function_of_a_module_not_a_path_through_it(path: str) -> None:
    # Walking the attributes would reach sys.exit through the modules json imports.
    for build in (TaskNode, NodeSpec):
        with pytest.raises(ValidationError, match=rf"tool '{path}' .*not a dotted path"):
            build(id="a", tool=path)
    with pytest.raises(GraphError, match=rf"tool '{path}' .*not a dotted path"):
        resolve_tool(path)  # as for a node built without validation


def allow(*names: str) -> Callable[[str], bool]:
    return AutopersonaSettings(tool_modules=",".join(names)).allows_module


def test_an_allow_list_refuses_a_module_before_importing_it(tool_modules) -> None:
    tool = f"{tool_modules.unimported}:record"

    with pytest.raises(GraphError, match=rf"tool '{tool}' is outside the allowed tool modules"):
        resolve_tool(tool, allowed=allow(tool_modules.package))

    assert tool_modules.unimported not in sys.modules
    assert tool_modules.forbidden_calls() == []


def test_an_allow_list_refuses_a_function_only_imported_into_an_allowed_module(
    tool_modules,
) -> None:
    allowed = allow(tool_modules.package)

    with pytest.raises(
        GraphError,
        match=rf"defined in '{tool_modules.forbidden}', outside the allowed tool modules",
    ):
        resolve_tool(f"{tool_modules.allowed}:record", allowed=allowed)
    with pytest.raises(GraphError, match=r"defined in '(posix|nt)'"):
        resolve_tool("os:system", allowed=allow("os"))  # os only imports it from posix
    with pytest.raises(GraphError, match="defined in 'builtins'"):
        resolve_tool(f"{tool_modules.allowed}:__class__", allowed=allowed)  # every module's

    summarise = resolve_tool(f"{tool_modules.allowed}:summarise", allowed=allowed)
    assert summarise is sys.modules[tool_modules.allowed].summarise
    # Without an allow-list a re-export is fine: packages re-export their own functions.
    assert (
        resolve_tool(f"{tool_modules.allowed}:record") is sys.modules[tool_modules.forbidden].record
    )
    assert tool_modules.forbidden_calls() == []


# --------------------------------------------------------------------------- GraphSpec

TOOL_MODULES = "PREFECT_INTEGRATIONS_AUTOPERSONA_TOOL_MODULES"
GATHER = "examples.reading_group:gather_sources"


def spec_node(node_id: str, *depends_on: str, tool: str = GATHER) -> dict[str, object]:
    return {"id": node_id, "tool": tool, "depends_on": list(depends_on)}


@pytest.fixture
def allow_examples(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tools from the example modules only, as the reading-group deployment's worker has."""
    monkeypatch.setenv(TOOL_MODULES, "examples")


@pytest.mark.parametrize(
    ("nodes", "message"),
    [
        (
            [spec_node("a", "b"), spec_node("b", "a")],
            "the graph has a cycle through 'a' -> 'b' -> 'a'; 2 nodes in all",
        ),
        ([spec_node("a", "ghost")], "node 'a' depends on unknown node 'ghost'"),
        ([spec_node("a"), spec_node("a")], "node id 'a' is used twice"),
        ([spec_node("a", "a")], "node 'a' depends on itself"),
    ],
)
def test_a_graph_spec_refuses_a_malformed_graph_when_it_is_built(nodes, message) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)) as info:
        GraphSpec.model_validate({"nodes": nodes})
    [error] = info.value.errors()
    assert error["loc"] == ("nodes",)


def test_a_graph_spec_refuses_a_tool_outside_the_allowed_modules_without_importing_it(
    allow_examples, tool_modules
) -> None:
    tool = f"{tool_modules.unimported}:record"

    with pytest.raises(ValidationError) as info:
        GraphSpec.model_validate({"nodes": [spec_node("fine"), spec_node("b", tool=tool)]})

    [error] = info.value.errors()
    assert error["loc"] == ("nodes",)
    assert error["msg"] == (
        f"Value error, node 'b' names tool '{tool}', outside the allowed modules 'examples' "
        f"({TOOL_MODULES})"
    )
    assert tool_modules.unimported not in sys.modules


def test_a_graph_spec_takes_any_module_when_no_allow_list_is_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(TOOL_MODULES, raising=False)
    spec = GraphSpec.model_validate({"nodes": [spec_node("a"), spec_node("b", "a", tool="os:x")]})
    assert spec.to_graph().order == ["a", "b"]


def form_problems(parameters: dict[str, object]) -> list[str]:
    """What the run form of `graph_runner` says about ``parameters``, as Prefect checks it."""
    schema = parameter_schema(graph_runner).model_dump_for_openapi()
    return [error.message for error in validate(parameters, schema, ignore_required=True)]


def graph_form(*nodes: dict[str, object]) -> dict[str, object]:
    return {"graph": {"nodes": list(nodes)}, "user_id": "ada", "query": "q"}


@pytest.mark.parametrize(
    ("node_fields", "problem"),
    [
        ({"id": "has space"}, "'has space' does not match"),
        ({"id": "../x"}, "'../x' does not match"),
        ({"depends_on": ["a b"]}, "'a b' does not match"),
        ({"depends_on": ["fine", "fine"]}, "['fine', 'fine'] has non-unique elements"),
        ({"tool": "subprocess:getoutput"}, "'subprocess:getoutput' does not match"),
        ({"tool": "examplesx.tools:draft"}, "'examplesx.tools:draft' does not match"),
    ],
)
def test_the_run_form_refuses_what_its_schema_can_say(allow_examples, node_fields, problem) -> None:
    bad = {**spec_node("b", "fine"), **node_fields}
    assert form_problems(graph_form(spec_node("fine"), spec_node("c", "fine"))) == []
    [message] = form_problems(graph_form(spec_node("fine"), bad))
    assert message.startswith(problem)


def test_the_run_form_names_the_allowed_modules_only_where_they_are_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The schema is written where it is generated (by `prefect deploy`): a tool
    # outside the modules is refused by the form only if that environment sets them.
    monkeypatch.delenv(TOOL_MODULES, raising=False)
    assert form_problems(graph_form(spec_node("a", tool="subprocess:getoutput"))) == []
    monkeypatch.setenv(TOOL_MODULES, " examples , my_company.tools ")
    assert form_problems(graph_form(spec_node("a", tool="my_company.tools.mail:send"))) == []
    [message] = form_problems(graph_form(spec_node("a", tool="my_company:send")))
    assert message.startswith("'my_company:send' does not match")


def test_the_run_form_cannot_refuse_a_cycle_or_an_unknown_dependency(allow_examples) -> None:
    # JSON schema cannot say "acyclic" or "names another node's id": the worker
    # refuses these when it validates the parameters (tests/flows/test_graph_runs.py).
    assert form_problems(graph_form(spec_node("a", "b"), spec_node("b", "a"))) == []
    assert form_problems(graph_form(spec_node("a", "ghost"))) == []
    assert form_problems(graph_form(spec_node("a"), spec_node("a"))) == []
