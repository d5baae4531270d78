"""Evaluate when the PersonaAgent asks: a small, synthetic, labelled set.

Runs offline in a temporary folder, with no server and no API key::

    python examples/evaluate_clarification.py

Everything here is **synthetic**: two invented users, a handful of invented
memories and eight requests, each labelled with what a careful assistant would
do: proceed (``final``) or ask one question first (``clarify``), and about what.
The example writes the memories and cases as JSONL (the format ``autopersona
eval`` reads), seeds a store, runs the default agent on the cases and prints the
headline metrics and every case's result. The committed evaluation set in
``tests/data/clarification/`` is larger; run it with ``autopersona eval``.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from autopersona_flows import JsonlMemoryStore, MemoryBank, PersonaAgent
from autopersona_flows.agent.evaluation import (
    evaluate_clarification_policy,
    read_clarification_cases,
    seed_memories,
)

# Mia's citation style changed in 2025; the timestamps make "the newest wins" testable.
MEMORIES = [
    {
        "user_id": "mia",
        "layer": "persona",
        "content": {"topic": "citation style", "preference": "Chicago"},
        "created_at": "2023-09-01T10:00:00Z",
    },
    {
        "user_id": "mia",
        "layer": "persona",
        "content": {"topic": "summary length", "preference": "one paragraph"},
        "created_at": "2024-02-01T10:00:00Z",
    },
    {
        "user_id": "mia",
        "layer": "persona",
        "content": {"topic": "citation style", "preference": "APA", "strategy": "APA 7"},
        "created_at": "2025-01-15T10:00:00Z",
    },
    {
        "user_id": "mia",
        "layer": "workspace",
        "content": {"task": "thesis", "state": {"draft": "thesis/chapter-2.md"}},
        "created_at": "2025-01-20T10:00:00Z",
    },
    # Another user's preference: it must never answer a question about Mia.
    {
        "user_id": "noah",
        "layer": "persona",
        "content": {"topic": "home airport", "preference": "Oslo (OSL)"},
        "created_at": "2024-05-05T10:00:00Z",
    },
]


def case(
    name: str,
    query: str,
    requirements: list[dict[str, object]],
    expected: str,
    *,
    layers: list[str] | None = None,
    requirement: str | None = None,
) -> dict[str, object]:
    """One labelled request of Mia's, as a line of a cases file."""
    line: dict[str, object] = {
        "name": name,
        "request": {
            "user_id": "mia",
            "query": query,
            "node": {"id": name, "instruction": query},
            "requirements": requirements,
        },
        "expected_action": expected,
    }
    if layers is not None:
        line["expected_layers"] = layers
    if requirement is not None:
        line["expected_requirement"] = requirement
    return line


CASES = [
    case(
        "references (preference evolved)",
        "Format the references of chapter 2",
        [{"name": "citation style"}],
        "final",
        layers=["persona"],
    ),
    case(
        "summary",
        "Summarise this article for me",
        [{"name": "summary length"}],
        "final",
        layers=["persona"],
    ),
    case(
        "continue the draft (workspace)",
        "Continue my thesis draft",
        [{"name": "draft", "layers": ["workspace"]}],
        "final",
    ),
    case("no requirements", "Explain what a confidence interval is", [], "final", layers=[]),
    case(
        "optional requirement missing",
        "Write the abstract",
        [{"name": "summary length"}, {"name": "keywords", "required": False}],
        "final",
    ),
    case(
        "slides (missing)",
        "Make slides for my defence",
        [{"name": "slide template", "options": ["university", "plain"]}],
        "clarify",
        layers=[],
        requirement="slide template",
    ),
    case(
        "flight (only another user knows)",
        "Book a flight to the conference",
        [{"name": "home airport"}],
        "clarify",
        requirement="home airport",
    ),
    case(
        "reference manager (a different topic only)",
        "Import the references into my reference manager",
        [{"name": "reference manager", "options": ["Zotero", "Mendeley"]}],
        "clarify",
        requirement="reference manager",
    ),
]


def write_jsonl(path: Path, lines: list[dict[str, object]]) -> Path:
    """Write one JSON object a line."""
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


def main() -> None:
    """Seed a temporary store, evaluate the default agent, print the report."""
    with tempfile.TemporaryDirectory(prefix="autopersona-eval-") as folder:
        root = Path(folder)
        memories = write_jsonl(root / "memories.jsonl", MEMORIES)
        cases = read_clarification_cases(write_jsonl(root / "cases.jsonl", CASES))

        bank = MemoryBank(JsonlMemoryStore(root / "store"))
        seed_memories(bank.store, memories, bank.embedder)  # embedded as the bank reads them
        agent = PersonaAgent(bank)  # the defaults: EvidencePolicy, the shipped sentence encoder
        report = evaluate_clarification_policy(agent, cases)

        print(f"== synthetic set: {report.cases} cases")
        print(f"decision accuracy        {report.decision_accuracy:.3f}")
        print(
            f"clarification P / R / F1 {report.clarification_precision:.3f} / "
            f"{report.clarification_recall:.3f} / {report.clarification_f1:.3f}"
        )
        print(
            f"  necessary {report.necessary_clarifications}, "
            f"unnecessary {report.unnecessary_clarifications}, "
            f"missed {report.missed_clarifications}, correct finals {report.correct_finals}"
        )
        print(f"requirement accuracy     {report.requirement_accuracy:.3f}")
        print(
            f"layer coverage / precision / exact ({report.layer_cases} labelled) "
            f"{report.layer_coverage:.3f} / {report.layer_precision:.3f} / "
            f"{report.layer_exact_match:.3f}"
        )
        print(f"median latency           {report.latency_p50_s * 1000:.2f} ms")

        print("== cases")
        for result in report.results:
            mark = "ok   " if result.correct else "WRONG"
            asked = f" (asks about {result.requirement!r})" if result.requirement else ""
            expected, got = result.expected_action, result.action
            print(f"  {mark} {result.name}: expected {expected}, got {got}{asked}")

        # The decision is kept in Python (not in the JSON report): the evolved preference
        # is the constraint applied.
        decision = report.result("references (preference evolved)").decision
        applied = [c.text for c in getattr(decision, "constraints", []) if c.requirement]
        print(f"== applied for the references: {applied}")


if __name__ == "__main__":
    main()
