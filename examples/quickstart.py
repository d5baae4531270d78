"""Quickstart: a memory-aware task graph on Prefect that asks once, then remembers.

Runs offline and unattended, with no server to start and no API key::

    python examples/quickstart.py

1. A memory store in a temporary folder is seeded with two past tasks of Ada's.
2. A four-node graph (gather sources, draft, format references, share) runs as a
   Prefect flow on the embedded Prefect server. The PersonaAgent applies what it
   knows (tone, summary length) but the references step needs a citation style
   nobody has told it, so the run pauses with a typed question.
3. This script plays Ada: it waits for the Paused state, prints the question and
   answers through the Prefect API (in the UI this is the resume dialog).
4. The run finishes; each tool ran exactly once. The graph then runs again for
   Ada and is not asked anything: the answer was remembered.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

_workdir = Path(tempfile.mkdtemp(prefix="autopersona-quickstart-"))
if "PREFECT_API_URL" not in os.environ:
    # A private, embedded Prefect: nothing to start, nothing left behind elsewhere.
    os.environ.setdefault("PREFECT_HOME", str(_workdir / "prefect"))
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")

from prefect.client.orchestration import get_client  # noqa: E402 - after the settings above

from autopersona_flows import (  # noqa: E402
    JsonlMemoryStore,
    MemoryRetriever,
    MemoryUpdater,
    PersonaAgent,
    PersonaMemory,
    RawTaskRecord,
    Requirement,
    ingest_task_history,
)
from autopersona_flows.flows import NodeContext, TaskGraph, TaskNode, run_persona_graph  # noqa: E402
from autopersona_flows.flows.answers import (  # noqa: E402
    answer_clarification,
    pending_clarifications,
)

CALLS: Counter[str] = Counter()

HISTORY = [
    RawTaskRecord(
        user_id="ada",
        query="Summarise three papers on retrieval for my reading group",
        trace=["search library", "read abstracts", "summarise"],
        insight="Ada wants short summaries",
        state={"notes": "reading-group/notes.md"},
        persona=[
            PersonaMemory(topic="summary length", preference="under 300 words"),
            PersonaMemory(topic="tone", preference="plain and friendly", strategy="no jargon"),
        ],
    ),
    RawTaskRecord(
        user_id="ada",
        query="Share the notes with the group",
        trace=["export to PDF", "email the group"],
        state={"mailing list": "reading-group@lists.example"},
        persona=[PersonaMemory(topic="sharing channel", preference="email the reading group")],
    ),
]


def gather_sources(context: NodeContext) -> dict:
    """Find the papers to write about."""
    CALLS["gather_sources"] += 1
    return {"papers": ["Robertson 2009 (BM25)", "Reimers 2019 (Sentence-BERT)"]}


def draft(context: NodeContext) -> dict:
    """Draft the summary in Ada's tone and length."""
    CALLS["draft"] += 1
    papers = context.inputs["gather_sources"]["papers"]
    return {"summary": f"{len(papers)} papers summarised", "applied": context.guidance}


def format_references(context: NodeContext) -> dict:
    """Format the references in the citation style Ada uses."""
    CALLS["format_references"] += 1
    style = context.answer or next(
        (
            c.text.split(": ", 1)[1]
            for c in context.constraints
            if c.requirement == "citation style"
        ),
        "unknown",
    )
    papers = context.inputs["gather_sources"]["papers"]
    return {"style": style, "references": [f"[{style}] {paper}" for paper in papers]}


def share(context: NodeContext) -> dict:
    """Share the summary the way Ada prefers."""
    CALLS["share"] += 1
    return {"shared": True, "how": [c.text for c in context.constraints]}


GRAPH = TaskGraph(
    [
        TaskNode(id="gather_sources", instruction="Find the papers", tool=gather_sources),
        TaskNode(
            id="draft",
            instruction="Draft the summary",
            tool=draft,
            depends_on=["gather_sources"],
        ),
        TaskNode(
            id="format_references",
            instruction="Format the references",
            tool=format_references,
            depends_on=["gather_sources"],
            requires=[Requirement("citation style", options=["APA", "MLA", "Chicago"])],
        ),
        TaskNode(
            id="share",
            instruction="Share the summary with the group",
            tool=share,
            depends_on=["draft", "format_references"],
            requires=[Requirement("sharing channel")],
        ),
    ]
)


def play_ada(answer: str) -> None:
    """Wait for the question, show it, and answer it through the Prefect API."""
    for _ in range(1200):
        pending = pending_clarifications()
        if pending:
            print(f"\n[paused] {pending[0].question}")
            print(f"[ada answers] {answer}\n")
            answer_clarification(pending[0].flow_run_id, answer)
            return
        time.sleep(0.25)
    raise TimeoutError("the run never paused")


def main() -> None:
    """Seed memory, run the graph twice, and show what happened."""
    store = JsonlMemoryStore(_workdir / "memory")
    retriever = MemoryRetriever(store)
    updater = MemoryUpdater(store, retriever=retriever)
    for record in HISTORY:
        ingest_task_history(store, updater, record)
    agent = PersonaAgent(retriever, updater=updater)
    options = {"agent": agent, "poll_interval": 0.5, "result_storage": _workdir / "results"}

    with get_client(sync_client=True) as client:
        client.hello()  # start the embedded server once, before the answering thread
    ada = threading.Thread(target=play_ada, args=("APA",))
    ada.start()
    first = run_persona_graph(
        GRAPH, "ada", "Summarise the retrieval papers and share them", **options
    )
    ada.join()
    print("== first run")
    for node, summary in first["decisions"].items():
        print(f"  {node:18} {summary['action']:8} {summary.get('question') or ''}")
    print(f"  references: {first['outputs']['format_references']['references']}")
    print(f"  tool calls: {dict(CALLS)}")
    print(f"  metrics:    {first['metrics']}")

    second = run_persona_graph(
        GRAPH, "ada", "Summarise the retrieval papers and share them", **options
    )
    asked = [
        node for node, summary in second["decisions"].items() if summary["action"] == "clarify"
    ]
    print("== second run")
    print(f"  questions asked: {asked or 'none'}")
    print(f"  references: {second['outputs']['format_references']['references']}")
    remembered = [m.content.preference for m in store.list("ada", "persona")]
    print(f"  persona memory now: {remembered}")


if __name__ == "__main__":
    main()
