"""Cache keys, pause keys and the clarification form: pure functions, no Prefect server."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from typing import Any

import jsonschema
import pytest
from pydantic import ValidationError

from autopersona_flows.agent import ClarifyDecision
from autopersona_flows.flows.cache_policies import NodeCachePolicy, node_cache_key
from autopersona_flows.flows.clarification import clarification_form, clarification_key

INPUTS = {
    "query": "Finish my paper",
    "answer": None,
    "inputs": {"fetch": {"urls": ["a", "b"], "count": 2}, "outline": "1. intro"},
    "scores": [0.5, 1, True],
}
SAFE_FILE_NAME = re.compile(r"^[a-z0-9-]{1,200}$")
PAUSE_KEY = re.compile(r"^[a-z0-9-]+$")


def reordered(value):
    """The same JSON with every object's keys in reverse insertion order."""
    if isinstance(value, dict):
        return {key: reordered(value[key]) for key in reversed(value)}
    if isinstance(value, list):
        return [reordered(item) for item in value]
    return value


def test_keys_differ_across_nodes_kinds_and_episodes_with_equal_inputs() -> None:
    base = node_cache_key("run", "ep-1", "draft", INPUTS)
    assert node_cache_key("run", "ep-1", "outline", INPUTS) != base
    assert node_cache_key("decide", "ep-1", "draft", INPUTS) != base
    assert node_cache_key("learn", "ep-1", "draft", INPUTS) != base
    assert node_cache_key("run", "ep-2", "draft", INPUTS) != base
    assert node_cache_key("run", "ep-1", "draft", {**INPUTS, "answer": "APA"}) != base


def test_a_run_task_is_keyed_on_its_inputs_and_what_prefect_resolved_as_one() -> None:
    # A graph node's run task gets what is known at submit and what Prefect resolves
    # (upstream results) as two parameters; a remote run task gets them as one. Both
    # must give the key of the whole, or a replay would miss what an earlier run kept.
    policy = NodeCachePolicy(kind="run")
    known = {name: value for name, value in INPUTS.items() if name != "inputs"}

    def key(**parameters: object) -> str | None:
        no_context: Any = None  # the policy reads only the parameters
        return policy.compute_key(
            no_context, {"episode_id": "ep", "node_id": "draft", **parameters}, {}
        )

    whole = node_cache_key("run", "ep", "draft", INPUTS)
    assert key(inputs=INPUTS) == whole
    assert key(inputs=known, resolved={"inputs": INPUTS["inputs"]}) == whole
    assert key(inputs=known, resolved={"inputs": {"fetch": {"urls": ["a"]}}}) != whole


def test_node_ids_with_the_same_slug_still_get_different_keys() -> None:
    keys = {node_cache_key("run", "ep", node_id, INPUTS) for node_id in ("Draft_1", "draft-1")}
    assert len(keys) == 2
    assert all(key.startswith("autopersona-run-draft-1-") for key in keys)


def test_equal_json_gives_equal_keys_whatever_the_key_order() -> None:
    assert list(reordered(INPUTS)) != list(INPUTS)
    assert node_cache_key("run", "ep", "draft", reordered(INPUTS)) == node_cache_key(
        "run", "ep", "draft", INPUTS
    )


def test_keys_are_stable_across_processes_and_hash_seeds() -> None:
    script = (
        "import json, sys\n"
        "from autopersona_flows.flows.cache_policies import node_cache_key\n"
        "print(node_cache_key('run', 'ep-1', 'draft', json.loads(sys.argv[1])))\n"
    )
    here = node_cache_key("run", "ep-1", "draft", INPUTS)
    for seed in ("1", "4242"):
        out = subprocess.run(
            [sys.executable, "-c", script, json.dumps(reordered(INPUTS))],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        )
        assert out.stdout.strip() == here


@pytest.mark.parametrize(
    "node_id",
    ["draft", "Draft_Paper.v2", "../../etc/passwd", "ÄÖÜ naïve ✓", "---", "", "x" * 300],
)
def test_keys_are_safe_file_names(node_id: str) -> None:
    key = node_cache_key("run", "ep/1:*?", node_id, INPUTS)
    assert SAFE_FILE_NAME.match(key), key


def question(text: str, options: list[str] | None = None) -> ClarifyDecision:
    return ClarifyDecision(question=text, requirement="citation style", options=options or [])


@pytest.mark.parametrize("node_id", ["draft", "Draft_Paper.v2", "ÄÖÜ ✓", "---", "x" * 300])
def test_pause_keys_are_lowercase_letters_digits_and_dashes(node_id: str) -> None:
    key = clarification_key(node_id, question("Which citation style?"))
    assert PAUSE_KEY.match(key), key
    assert key.startswith("clarify-")


def test_pause_keys_are_deterministic_and_differ_per_question_and_node() -> None:
    which = question("Which citation style?")
    assert clarification_key("draft", which) == clarification_key("draft", which)
    assert clarification_key("draft", which) != clarification_key("draft", question("Which tone?"))
    assert clarification_key("draft", which) != clarification_key("Draft", which)


def test_a_form_with_options_is_a_required_choice() -> None:
    form = clarification_form(question("Which citation style?", ["APA", "MLA"]))
    schema = form.model_json_schema()
    assert schema["required"] == ["answer"]
    assert schema["properties"]["answer"]["enum"] == ["APA", "MLA"]
    assert "description" not in schema["properties"]["answer"]  # the dialog shows the question
    assert "default" not in schema["properties"]["answer"]
    # The server validates resume input against this schema with jsonschema.
    jsonschema.validate({"answer": "MLA"}, schema)
    for bad in ({"answer": "Harvard"}, {"answer": ""}, {}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
    assert form(answer="APA").answer == "APA"
    with pytest.raises(ValidationError):
        form(answer="Harvard")


def test_a_form_without_options_is_required_non_empty_text() -> None:
    form = clarification_form(question("Which citation style?"))
    schema = form.model_json_schema()
    assert schema["required"] == ["answer"]
    answer = schema["properties"]["answer"]
    assert (answer["type"], answer["minLength"], answer["pattern"]) == ("string", 1, r"\S")
    assert "enum" not in answer
    assert "default" not in answer
    jsonschema.validate({"answer": "Harvard"}, schema)
    for empty in ({"answer": ""}, {"answer": "  "}, {}):  # an empty resume is rejected
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(empty, schema)
    for blank in ("", "   "):
        with pytest.raises(ValidationError):
            form(answer=blank)
