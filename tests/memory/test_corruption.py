"""Malformed files: a typed error naming file and line, and not one byte changed."""

from collections.abc import Callable
from pathlib import Path

import pytest

from autopersona_flows import (
    JsonlMemoryStore,
    MemoryRecord,
    MemoryStoreCorruptionError,
    PersonaMemory,
    TrajectoryMemory,
    WorkspaceMemory,
)
from autopersona_flows.cli import main
from autopersona_flows.memory import MemoryChange


def make_bank(root: Path) -> tuple[Path, list[bytes]]:
    """Three persona records for ada; return the bank file and its lines."""
    store = JsonlMemoryStore(root)
    for i in range(3):
        store.add("ada", PersonaMemory(topic=f"topic {i}", preference="p"))
    (path,) = root.glob("users/*/persona.jsonl")
    return path, path.read_bytes().split(b"\n")[:-1]


# A valid record, of a valid layer, but not of the bank it is in.
WORKSPACE_LINE = (
    MemoryRecord.of(WorkspaceMemory(state={"file": "notes.md"})).model_dump_json().encode()
)

# Each case turns the lines of a healthy bank into a corrupt one whose bad line is line 3
# (line 4 where a batch breaks off: the line that breaks it is the bad one).
CASES: dict[str, tuple[Callable[[list[bytes]], list[bytes]], str]] = {
    "invalid JSON": (lambda lines: [*lines[:2], b'{"id": "01', *lines[3:]], "not valid JSON"),
    "invalid UTF-8": (
        lambda lines: [*lines[:2], lines[2].replace(b"topic", b"t\xffpic"), *lines[3:]],
        "not valid JSON",
    ),
    "not an object": (
        lambda lines: [*lines[:2], b"[1, 2, 3]", *lines[3:]],
        "must be a JSON object",
    ),
    "a bare string": (lambda lines: [*lines[:2], b'"hello"', *lines[3:]], "must be a JSON object"),
    "blank line": (lambda lines: [*lines[:2], b"", *lines[2:]], "not valid JSON"),
    "fails validation": (
        lambda lines: [
            *lines[:2],
            lines[2].replace(b'"preference":"p"', b'"preference":7'),
            *lines[3:],
        ],
        "preference",
    ),
    "wrong layer": (
        lambda lines: [
            *lines[:2],
            lines[2].replace(b'"layer":"persona"', b'"layer":"trajectory"'),
            *lines[3:],
        ],
        "query",
    ),
    "a record of another layer": (
        lambda lines: [*lines[:2], WORKSPACE_LINE, *lines[2:]],
        "a workspace record in the persona bank",
    ),
    "a record of another layer in a batch": (
        lambda lines: [*lines[:2], b'{"op":"batch","count":2}', WORKSPACE_LINE, lines[2]],
        "a workspace record in the persona bank",
    ),
    "unknown op": (lambda lines: [*lines[:2], b'{"op": "merge", "id": "x"}', *lines[3:]], "merge"),
    "delete of unknown id": (
        lambda lines: [
            *lines[:2],
            b'{"op":"delete","id":"01M8Q7GME2V8F9V56S05QS05N8","at":"2026-01-01T00:00:00Z"}',
            *lines[2:],
        ],
        "not in the bank",
    ),
    "batch ended early": (
        lambda lines: [
            *lines[:2],
            b'{"op":"batch","count":2}',
            b'{"op":"delete","id":"x","at":"2026-01-01T00:00:00Z"}',
            *lines[2:],
        ],
        "ended early",
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_corruption_is_reported_with_file_and_line_and_nothing_changes(
    tmp_path: Path, case: str
) -> None:
    corrupt, reason = CASES[case]
    bad_line = 4 if "batch" in case else 3
    path, lines = make_bank(tmp_path / "store")
    bad = b"\n".join(corrupt(lines)) + b"\n"
    path.write_bytes(bad)
    files_before = {p: p.read_bytes() for p in path.parent.iterdir()}

    store = JsonlMemoryStore(tmp_path / "store")
    for call in (
        lambda: store.list("ada", "persona"),
        lambda: store.snapshot("ada"),
        lambda: store.add("ada", PersonaMemory(topic="new", preference="p")),
        lambda: store.add_many("ada", "persona", [PersonaMemory(topic="n", preference="p")] * 1),
    ):
        with pytest.raises(MemoryStoreCorruptionError, match=reason) as info:
            call()
        assert info.value.path == path
        assert info.value.line == bad_line
        assert f"{path}:{bad_line}" in str(info.value)
    assert {p: p.read_bytes() for p in path.parent.iterdir()} == files_before
    # Other banks of the same user and other users are unaffected.
    store.add("ada", TrajectoryMemory(query="still fine"))
    store.add("bob", PersonaMemory(topic="t", preference="p"))


def test_a_bad_last_line_with_its_newline_is_corruption_not_a_torn_write(tmp_path: Path) -> None:
    path, lines = make_bank(tmp_path / "store")
    path.write_bytes(b"\n".join([*lines, b'{"id": "broken']) + b"\n")
    with pytest.raises(MemoryStoreCorruptionError) as info:
        JsonlMemoryStore(tmp_path / "store").list("ada", "persona")
    assert info.value.line == 5


@pytest.mark.parametrize(
    ("header", "reason"),
    [
        (b"not json", "not valid JSON"),
        (b'{"format": "something-else"}', "format"),
        (b"", "header line is missing"),
    ],
)
def test_a_bad_header_is_line_one(tmp_path: Path, header: bytes, reason: str) -> None:
    path, lines = make_bank(tmp_path / "store")
    path.write_bytes(header + b"\n" + b"\n".join(lines[1:]) + b"\n" if header else b"")
    with pytest.raises(MemoryStoreCorruptionError, match=reason) as info:
        JsonlMemoryStore(tmp_path / "store").list("ada", "persona")
    assert info.value.line == 1


def test_a_bank_copied_into_another_users_folder_is_detected(tmp_path: Path) -> None:
    store = JsonlMemoryStore(tmp_path)
    store.add("ada", PersonaMemory(topic="secret", preference="ada's"))
    store.add("bob", TrajectoryMemory(query="q"))
    (ada_bank,) = tmp_path.glob("users/ada-*/persona.jsonl")
    (bob_folder,) = tmp_path.glob("users/bob-*")
    (bob_folder / "persona.jsonl").write_bytes(ada_bank.read_bytes())
    with pytest.raises(MemoryStoreCorruptionError, match="names user 'ada'"):
        JsonlMemoryStore(tmp_path).list("bob", "persona")


def test_a_corrupt_history_is_reported(tmp_path: Path) -> None:
    store = JsonlMemoryStore(tmp_path)
    record = store.add("ada", PersonaMemory(topic="t", preference="p"))
    store.update("ada", "persona", record.id, PersonaMemory(topic="t", preference="q"))
    (history,) = tmp_path.glob("users/*/persona.history.jsonl")
    history.write_bytes(b"garbage\n" + history.read_bytes())
    with pytest.raises(MemoryStoreCorruptionError, match="not valid JSON") as info:
        store.history("ada", "persona", record.id)
    assert (info.value.path, info.value.line) == (history, 1)


def test_writes_resume_once_the_file_is_repaired(tmp_path: Path) -> None:
    path, lines = make_bank(tmp_path / "store")
    path.write_bytes(b"\n".join([*lines[:2], b"{oops", *lines[2:]]) + b"\n")
    store = JsonlMemoryStore(tmp_path / "store")
    with pytest.raises(MemoryStoreCorruptionError):
        store.add("ada", PersonaMemory(topic="new", preference="p"))
    path.write_bytes(b"\n".join(lines) + b"\n")  # a person removes the bad line
    store.add("ada", PersonaMemory(topic="new", preference="p"))
    assert len(store.list("ada", "persona")) == 4


def test_corruption_appended_after_a_cached_view_is_caught_and_the_view_rebuilt(
    tmp_path: Path,
) -> None:
    path, _ = make_bank(tmp_path / "store")
    store = JsonlMemoryStore(tmp_path / "store")
    assert len(store.list("ada", "persona")) == 3  # the view now ends at line 4
    healthy = path.read_bytes()
    with path.open("ab") as file:
        file.write(b"{not json}\n")
    for _ in range(2):  # the same answer twice: a failed refresh leaves no half-read view
        with pytest.raises(MemoryStoreCorruptionError) as info:
            store.list("ada", "persona")
        assert info.value.line == 5
    path.write_bytes(healthy)
    assert len(store.list("ada", "persona")) == 3


def test_restoring_a_snapshot_repairs_a_corrupt_bank(tmp_path: Path) -> None:
    path, lines = make_bank(tmp_path / "store")
    store = JsonlMemoryStore(tmp_path / "store")
    healthy = store.snapshot("ada")
    path.write_bytes(b"\n".join([*lines[:2], b"{oops", *lines[2:]]) + b"\n")
    with pytest.raises(MemoryStoreCorruptionError):
        store.restore(healthy)  # without replace, nothing is overwritten
    corrupt = path.read_bytes()
    store.restore(healthy, replace=True)
    assert store.snapshot_fingerprint("ada") == healthy.fingerprint
    assert JsonlMemoryStore(tmp_path / "store").snapshot_fingerprint("ada") == healthy.fingerprint
    (kept,) = path.parent.glob("persona.*.corrupt")  # the corrupt bank's bytes are kept
    assert kept.read_bytes() == corrupt


def test_a_torn_history_line_longer_than_a_mebibyte_is_cut_whole(tmp_path: Path) -> None:
    store = JsonlMemoryStore(tmp_path)
    record = store.add("ada", PersonaMemory(topic="t", preference="0"))
    store.update("ada", "persona", record.id, PersonaMemory(topic="t", preference="1"))
    (history,) = tmp_path.glob("users/*/persona.history.jsonl")
    with history.open("ab") as file:
        file.write(b'{"operation": "update", "before": "' + b"x" * (3 << 20))  # torn, 3 MiB
    store.update("ada", "persona", record.id, PersonaMemory(topic="t", preference="2"))
    changes = store.history("ada", "persona", record.id)
    assert [c.before.content.preference for c in changes] == ["0", "1"]


def corrupt_history(root: Path) -> tuple[JsonlMemoryStore, Path, MemoryRecord]:
    """Ada's persona history with a bad line 2 between two good ones."""
    store = JsonlMemoryStore(root)
    record = store.add("ada", PersonaMemory(topic="t", preference="0"))
    for preference in "12":
        store.update("ada", "persona", record.id, PersonaMemory(topic="t", preference=preference))
    (history,) = root.glob("users/*/persona.history.jsonl")
    first, second = history.read_bytes().splitlines(keepends=True)
    history.write_bytes(first + b'{"operation": "upd\n' + second)
    return store, history, record


def test_a_corrupt_history_refuses_every_write_and_changes_nothing(tmp_path: Path) -> None:
    _, history, record = corrupt_history(tmp_path / "store")

    def files() -> dict[Path, bytes]:  # lock files aside: taking a lock is no write
        return {p: p.read_bytes() for p in history.parent.iterdir() if p.suffix != ".lock"}

    files_before = files()
    store = JsonlMemoryStore(tmp_path / "store")
    healthy = store.snapshot("ada")  # reads still work: the bank is fine
    content = PersonaMemory(topic="t", preference="new")
    for call in (
        lambda: store.update("ada", "persona", record.id, content),
        lambda: store.delete("ada", "persona", record.id),
        lambda: store.add("ada", content),
        lambda: store.add_many("ada", "persona", [content, content]),
        lambda: store.compact("ada"),
        lambda: store.restore(healthy),  # without replace, nothing is overwritten
        lambda: store.locked("ada", "persona").__enter__(),
    ):
        with pytest.raises(MemoryStoreCorruptionError, match="not valid JSON") as info:
            call()
        assert (info.value.path, info.value.line) == (history, 2)
        assert "import --replace" in str(info.value)
    assert files() == files_before
    assert store.get("ada", "persona", record.id).content.preference == "2"
    store.add("ada", TrajectoryMemory(query="another bank of ada is unaffected"))


def test_corruption_appended_to_a_checked_history_is_caught(tmp_path: Path) -> None:
    store = JsonlMemoryStore(tmp_path)
    record = store.add("ada", PersonaMemory(topic="t", preference="0"))
    store.update("ada", "persona", record.id, PersonaMemory(topic="t", preference="1"))
    store.add("ada", PersonaMemory(topic="u", preference="p"))  # the history is checked now
    (history,) = tmp_path.glob("users/*/persona.history.jsonl")
    good = history.read_bytes()
    with history.open("ab") as file:
        file.write(b"[]\n")
    with pytest.raises(MemoryStoreCorruptionError, match="JSON object") as info:
        store.add("ada", PersonaMemory(topic="v", preference="p"))
    assert info.value.line == 2
    history.write_bytes(good)  # repaired by hand
    store.add("ada", PersonaMemory(topic="v", preference="p"))
    # Edited in place to the same size, by a person or a failing disk: caught too.
    history.write_bytes(good.replace(b'"operation":"update"', b'"operation":"updatX"'))
    with pytest.raises(MemoryStoreCorruptionError, match="operation") as info:
        store.add("ada", PersonaMemory(topic="w", preference="p"))
    assert info.value.line == 1


def test_import_replace_repairs_a_corrupt_history_and_keeps_its_bytes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "store"
    store, history, record = corrupt_history(root)
    corrupt = history.read_bytes()
    snapshot = tmp_path / "ada.json"
    assert main(["export", str(root), "ada", str(snapshot)]) == 0
    assert main(["verify", str(root)]) == 1
    assert f"{history}:2" in capsys.readouterr().err

    assert main(["import", "--replace", str(snapshot), str(root)]) == 0
    (kept,) = history.parent.glob("persona.history.*.corrupt")
    assert kept.read_bytes() == corrupt  # nothing deleted
    assert kept.name.removeprefix("persona.history.").removesuffix("Z.corrupt").isalnum()
    assert f"kept it as {kept}" in capsys.readouterr().err
    assert main(["verify", str(root)]) == 0
    assert capsys.readouterr().out == "ok: 1 users, every bank and history readable\n"
    # The user is writable again, by this store object and a new one alike.
    for view in (store, JsonlMemoryStore(root)):
        view.update("ada", "persona", record.id, PersonaMemory(topic="t", preference="3"))
    assert [c.before.content.preference for c in store.history("ada", "persona")] == ["2", "3"]


def test_a_history_line_of_another_bank_or_record_is_corruption(tmp_path: Path) -> None:
    store, history, record = corrupt_history(tmp_path / "store")
    first = history.read_bytes().splitlines(keepends=True)[0]
    current = store.get("ada", "persona", record.id)
    someone_else = MemoryRecord.of(PersonaMemory(topic="t", preference="not ada's"))
    for change, reason in (
        (
            MemoryChange(
                operation="delete",
                at=current.updated_at,
                before=MemoryRecord.of(WorkspaceMemory(state={"file": "notes.md"})),
            ),
            "a change of a workspace record in the persona history",
        ),
        (
            MemoryChange(
                operation="update", at=current.updated_at, before=current, after=someone_else
            ),
            f"an update of {record.id!r} to another record",
        ),
    ):
        history.write_bytes(first + change.model_dump_json().encode() + b"\n")
        with pytest.raises(MemoryStoreCorruptionError, match=reason) as info:
            store.history("ada", "persona")
        assert (info.value.path, info.value.line) == (history, 2)
        with pytest.raises(MemoryStoreCorruptionError, match=reason):
            store.update("ada", "persona", record.id, PersonaMemory(topic="t", preference="3"))


@pytest.mark.parametrize("which", ["persona.jsonl", "persona.history.jsonl"])
def test_import_replace_repairs_a_folder_where_a_bank_or_history_belongs(
    tmp_path: Path, which: str
) -> None:
    root = tmp_path / "store"
    store = JsonlMemoryStore(root)
    store.add("ada", PersonaMemory(topic="tone", preference="terse"))
    snapshot = tmp_path / "ada.json"
    assert main(["export", str(root), "ada", str(snapshot)]) == 0
    (folder,) = (root / "users").iterdir()
    target = folder / which
    target.unlink(missing_ok=True)
    target.mkdir()
    (target / "inside").write_text("a person's file")
    assert main(["verify", str(root)]) == 1

    assert main(["import", "--replace", str(snapshot), str(root)]) == 0

    (kept,) = folder.glob(f"{which.removesuffix('.jsonl')}.*.corrupt")
    assert (kept / "inside").read_text() == "a person's file"  # moved aside, not lost
    assert main(["verify", str(root)]) == 0
    assert [r.content.preference for r in JsonlMemoryStore(root).list("ada", "persona")] == [
        "terse"
    ]
