"""The memory-over-time benchmark: the committed histories, the metrics, the CLI."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from autopersona_flows.agent.evaluation import (
    TIMELINE_CATEGORIES,
    TimelineCase,
    cases_kind,
    evaluate_timeline,
    read_timeline_cases,
)
from autopersona_flows.errors import EvaluationError

CASES = Path(__file__).resolve().parent.parent / "data" / "memory_time" / "cases.jsonl"
RunCli = Callable[..., subprocess.CompletedProcess[str]]


def case(**fields: Any) -> dict[str, Any]:
    """A small history: a seat preference that changes, checked at the end."""
    data: dict[str, Any] = {
        "name": "seat-changes",
        "category": "change",
        "user_id": "ada",
        "now": "2025-06-01T00:00:00Z",
        "sessions": [
            {
                "at": "2025-01-01T09:00:00Z",
                "query": "book a flight",
                "persona": [{"topic": "flight seat", "preference": "window"}],
            },
            {
                "at": "2025-03-01T09:00:00Z",
                "query": "another flight",
                "persona": [{"topic": "seat", "preference": "aisle now"}],
            },
        ],
        "ingest_order": [0, 1],
        "checks": [{"query": "flight seat", "current": "aisle", "stale": ["window"]}],
    }
    data.update(fields)
    return data


def test_the_committed_histories_cover_every_category_and_hold_their_floors() -> None:
    cases = read_timeline_cases(CASES)
    assert len(cases) >= 70
    assert {c.category for c in cases} == set(TIMELINE_CATEGORIES)
    report = evaluate_timeline(cases)
    # Floors a little under what the default measures (README, "Memory over time"):
    # a drop below them is a regression to explain, not noise.
    assert report.overall.new_first >= 0.53
    assert report.overall.stale <= 0.3
    assert report.overall.expired == 0.0
    assert report.categories["distinct"].stale <= 0.15
    assert report.messages_per_second > 0


def test_metrics_follow_what_the_bank_returns() -> None:
    right = TimelineCase.model_validate(case())
    report = evaluate_timeline([right])
    assert (report.overall.new_first, report.overall.stale, report.overall.stale_live) == (
        1.0,
        0.0,
        0.0,
    )
    # Fed backwards without times, the old value would win; with them it does not.
    backwards = TimelineCase.model_validate(case(name="backwards", ingest_order=[1, 0]))
    assert evaluate_timeline([backwards]).overall.new_first == 1.0
    # A check that cannot hold is reported, with what failed.
    wrong = TimelineCase.model_validate(
        case(checks=[{"query": "flight seat", "current": "middle", "stale": ["aisle"]}])
    )
    failed = evaluate_timeline([wrong])
    assert failed.overall.new_first == 0.0
    assert failed.overall.stale == 1.0
    assert failed.failures == ["seat-changes #0: current not first, stale first"]


def test_an_ended_fact_returned_counts_as_expired() -> None:
    bounded = TimelineCase.model_validate(
        case(
            category="bounded",
            sessions=[
                {
                    "at": "2025-01-06T09:00:00Z",
                    "query": "plan my week",
                    "persona": [{"topic": "office", "preference": "working from Leeds this week"}],
                }
            ],
            ingest_order=[0],
            checks=[{"query": "office", "current": None, "stale": ["leeds"], "expired": True}],
        )
    )
    assert evaluate_timeline([bounded]).overall.expired == 0.0


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"ingest_order": [0, 0]}, "ingest_order must list every session index once"),
        ({"category": "someday"}, "category"),
        ({"now": "2025-06-01T00:00:00"}, "timezone-aware"),
        ({"checks": []}, "checks"),
    ],
)
def test_a_bad_case_is_named_with_its_line(
    tmp_path: Path, fields: dict[str, Any], problem: str
) -> None:
    path = tmp_path / "cases.jsonl"
    path.write_bytes(orjson.dumps(case(name="fine")) + b"\n" + orjson.dumps(case(**fields)))
    assert cases_kind(path) == "timeline"
    with pytest.raises(EvaluationError, match=rf"(?s):2.*{problem}"):
        read_timeline_cases(path)


def test_the_cli_prints_the_table_and_refuses_store_options(
    run_cli: RunCli, tmp_path: Path
) -> None:
    path = tmp_path / "cases.jsonl"
    path.write_bytes(orjson.dumps(case()) + b"\n")
    shown = run_cli("eval", str(path))
    assert shown.returncode == 0, shown.stderr
    assert "memory over time" in shown.stdout
    assert "│ all " in shown.stdout
    as_json = run_cli("eval", str(path), "--json")
    assert orjson.loads(as_json.stdout)["overall"]["new_first"] == 1.0
    refused = run_cli("eval", str(path), "--store", str(tmp_path / "store"))
    assert refused.returncode == 1
    assert "timeline benchmark" in refused.stderr
    assert "Traceback" not in refused.stderr
