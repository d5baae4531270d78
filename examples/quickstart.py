"""Quickstart: a user's three-layer memory bank on the embedded JSONL store.

Runs offline in a temporary folder, with no server and no API key::

    python examples/quickstart.py

It stores a few completed tasks of one user, learns that a preference changed,
reads the bank back from a second store instance (as another process would), and
prints what each layer holds, the change history, and the snapshot fingerprint.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from autopersona_flows import (
    JsonlMemoryStore,
    PersonaMemory,
    RawTaskRecord,
    TrajectoryMemory,
    WorkspaceMemory,
)

HISTORY = [
    RawTaskRecord(
        user_id="ada",
        query="Summarise the three papers on retrieval for my reading group",
        trace=["search library", "read abstracts", {"tool": "summarise", "papers": 3}],
        outcome={"summary_words": 450},
        insight="Ada wants short summaries with full citations",
        task={"kind": "summary", "papers": 3},
        interaction=[{"opened": "reading-group/notes.md"}],
        state={"notes": "reading-group/notes.md", "status": "summary added"},
        persona=[
            PersonaMemory(
                topic="citation style",
                preference="APA",
                strategy="format every reference in APA 7",
            ),
            PersonaMemory(topic="summary length", preference="under 500 words"),
        ],
    ),
    RawTaskRecord(
        user_id="ada",
        query="Draft the related-work section",
        trace=["outline", "draft"],
        outcome="draft saved",
        insight="Ada reviews drafts in Markdown",
        state={"draft": "paper/related-work.md"},
    ),
]


def store_task(store: JsonlMemoryStore, record: RawTaskRecord) -> None:
    """Write one completed task into the three layers of its user's bank."""
    store.add(
        record.user_id,
        TrajectoryMemory(
            query=record.query, trace=record.trace, outcome=record.outcome, insight=record.insight
        ),
    )
    if record.task is not None or record.interaction or record.state is not None:
        store.add(
            record.user_id,
            WorkspaceMemory(task=record.task, interaction=record.interaction, state=record.state),
        )
    store.add_many(record.user_id, "persona", record.persona)


def main() -> None:
    """Run the quickstart in a temporary folder."""
    with tempfile.TemporaryDirectory(prefix="autopersona-quickstart-") as folder:
        store = JsonlMemoryStore(Path(folder) / "memory")
        for record in HISTORY:
            store_task(store, record)

        # Ada changes her mind: the newest preference replaces the old one, which is
        # kept in the change history.
        apa = next(m for m in store.list("ada", "persona") if m.content.topic == "citation style")
        store.update(
            "ada",
            "persona",
            apa.id,
            PersonaMemory(topic="citation style", preference="MLA", strategy="use MLA 9"),
        )

        reader = JsonlMemoryStore(Path(folder) / "memory")  # a fresh view, as another process
        for layer in ("trajectory", "workspace", "persona"):
            print(f"== {layer}")
            for memory in reader.list("ada", layer):
                print(f"  {memory.id}  {memory.content.model_dump_json()}")
        print("== history of the citation style preference")
        for change in reader.history("ada", "persona", apa.id):
            print(
                f"  {change.operation}: {change.before.content.preference!r} -> "
                f"{change.after.content.preference if change.after else None!r}"
            )
        snapshot = reader.snapshot("ada")
        print(f"== snapshot: {snapshot.counts}, fingerprint {snapshot.fingerprint[:16]}…")


if __name__ == "__main__":
    main()
