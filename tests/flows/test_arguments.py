"""A persona function's arguments: bound by name, expanded as Prefect maps, checked as JSON."""

from __future__ import annotations

import pytest
from prefect import unmapped
from prefect.exceptions import MappingLengthMismatch, MappingMissingIterable

from autopersona_flows.errors import FlowConfigurationError, NodeOutputError
from autopersona_flows.flows import NodeContext
from autopersona_flows.flows.arguments import ToolArguments


def cite(context: NodeContext, reference: str, *extra: str, style: str = "APA", **notes: int):
    return reference


ARGUMENTS = ToolArguments(cite, "cite")


def test_calls_bind_by_name_with_defaults_and_call_back_the_same() -> None:
    bound = ARGUMENTS.bind(("Knuth", "1984"), {"page": 3})
    assert bound == {"reference": "Knuth", "extra": ["1984"], "style": "APA", "notes": {"page": 3}}
    assert ARGUMENTS.bind(("Knuth",), {"style": "APA"}) == ARGUMENTS.bind(("Knuth",), {})
    assert ARGUMENTS.call(bound) == (("Knuth", "1984"), {"style": "APA", "page": 3})
    assert ARGUMENTS.names == ["reference", "extra", "style", "notes"]
    with pytest.raises(TypeError, match=r"cite\(\): missing a required argument: 'reference'"):
        ARGUMENTS.bind((), {})


def test_map_expands_iterables_and_keeps_the_rest_as_prefect_does() -> None:
    elements = ARGUMENTS.expand((["Knuth", "Lamport"],), {"style": unmapped(["APA", "MLA"])})
    assert [e["reference"] for e in elements] == ["Knuth", "Lamport"]
    assert all(e["style"] == ["APA", "MLA"] for e in elements)
    assert ARGUMENTS.expand(("Knuth",), {"style": ["APA", "MLA"]})[1]["style"] == "MLA"
    with pytest.raises(MappingLengthMismatch):
        ARGUMENTS.expand((["a", "b"],), {"style": ["APA"]})
    with pytest.raises(MappingMissingIterable):
        ARGUMENTS.expand(("Knuth",), {})


def test_a_non_json_argument_is_named_with_the_fix() -> None:
    with pytest.raises(NodeOutputError) as caught:
        ARGUMENTS.check({"reference": "Knuth", "style": ("APA",)}, resolved=False)
    message = str(caught.value)
    assert message.startswith("argument 'style' of 'cite' must be a JSON value: a tuple")
    assert "part of its cache key" in message
    assert "a list for a tuple or set" in message
    ARGUMENTS.check({"reference": "Knuth", "style": "APA"}, resolved=True)


def test_the_function_must_take_its_context_first() -> None:
    def keyword_only(*, context: NodeContext) -> None: ...

    with pytest.raises(FlowConfigurationError, match="NodeContext as its first positional"):
        ToolArguments(keyword_only, "keyword_only")
