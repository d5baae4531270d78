"""Bad data never ends a command in a traceback: each one fails with ``error: ...``.

Every store command runs against every kind of damage a store can hold. A command
that reads the damaged part exits 1 with a message naming what is wrong; one that
does not read it succeeds. An exception escaping `main` fails the test.
"""

from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from autopersona_flows import (
    JsonlMemoryStore,
    MemoryRecord,
    PersonaMemory,
    TrajectoryMemory,
    WorkspaceMemory,
)
from autopersona_flows.cli import main
from autopersona_flows.memory import MemoryChange
from autopersona_flows.memory.users import user_key


def _folder(root: Path, user: str) -> Path:
    return root / "users" / user_key(user)


def _append(path: Path, line: bytes) -> None:
    with path.open("ab") as file:
        file.write(line + b"\n")


def _foreign_record(root: Path) -> None:
    record = MemoryRecord.of(WorkspaceMemory(state={"file": "notes.md"}))
    _append(_folder(root, "ada") / "persona.jsonl", record.model_dump_json().encode())


def _foreign_change(root: Path) -> None:
    record = MemoryRecord.of(WorkspaceMemory(state={"file": "notes.md"}))
    change = MemoryChange(operation="delete", at=record.updated_at, before=record)
    _append(_folder(root, "ada") / "persona.history.jsonl", change.model_dump_json().encode())


def _marker(root: Path) -> None:
    (root / "store.json").write_bytes(orjson.dumps({"format": "something-else"}))


def _strays(root: Path) -> None:
    (root / "users" / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    (root / "users" / user_key("carol")).write_text("a folder that became a file")


DAMAGE: dict[str, Callable[[Path], None]] = {
    "a record of another layer in a bank": _foreign_record,
    "a change of another layer in a history": _foreign_change,
    "a line of a bank that is not JSON": lambda root: _append(
        _folder(root, "ada") / "persona.jsonl", b"{oops"
    ),
    "a line of a history that is not JSON": lambda root: _append(
        _folder(root, "ada") / "persona.history.jsonl", b"[1, 2"
    ),
    "a bank of another user": lambda root: (_folder(root, "ada") / "trajectory.jsonl").write_bytes(
        (_folder(root, "bob") / "trajectory.jsonl").read_bytes()
    ),
    "a store marker of another format": _marker,
    "a folder where a bank belongs": lambda root: (
        _folder(root, "ada") / "workspace.jsonl"
    ).mkdir(),
    "stray files in users": _strays,
}

COMMANDS: dict[str, Callable[[Path, Path], list[str]]] = {
    "users": lambda root, tmp: ["users", str(root)],
    "verify": lambda root, tmp: ["verify", str(root)],
    "export": lambda root, tmp: ["export", str(root), "ada", str(tmp / "out" / "ada.json")],
    "import --replace": lambda root, tmp: ["import", "--replace", str(tmp / "ada.json"), str(root)],
    "reindex": lambda root, tmp: ["reindex", str(root)],
    "migrate": lambda root, tmp: ["migrate", "--from", str(root), "--to", str(tmp / "copy")],
    "ingest": lambda root, tmp: ["ingest", str(root), str(tmp / "tasks.jsonl")],
    "memories": lambda root, tmp: ["memories", str(root), "ada"],
    "memories --search --history": lambda root, tmp: [
        *("memories", str(root), "ada", "--search", "tone", "--history", "--json"),
    ],
}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("damage", DAMAGE)
def test_bad_data_is_an_error_message_never_a_traceback(
    tmp_path: Path, damage: str, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "store"
    store = JsonlMemoryStore(root)
    for user in ("ada", "bob"):
        tone = store.add(user, PersonaMemory(topic="tone", preference="terse"))
        store.update(user, "persona", tone.id, PersonaMemory(topic="tone", preference="warm"))
        store.add(user, TrajectoryMemory(query="Summarise the paper", trace=["read"]))
    assert main(["export", str(root), "ada", str(tmp_path / "ada.json")]) == 0
    task = {
        "user_id": "ada",
        "query": "Plan a trip",
        "persona": [{"topic": "t", "preference": "p"}],
    }
    (tmp_path / "tasks.jsonl").write_bytes(orjson.dumps(task) + b"\n")
    capsys.readouterr()
    DAMAGE[damage](root)

    code = main(COMMANDS[command](root, tmp_path))  # raises if anything escapes

    err = capsys.readouterr().err
    assert code in (0, 1), err
    if code:
        last = err.splitlines()[-1]
        assert last.startswith("error: "), err
        assert str(root) in last, f"the message does not say where: {last}"
    if command == "verify":
        assert code == 1  # whatever the damage, verify finds it
