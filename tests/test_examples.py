"""Every example runs offline and prints what it promises."""

import os
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_quickstart_asks_once_runs_each_tool_once_and_remembers() -> None:
    # Its own embedded server and Prefect home, whatever the test session uses.
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "PREFECT_HOME")}
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "quickstart.py")],
        capture_output=True,
        text=True,
        check=False,
        timeout=400,
        env=env,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    question = "To format the references, which citation style would you like? APA, MLA or Chicago?"
    assert f"[paused] {question}" in out
    assert "[ada answers] APA" in out
    assert (
        "tool calls: {'gather_sources': 1, 'draft': 1, 'format_references': 1, 'share': 1}" in out
    )
    assert f"format_references  final    asked {question!r}: APA" in out
    assert "questions asked: none" in out
    assert out.count("[APA] Robertson 2009 (BM25)") == 2  # applied in both runs
    assert "'APA'" in out.split("persona memory now:")[1]


def test_evaluate_clarification_runs_on_its_synthetic_set() -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "evaluate_clarification.py")],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "== synthetic set: 8 cases" in result.stdout
    assert "decision accuracy        1.000" in result.stdout
    assert "== applied for the references: ['citation style: APA (APA 7)']" in result.stdout


def test_the_deployed_graph_is_the_example_graph() -> None:
    # prefect.yaml repeats the example graph as the run form's defaults: keep them equal.
    import yaml

    from autopersona_flows.flows import GraphSpec
    from examples.reading_group import GRAPH

    config = yaml.safe_load((EXAMPLES.parent / "prefect.yaml").read_text())
    (runner,) = [d for d in config["deployments"] if d["name"] == "reading-group"]
    assert GraphSpec.model_validate(runner["parameters"]["graph"]) == GRAPH
    assert runner["entrypoint"] == "deployments/graph_runner.py:graph_runner"
