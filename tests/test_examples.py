"""Every example runs offline and prints what it promises."""

import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_quickstart_runs() -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "quickstart.py")],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for layer in ("== trajectory", "== workspace", "== persona"):
        assert layer in out
    assert "update: 'APA' -> 'MLA'" in out
    assert "{'trajectory': 2, 'workspace': 2, 'persona': 2}" in out


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
