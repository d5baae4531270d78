"""The ``eval`` command: benchmarks of the default agent and memory."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from autopersona_flows import _json
from autopersona_flows.agent.agent import PersonaAgent
from autopersona_flows.agent.evaluation import (
    cases_kind,
    evaluate_clarification_policy,
    evaluate_judgement,
    evaluate_timeline,
    read_clarification_cases,
    read_judgement_cases,
    read_timeline_cases,
    seed_memories,
)
from autopersona_flows.agent.evaluation.chats import evaluate_chats, read_chat_cases
from autopersona_flows.agent.evaluation.situations import (
    evaluate_situations,
    read_situation_episodes,
)
from autopersona_flows.agent.evaluation.tiers import TIER_NAMES, Tier, tier
from autopersona_flows.cli.root import EMBEDDER_HELP, Steps, app, existing_store
from autopersona_flows.errors import EvaluationError
from autopersona_flows.memory.embedders import get_embedder
from autopersona_flows.memory.retrieval import MemoryRetriever
from autopersona_flows.memory.stores import open_store

__all__: list[str] = []  # commands only: they register on the app

PANEL = "Benchmarks"


@app.command("eval", rich_help_panel=PANEL)
def eval_command(  # noqa: PLR0917 - a command's parameters are its command line
    cases: Annotated[
        Path,
        typer.Argument(
            metavar="CASES",
            help="One case a line: judgement, clarification, memory-over-time, "
            "context-dependent episode or chat history (told apart by its fields).",
            show_default=False,
        ),
    ],
    store: Annotated[
        str | None,
        typer.Option(
            "--store",
            help="A clarification set's store folder (created by --seed if missing); a "
            "judgement benchmark brings its own memories and runs in a temporary store.",
        ),
    ] = None,
    json: Annotated[bool, typer.Option("--json", help="Print a judgement report as JSON.")] = False,
    seed: Annotated[
        str | None,
        typer.Option(
            "--seed",
            metavar="MEMORIES",
            help="JSONL memories to write into the store first; its users must have none yet.",
        ),
    ] = None,
    embedder: Annotated[str, typer.Option("--embedder", help=EMBEDDER_HELP)] = "semantic",
    tier: Annotated[
        str,
        typer.Option(
            "--tier",
            help="semantic (the default agent) or no-model (words and rules only), for "
            "judgement, context-dependent and chat benchmarks.",
        ),
    ] = "semantic",
) -> None:
    """Run the default agent on a benchmark.

    A judgement benchmark or a memory-over-time benchmark prints a table per
    category; context-dependent episodes a table per phase; long-term chat cases
    what was answered and asked; a clarification set, run against --store, prints
    a JSON report. Reports hold names, labels, actions and metrics, never memory
    contents.
    """
    kind = cases_kind(cases)
    if tier not in TIER_NAMES:
        raise EvaluationError(f"unknown tier {tier!r}: use one of {', '.join(TIER_NAMES)}")
    if kind != "clarification":
        given = [
            flag for flag, value in (("--store", store), ("--seed", seed)) if value is not None
        ]
        if given:
            raise EvaluationError(
                f"{cases} is a {kind} benchmark, whose cases bring their own memories: "
                f"{' and '.join(given)} apply to clarification sets only"
            )
        if kind == "timeline":
            _eval_timeline(cases, embedder, json=json)
        elif kind == "judgement":
            _eval_judgement(cases, tier, json=json)
        elif kind == "situations":
            _eval_situations(cases, tier, json=json)
        else:
            _eval_chats(cases, tier, json=json)
        return
    if store is None:
        raise EvaluationError(
            f"{cases} is a clarification set (its cases have no 'expect'), which runs "
            "against a store: give --store"
        )
    read = read_clarification_cases(cases)  # all of it, before anything is written
    chosen = get_embedder(embedder)
    if seed is None:
        opened = existing_store(store)
    else:
        opened = open_store(store)
        seeded = seed_memories(opened, seed, chosen)
        print(
            f"seeded {sum(seeded.values())} memories of {len(seeded)} users into {store}",
            file=sys.stderr,
        )
    agent = PersonaAgent(MemoryRetriever(opened, chosen))
    with Steps(f"evaluating {len(read)} cases", None, "cases"):
        report = evaluate_clarification_policy(agent, read)
    # Names, labels, actions and metrics only: decisions quote memory contents.
    print(_json.dumps(report.to_dict()).decode())


_COLUMNS = (
    ("cases", "cases"),
    ("accuracy", "accuracy"),
    ("decision_accuracy", "decision"),
    ("clarification_precision", "ask P"),
    ("clarification_recall", "ask R"),
    ("clarification_f1", "ask F1"),
    ("unnecessary_question_rate", "unneeded"),
    ("repeat_question_rate", "repeat"),
    ("adherence", "adherence"),
    ("near_miss_acceptance", "near miss"),
    ("consistency", "consistent"),
    ("latency_p50_ms", "p50 ms"),
)


def _category_table(
    title: str,
    columns: Sequence[tuple[str, str]],
    categories: Mapping[str, Any],
    overall: Any,
    width: int,
) -> None:
    """Print scores per category, then overall, as a Rich table of ``columns``."""
    table = Table(title=title)
    table.add_column("category")
    for _, heading in columns:
        table.add_column(heading, justify="right")
    rows = [*categories.items(), ("all", overall)]
    for name, scores in rows:
        cells = [getattr(scores, field) for field, _ in columns]
        table.add_row(
            name,
            *(
                "-" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)
                for value in cells
            ),
            end_section=name == rows[-2][0],
        )
    Console(width=width).print(table)


def _eval_judgement(path: Path, name: Tier, *, json: bool) -> None:
    cases = read_judgement_cases(path)
    factory, embedder = tier(name)
    with Steps(f"judging {len(cases)} cases", None, "cases"):
        report = evaluate_judgement(cases, factory, embedder=embedder)
    if json:
        # Names, labels, actions and metrics only: decisions quote memory contents.
        print(_json.dumps(report.to_dict()).decode())
        return
    title = f"judgement benchmark: {path} ({name}: {embedder.name})"
    _category_table(title, _COLUMNS, report.categories, report.overall, width=160)
    wrong = [result.name for result in report.results if not result.correct]
    if wrong:
        print(f"{len(wrong)} cases not right: {', '.join(wrong)}")


_TIMELINE_COLUMNS = (
    ("cases", "cases"),
    ("checks", "checks"),
    ("new_first", "new first"),
    ("stale", "stale first"),
    ("stale_live", "stale live"),
    ("expired", "expired"),
)


def _eval_timeline(path: Path, embedder_name: str, *, json: bool) -> None:
    cases = read_timeline_cases(path)
    embedder = get_embedder(embedder_name)
    with Steps(f"replaying {len(cases)} timelines", None, "cases"):
        report = evaluate_timeline(cases, embedder=embedder)
    if json:
        print(_json.dumps(report.model_dump(mode="json")).decode())
        return
    title = f"memory over time: {path} ({embedder.name})"
    _category_table(title, _TIMELINE_COLUMNS, report.categories, report.overall, width=120)
    print(f"ingested {report.messages_per_second:.0f} messages/s")
    if report.failures:
        print(f"{len(report.failures)} checks not right: {'; '.join(report.failures)}")


def _eval_situations(path: Path, name: Tier, *, json: bool) -> None:
    episodes = read_situation_episodes(path)
    factory, _ = tier(name)
    with Steps(f"running {len(episodes)} episodes", None, "episodes"):
        report = evaluate_situations(episodes, factory)
    if json:
        print(_json.dumps(report.model_dump(mode="json")).decode())
        return
    table = Table(title=f"context-dependent preferences: {path} ({name})")
    for heading in ("phase", "rounds", "right", "right unasked", "asks a task", "repeats"):
        table.add_column(heading, justify="right")
    for phase, scores in [*report.phases.items(), ("all", report.overall)]:
        repeats = scores.repeat_question_rate
        table.add_row(
            phase,
            str(scores.rounds),
            f"{scores.right:.3f}",
            f"{scores.right_unasked:.3f}",
            f"{scores.questions_per_task:.2f}",
            "-" if repeats is None else f"{repeats:.3f}",
        )
    Console(width=100).print(table)


def _eval_chats(path: Path, name: Tier, *, json: bool) -> None:
    cases = read_chat_cases(path)
    factory, _ = tier(name)
    with Steps(f"ingesting and probing {len(cases)} chat histories", None, "histories"):
        report = evaluate_chats(cases, factory)
    if json:
        print(_json.dumps(report.model_dump(mode="json")).decode())
        return
    print(
        f"long-term chat memory: {path} ({name}): {report.probes} probes; answered from "
        f"memory {report.answered:.3f}, asked when memory lacks it {report.asked:.3f}"
    )
    if report.failures:
        print(f"{len(report.failures)} probes not right: {', '.join(report.failures)}")
