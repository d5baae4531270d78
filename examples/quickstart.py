"""Quickstart: a memory-aware task graph on Prefect that asks once, then remembers.

Runs offline and unattended, with no server to start and no API key::

    python examples/quickstart.py

1. A `MemoryBank` (a store in a temporary folder, with its retriever and
   updater) is seeded with two past tasks of Ada's.
2. A four-node graph (gather sources, draft, format references, share; see
   ``examples/reading_group.py``) runs as a Prefect flow on the embedded Prefect
   server. The PersonaAgent applies what it knows (tone, summary length) but the
   references step needs a citation style nobody has told it, so the run pauses
   with a typed question.
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
    MemoryBank,
    PersonaAgent,
    answer_clarification,
    pending_clarifications,
    run_persona_graph,
)
from examples.reading_group import GRAPH, HISTORY, QUERY, WORKLOG_ENV, worklog  # noqa: E402

os.environ[WORKLOG_ENV] = str(_workdir / "worklog.jsonl")


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
    bank = MemoryBank(JsonlMemoryStore(_workdir / "memory"))  # store, retriever and updater
    bank.ingest(HISTORY)
    options = {
        "agent": PersonaAgent(bank),
        "poll_interval": 0.5,
        "result_storage": _workdir / "results",
    }

    with get_client(sync_client=True) as client:
        client.hello()  # start the embedded server once, before the answering thread
    ada = threading.Thread(target=play_ada, args=("APA",))
    ada.start()
    graph = GRAPH.to_graph()
    first = run_persona_graph(graph, "ada", QUERY, **options)
    ada.join()
    print("== first run")
    for node, summary in first["decisions"].items():
        asked = "; ".join(
            f"asked {a['question']!r}: {a['answer']}" for a in summary.get("answers", [])
        )
        print(f"  {node:18} {summary['action']:8} {asked}")
    print(f"  references: {first['outputs']['format_references']['references']}")
    calls = Counter(line["tool"] for line in worklog(os.environ[WORKLOG_ENV]))
    # In the graph's order: 'draft' and 'format_references' run at once, in either order.
    print(f"  tool calls: { {node: calls[node] for node in graph.order} }")
    print(f"  metrics:    {first['metrics']}")

    second = run_persona_graph(graph, "ada", QUERY, **options)
    asked = [node for node, summary in second["decisions"].items() if summary.get("answers")]
    print("== second run")
    print(f"  questions asked: {asked or 'none'}")
    print(f"  references: {second['outputs']['format_references']['references']}")
    remembered = [m.content.preference for m in bank.store.list("ada", "persona")]
    print(f"  persona memory now: {remembered}")


if __name__ == "__main__":
    main()
