"""Provenance: every memory says where it came from, every history entry what changed it.

Each story runs on both stores (a JSONL folder and a PostgreSQL schema) and reads
back through a fresh store object, so a provenance dropped at the store boundary,
or on an update or merge path, fails here.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import pytest
from pydantic import ValidationError

from autopersona_flows.agent import ClarifyDecision, NodeInfo, PersonaAgent, PersonaRequest
from autopersona_flows.cli import main
from autopersona_flows.memory import (
    MemoryBank,
    MemoryChange,
    MemoryRecord,
    MemoryStore,
    MemoryUpdater,
    PersonaMemory,
    TrajectoryMemory,
    ingest_task_history,
    open_store,
    promote_choices,
    retire_expired,
)
from autopersona_flows.memory.ingestion import read_task_records
from autopersona_flows.memory.provenance import Provenance

USER = "ada"
QUESTION = "Which citation style should the paper use?"
NODE = NodeInfo(id="draft", instruction="Draft the paper")
T0 = datetime(2025, 2, 3, 8, 0, tzinfo=UTC)


@pytest.fixture(params=["jsonl", "postgres"])
def address(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "jsonl":
        return str(tmp_path / "store")
    return request.getfixturevalue("postgres_schema")


def reopened(address: str) -> MemoryStore:
    """A fresh store object: what it reads crossed the store boundary."""
    return open_store(address)


def asked(answer_for: str = "citation style") -> ClarifyDecision:
    request = PersonaRequest(user_id=USER, query="Finish my paper", node=NODE)
    return ClarifyDecision(
        question=QUESTION, requirement=answer_for, options=["APA", "MLA"], request=request
    )


# --------------------------------------------------------------------------- the model


def test_a_provenance_holds_only_the_fields_of_its_kind() -> None:
    learned = Provenance.clarification(QUESTION, node="draft", flow_run_id="run-1")
    assert learned.model_dump(mode="json") == {
        "kind": "clarification",
        "flow_run_id": "run-1",
        "node": "draft",
        "question": QUESTION,
    }
    assert Provenance.model_validate_json(learned.model_dump_json()) == learned
    assert Provenance.ingestion().model_dump(mode="json") == {"kind": "ingestion"}
    with pytest.raises(ValidationError, match="takes no file"):
        Provenance(kind="clarification", question=QUESTION, file="tasks.jsonl")
    with pytest.raises(ValidationError, match="needs the question"):
        Provenance(kind="clarification")
    with pytest.raises(ValidationError, match="needs the memories"):
        Provenance(kind="consolidation")
    with pytest.raises(ValidationError, match="line needs its file"):
        Provenance(kind="ingestion", line=3)
    with pytest.raises(ValidationError, match="not a memory id"):
        Provenance.consolidation(["not-an-id"])
    with pytest.raises(ValidationError):
        Provenance(kind="rumour")  # type: ignore[arg-type]
    assert learned.describe() == (
        f"clarification at node 'draft' of {QUESTION!r} in flow run run-1"
    )


def test_a_record_and_a_change_without_provenance_keep_their_bytes() -> None:
    record = MemoryRecord.of(PersonaMemory(topic="tone", preference="formal"))
    assert "provenance" not in record.model_dump(mode="json")
    change = MemoryChange(operation="delete", at=record.created_at, before=record)
    assert "provenance" not in change.model_dump(mode="json")
    # A record stored before provenance existed reads back as it was written.
    raw = record.model_dump_json()
    assert MemoryRecord.model_validate_json(raw).model_dump_json() == raw


# --------------------------------------------------------------------------- sources


def test_a_learned_answer_records_its_run_node_and_question(address: str) -> None:
    agent = PersonaAgent(MemoryBank(address))
    first = agent.learn(USER, asked(), "MLA", flow_run_id="run-1")
    assert first.record is not None
    (stored,) = reopened(address).list(USER, "persona")
    assert stored.provenance == Provenance.clarification(
        QUESTION, node="draft", flow_run_id="run-1"
    )

    # A newer answer on the slot is the new version's own source; the history entry
    # says which run changed it, and the old version keeps where it was learned.
    agent.learn(USER, asked(), "APA", flow_run_id="run-2")
    store = reopened(address)
    (current,) = store.list(USER, "persona")
    assert current.id == first.record.id
    assert current.provenance is not None
    assert current.provenance.flow_run_id == "run-2"
    (change,) = store.history(USER, "persona", current.id)
    assert change.provenance == current.provenance
    assert change.before.provenance is not None
    assert change.before.provenance.flow_run_id == "run-1"


def test_a_learned_answer_outside_a_flow_names_the_requests_node(address: str) -> None:
    PersonaAgent(MemoryBank(address)).learn(USER, asked(), "APA")
    (stored,) = reopened(address).list(USER, "persona")
    assert stored.provenance == Provenance.clarification(QUESTION, node="draft")


def test_ingested_memories_record_their_file_and_line(address: str, tmp_path: Path) -> None:
    file = tmp_path / "tasks.jsonl"
    lines = [
        {"user_id": USER, "query": "Book a table", "at": "2025-02-03T08:00:00+00:00"},
        {},  # a blank line: line numbers still count it
        {
            "user_id": USER,
            "query": "Write to the landlord",
            "task": "letter",
            "state": {"sent": True},
            "persona": [{"topic": "tone", "preference": "formal"}],
            "at": "2025-02-04T08:00:00+00:00",
        },
    ]
    file.write_bytes(b"\n".join(orjson.dumps(line) if line else b"" for line in lines) + b"\n")
    store = open_store(address)
    updater = MemoryUpdater(store)
    for record in read_task_records(file.read_bytes().splitlines(), file):
        ingest_task_history(store, updater, record)

    store = reopened(address)
    sources = {
        layer: [(r.provenance.file, r.provenance.line) for r in store.list(USER, layer)]  # type: ignore[union-attr]
        for layer in ("trajectory", "workspace", "persona")
    }
    assert sources == {
        "trajectory": [(str(file), 1), (str(file), 3)],
        "workspace": [(str(file), 3)],
        "persona": [(str(file), 3)],
    }
    assert {r.provenance.kind for r in store.list(USER, "trajectory")} == {"ingestion"}  # type: ignore[union-attr]


def test_a_consolidated_memory_records_the_memories_it_drew_together(address: str) -> None:
    updater = MemoryUpdater(open_store(address))
    ids = [
        updater.add(USER, TrajectoryMemory(query=query, trace=trace), at=T0 + timedelta(days=i)).id
        for i, (query, trace) in enumerate(
            [
                ("Book a flight to Rome", ["booked 14C, an aisle seat"]),
                ("flights to Oslo please", ["picked an aisle seat again"]),
                ("I need a flight to Paris on Friday", ["chose aisle 22D"]),
            ]
        )
    ]
    (decision,) = promote_choices(updater, USER)
    assert decision.operation == "add"
    (memory,) = reopened(address).list(USER, "persona")
    assert memory.provenance == Provenance.consolidation(ids)
    assert memory.provenance.memories == sorted(ids)  # type: ignore[union-attr]


def test_a_persons_edit_is_the_new_source_and_a_burial_keeps_the_old(address: str) -> None:
    bank = MemoryBank(address)
    learned = bank.update(
        USER,
        "persona",
        PersonaMemory(topic="citation style", preference="MLA"),
        provenance=Provenance.clarification(QUESTION, node="draft", flow_run_id="run-1"),
    ).record
    assert learned is not None
    bank.edit(USER, learned.id, {"preference": "APA"}, reason="I use APA")
    bank.bury(USER, learned.id, reason="not now", command="autopersona bury")
    other = bank.add(USER, PersonaMemory(topic="tone", preference="formal"))
    bank.forget(USER, other.id, reason="wrong")

    store = reopened(address)
    current = store.get(USER, "persona", learned.id)
    assert current.provenance == Provenance.edit("I use APA")  # the edit made this content
    edited, buried = store.history(USER, "persona", learned.id)
    assert edited.before.provenance is not None
    assert edited.before.provenance.kind == "clarification"  # the chain reaches the run
    assert edited.provenance == Provenance.edit("I use APA")
    assert buried.provenance == Provenance.edit("not now", command="autopersona bury")
    assert buried.after is not None
    assert buried.after.provenance == Provenance.edit("I use APA")  # a burial is no new source
    (forgotten,) = store.history(USER, "persona", other.id)
    assert forgotten.provenance == Provenance.edit("wrong")
    assert forgotten.before.provenance is None  # added in Python without saying


def test_memories_history_shows_the_chain(address: str, capsys: pytest.CaptureFixture[str]) -> None:
    bank = MemoryBank(address)
    agent = PersonaAgent(bank)
    learned = agent.learn(USER, asked(), "MLA", flow_run_id="run-1").record
    assert learned is not None
    edit = ["edit", address, USER, learned.id, "--set", "preference=APA", "--reason", "APA"]
    assert main(edit) == 0
    capsys.readouterr()

    assert main(["memories", address, USER, "--history", "--json"]) == 0
    looked = orjson.loads(capsys.readouterr().out)
    (memory,) = looked["memories"]
    assert memory["provenance"] == {"kind": "edit", "command": "autopersona edit", "reason": "APA"}
    (change,) = looked["history"]
    assert change["before"]["provenance"] == {
        "kind": "clarification",
        "flow_run_id": "run-1",
        "node": "draft",
        "question": QUESTION,
    }
    assert change["provenance"] == memory["provenance"]

    assert main(["memories", address, USER, "--history"]) == 0
    table = capsys.readouterr().out
    assert "edit by `autopersona edit` (APA)" in " ".join(table.split())
    assert "run-1" in table


def test_upkeep_says_so_in_the_history(address: str) -> None:
    store = open_store(address)
    record = store.add(
        USER,
        MemoryRecord.of(
            PersonaMemory(topic="desk", preference="by the window"),
            stated_at=T0,
            valid_until=T0 + timedelta(days=1),
        ),
    )
    assert retire_expired(store, USER, now=T0 + timedelta(days=2)) == [record.id]
    (change,) = reopened(address).history(USER, "persona", record.id)
    assert change.provenance == Provenance.maintenance("expired")
