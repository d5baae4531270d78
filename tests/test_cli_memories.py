"""From the command line alone: find a wrong memory, correct it, bury one, forget one.

Each store kind runs the same story (a JSONL folder and a PostgreSQL schema), and the
decisions are made by a fresh `PersonaAgent` over a fresh store object, as the next
run would make them.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import orjson
import pytest

from autopersona_flows.agent import NodeInfo, PersonaAgent, PersonaRequest, Requirement
from autopersona_flows.cli import main
from autopersona_flows.memory import MemoryBank, PersonaMemory, SearchRequest, open_store

CITATION = Requirement("citation style", options=["APA", "MLA", "Chicago"])
TONE = Requirement("tone")
NODE = NodeInfo(id="format-bibliography", instruction="Format the bibliography of the paper")


@pytest.fixture(params=["jsonl", "postgres"])
def address(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "jsonl":
        return str(tmp_path / "store")
    return request.getfixturevalue("postgres_schema")


@pytest.fixture
def seeded(address: str) -> dict[str, str]:
    bank = MemoryBank(address)
    ids = {}
    for user, topic, preference in [
        ("ada", "citation style", "MLA"),  # wrong: she uses APA
        ("ada", "tone", "terse, no preamble"),
        ("ada", "summary length", "under 500 words"),
        ("bob", "citation style", "Chicago"),
    ]:
        record = bank.update(user, "persona", PersonaMemory(topic=topic, preference=preference))
        assert record.record is not None
        ids[f"{user}:{topic}"] = record.record.id
    return ids


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def as_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    code, out, err = cli(capsys, *args, "--json")
    assert code == 0, err
    return orjson.loads(out)


def decide(address: str, *requirements: Requirement) -> dict[str, str]:
    """The constraints the next decision uses, by requirement: a fresh store and agent."""
    agent = PersonaAgent(MemoryBank(open_store(address)))
    request = PersonaRequest(
        user_id="ada", query="Finish my paper", node=NODE, requirements=list(requirements)
    )
    decision = agent.decide(request)
    return {str(c.requirement): c.text for c in getattr(decision, "constraints", [])}


def retrieved(address: str, query: str) -> list[str]:
    bank = MemoryBank(open_store(address))
    bundle = bank.retrieve("ada", [SearchRequest(layer="persona", query=query)], top_k=10)
    return [scored.record.id for scored in bundle]


def test_find_a_wrong_preference_correct_it_and_the_next_decision_uses_it(
    address: str, seeded: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    wrong = seeded["ada:citation style"]
    assert decide(address, CITATION)["citation style"] == "citation style: MLA"

    found = as_json(capsys, "memories", address, "ada", "--search", "citation style")
    first = found["memories"][0]
    assert (first["id"], first["content"]["preference"]) == (wrong, "MLA")
    assert all(m["score"] <= first["score"] for m in found["memories"])
    assert seeded["bob:citation style"] not in {m["id"] for m in found["memories"]}

    code, table, _ = cli(capsys, "memories", address, "ada", "--search", "citation style")
    assert code == 0
    assert wrong in table
    assert "MLA" in table
    assert "citation style" in table

    code, out, err = cli(
        capsys, "edit", address, "ada", wrong, "--set", "preference=APA", "--reason", "I use APA"
    )
    assert (code, err) == (0, "")
    assert f"edited persona memory {wrong}" in out
    assert "APA" not in out
    assert "MLA" not in out

    assert decide(address, CITATION)["citation style"] == "citation style: APA"
    looked = as_json(capsys, "memories", address, "ada", "--layer", "persona", "--history")
    current = {m["id"]: m["content"]["preference"] for m in looked["memories"]}
    assert current[wrong] == "APA"
    (change,) = looked["history"]
    assert (change["operation"], change["before"]["id"]) == ("update", wrong)
    assert (
        change["before"]["content"]["preference"],
        change["after"]["content"]["preference"],
    ) == (
        "MLA",
        "APA",
    )
    assert change["reason"] == "edited by a person: I use APA"
    # Bob's memory of the same topic is his own.
    bob = MemoryBank(open_store(address)).store.get("bob", "persona", seeded["bob:citation style"])
    assert bob.content.preference == "Chicago"  # type: ignore[union-attr]


def test_a_buried_memory_is_kept_but_never_retrieved_until_unburied(
    address: str, seeded: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    tone = seeded["ada:tone"]
    assert tone in retrieved(address, "tone")
    assert "tone" in decide(address, TONE)

    code, out, _ = cli(capsys, "bury", address, "ada", tone, "--reason", "not any more")
    assert code == 0
    assert f"buried persona memory {tone}" in out
    assert tone not in retrieved(address, "tone")
    assert "tone" not in decide(address, TONE)
    searched = as_json(capsys, "memories", address, "ada", "--search", "tone")
    assert tone not in {m["id"] for m in searched["memories"]}
    listed = as_json(capsys, "memories", address, "ada")
    (kept,) = [m for m in listed["memories"] if m["id"] == tone]
    assert kept["buried_at"] is not None
    assert kept["content"]["preference"] == "terse, no preamble"
    code, table, _ = cli(capsys, "memories", address, "ada")
    assert "buried" in table
    assert cli(capsys, "bury", address, "ada", tone)[1].endswith("was already buried\n")

    code, out, _ = cli(capsys, "unbury", address, "ada", tone)
    assert code == 0
    assert f"unburied persona memory {tone}" in out
    assert tone in retrieved(address, "tone")
    assert decide(address, TONE)["tone"] == "tone: terse, no preamble"


def test_a_forgotten_memory_is_never_retrieved_again(
    address: str, seeded: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    gone = seeded["ada:summary length"]
    code, out, _ = cli(capsys, "forget", address, "ada", gone, "--reason", "wrong person")
    assert code == 0
    assert f"forgot persona memory {gone}" in out
    assert gone not in retrieved(address, "summary length words")
    looked = as_json(capsys, "memories", address, "ada", "--history")
    assert gone not in {m["id"] for m in looked["memories"]}
    (change,) = looked["history"]
    assert (change["operation"], change["reason"]) == (
        "delete",
        "forgotten by a person: wrong person",
    )
    code, _, err = cli(capsys, "forget", address, "ada", gone)
    assert code == 1
    assert err.startswith("error: no ")
    assert gone in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["edit", "{id}", "--set", "colour=blue"], "has no field 'colour'"),
        (["edit", "{id}", "--set", "preference="], "preference: Value error, must not be empty"),
        (["edit", "{id}", "--set", "aliases=tone"], "takes a list"),
        (["edit", "{id}", "--set", "aliases=[1]"], "aliases.0"),
        (["edit", "{id}", "--set", "preference"], "--set takes FIELD=VALUE"),
        (["edit", "{id}", "--layer", "workspace", "--set", "preference=x"], "no workspace memory"),
        (["edit", "not-an-id", "--set", "preference=x"], "'not-an-id' is not a memory id"),
        (["bury", "0" * 26], "no trajectory or workspace or persona memory with id"),
        (["unbury", "nope"], "is not a memory id"),
        (["forget", "7ZZZZZZZZZZZZZZZZZZZZZZZZZ"], "no trajectory or workspace or persona memory"),
    ],
)
def test_bad_corrections_are_an_error_message_and_change_nothing(
    address: str,
    seeded: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    message: str,
) -> None:
    store = open_store(address)
    before = store.snapshot_fingerprint("ada")
    command, *rest = [arg.replace("{id}", seeded["ada:citation style"]) for arg in args]
    code, out, err = cli(capsys, command, address, "ada", *rest)
    assert (code, out) == (1, ""), err
    assert err.startswith("error: "), err
    assert message in err, err
    assert len(err.splitlines()) == 1  # no traceback
    assert store.snapshot_fingerprint("ada") == before
    assert store.history("ada", "persona") == []


def test_usage_errors_exit_2_and_a_missing_store_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nowhere = str(tmp_path / "nowhere")
    assert cli(capsys, "memories", nowhere, "ada", "--layer", "people")[0] == 2
    assert cli(capsys, "edit", nowhere, "ada", "0" * 26)[0] == 2  # --set is required
    code, _, err = cli(capsys, "memories", nowhere, "ada")
    assert (code, err) == (1, f"error: no memory store at {nowhere}: the folder does not exist\n")
    assert not Path(nowhere).exists()


def test_an_empty_search_says_so(address: str, capsys: pytest.CaptureFixture[str]) -> None:
    MemoryBank(address).update("ada", "persona", PersonaMemory(topic="tone", preference="warm"))
    code, out, _ = cli(capsys, "memories", address, "ada", "--search", "zzzz qqqq")
    assert (code, out) == (0, "no memories found for 'zzzz qqqq' for user 'ada'\n")
    assert as_json(capsys, "memories", address, "ada", "--search", "zzzz qqqq")["memories"] == []


def test_contents_are_shown_as_written_never_as_markup(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = str(tmp_path / "store")
    MemoryBank(root).add("ada", PersonaMemory(topic="[bold]tone[/bold]", preference="[red]x"))
    code, out, _ = cli(capsys, "memories", root, "ada")
    assert code == 0
    assert "[bold]tone[/bold]" in out
    assert "[red]x" in out


def test_help_reads_like_prefect_s(run_cli) -> None:
    top = run_cli("--help")
    assert top.returncode == 0
    for command in ("memories", "edit", "forget", "bury", "unbury", "ingest", "migrate", "eval"):
        assert f"│ {command} " in top.stdout
    assert "A person's memories" in top.stdout  # commands grouped in panels
    edit = run_cli("edit", "--help")
    assert edit.returncode == 0
    assert "FIELD=VALUE" in edit.stdout
    bare = run_cli()
    assert bare.returncode == 2
    assert "Usage: autopersona" in bare.stdout + bare.stderr


def test_erase_removes_a_person_after_confirmation_and_only_them(
    capsys, monkeypatch, address, seeded, tmp_path
) -> None:
    snapshots = tmp_path / "snapshots"

    # Refused at the prompt: nothing is erased.
    monkeypatch.setattr("sys.stdin", io.StringIO("n\n"))
    code, _, _ = cli(capsys, "erase", address, "ada", "--snapshots", str(snapshots))
    assert code == 1
    assert len(as_json(capsys, "memories", address, "ada")["memories"]) == 3

    code, out, err = cli(capsys, "erase", address, "ada", "--snapshots", str(snapshots), "--yes")
    assert (code, err) == (0, "")
    assert out.startswith("erased 'ada': 3 memories")
    assert as_json(capsys, "memories", address, "ada")["memories"] == []
    [bob] = as_json(capsys, "memories", address, "bob")["memories"]
    assert bob["id"] == seeded["bob:citation style"]

    # Erasing again finds nothing: not an error, so a retried request succeeds.
    code, out, err = cli(capsys, "erase", address, "ada", "--snapshots", str(snapshots), "-y")
    assert (code, err) == (0, "")
    assert out == "nothing is stored of 'ada': nothing to erase\n"


def test_maintain_merges_duplicates_of_every_user_and_prints_no_contents(
    capsys, address, seeded
) -> None:
    bank = MemoryBank(address)
    # A near duplicate that skipped the update guards (as an older version could write).
    bank.store.add("ada", PersonaMemory(topic="tone", preference="terse, no preamble"))
    assert len(as_json(capsys, "memories", address, "ada")["memories"]) == 4

    code, out, err = cli(capsys, "maintain", address)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[-1] == "maintained 2 users"
    [ada] = [line for line in lines if line.startswith("ada:")]
    assert "1 merged" in ada
    assert "terse" not in out
    assert len(as_json(capsys, "memories", address, "ada")["memories"]) == 3

    code, _, _ = cli(capsys, "maintain", address, "--duplicate-threshold", "2")
    assert code == 2  # a usage error, drawn by Typer
