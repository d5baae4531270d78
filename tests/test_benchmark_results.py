"""The benchmarks record what they print in benchmarks/RESULTS.md, each in its own section."""

from __future__ import annotations

import importlib.util
import re
import sys
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _load_common() -> ModuleType:
    # The scripts import it as `_common` (they run from benchmarks/); load it by path.
    spec = importlib.util.spec_from_file_location(
        "benchmarks_common", ROOT / "benchmarks/_common.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


common = _load_common()
WHEN = datetime(2026, 12, 5, 9, 30, tzinfo=UTC)


def section(text: str, name: str) -> str:
    start, end = f"<!-- --8<-- [start:{name}] -->", f"<!-- --8<-- [end:{name}] -->"
    return text.split(start, 1)[1].split(end, 1)[0]


def test_a_run_replaces_its_own_section_and_nothing_else(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    results.write_text((ROOT / "benchmarks" / "RESULTS.md").read_text(encoding="utf-8"))
    before = results.read_text(encoding="utf-8")

    common.record_results(
        "store_bench", "python benchmarks/store_bench.py", "add  1.0 ms\n", path=results, now=WHEN
    )

    after = results.read_text(encoding="utf-8")
    mine = section(after, "store_bench")
    assert "Recorded 2026-12-05 09:30 UTC on " in mine
    assert f"{common.machine()}; load average " in mine
    assert "```bash\npython benchmarks/store_bench.py\n```" in mine
    assert "```text\nadd  1.0 ms\n```" in mine
    assert "as last recorded" not in mine.lower()
    for other in re.findall(r"\[start:([-_0-9a-z]+)\]", before):
        if other != "store_bench":
            assert section(after, other) == section(before, other)
    assert (
        after.split("<!-- --8<-- [start:store_bench]")[0]
        == before.split("<!-- --8<-- [start:store_bench]")[0]
    )


def test_a_new_benchmark_gets_a_section_at_the_end(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    common.record_results("new_bench", "python benchmarks/new_bench.py", "1", path=results)
    common.record_results("new_bench", "python benchmarks/new_bench.py", "2", path=results)
    text = results.read_text(encoding="utf-8")
    assert text.startswith("# Benchmark results\n\n## new_bench\n")
    assert text.count("[start:new_bench]") == 1
    assert "```text\n2\n```" in section(text, "new_bench")


def test_the_environment_redirects_or_turns_recording_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(common.RESULTS_ENV, "off")
    assert common.record_results("x", "python x.py", "out") is None
    monkeypatch.setenv(common.RESULTS_ENV, str(tmp_path / "elsewhere.md"))
    assert common.record_results("x", "python x.py", "out") == tmp_path / "elsewhere.md"


def test_a_section_name_must_be_one_the_docs_can_include(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="section name"):
        common.record_results("Store Bench", "cmd", "out", path=tmp_path / "R.md")


def test_options_that_change_the_configuration_get_their_own_section() -> None:
    keyed = ["--tool-ms"]
    assert common.section_name("flow_overhead", [], keyed) == "flow_overhead"
    assert common.section_name("flow_overhead", ["--tool-ms", "20"], keyed) == (
        "flow_overhead-tool-ms-20"
    )
    assert common.section_name("flow_overhead", ["--reps=3", "--tool-ms=0.5"], keyed) == (
        "flow_overhead-tool-ms-0_5"
    )


def test_recorded_prints_as_before_and_records_the_output_and_exit_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    results = tmp_path / "RESULTS.md"
    monkeypatch.setenv(common.RESULTS_ENV, str(results))
    monkeypatch.setattr(sys, "argv", [str(ROOT / "benchmarks" / "demo.py"), "--quick"])

    def main() -> int:
        print("== a table")
        print("row  1.00x", flush=True)
        return 1  # a missed bar is a result too

    assert common.recorded("demo", main) == 1
    assert capsys.readouterr().out == "== a table\nrow  1.00x\n"
    mine = section(results.read_text(encoding="utf-8"), "demo")
    assert "```bash\npython benchmarks/demo.py --quick\n```" in mine
    assert "```text\n== a table\nrow  1.00x\n```" in mine
    assert "exit code 1" in mine


def test_a_run_that_raises_records_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    results = tmp_path / "RESULTS.md"
    monkeypatch.setenv(common.RESULTS_ENV, str(results))
    monkeypatch.setattr(sys, "argv", ["benchmarks/demo.py", "--help"])

    def main() -> int:
        print("usage: demo")
        raise SystemExit(0)

    with pytest.raises(SystemExit):
        common.recorded("demo", main)
    assert not results.exists()
    assert not isinstance(sys.stdout, common._Tee)  # stdout is given back


def test_every_benchmark_script_records_itself() -> None:
    for script in sorted((ROOT / "benchmarks").glob("*.py")):
        if script.name.startswith("_"):
            continue
        tail = script.read_text(encoding="utf-8").rstrip().splitlines()[-1]
        assert f'recorded("{script.stem}", main' in tail, script.name
