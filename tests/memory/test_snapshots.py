"""Snapshots, fingerprints, and the export / import commands, run as a user would."""

import os
import subprocess
import sys
import threading
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import orjson
import pytest
from pydantic import ValidationError

from autopersona_flows import JsonlMemoryStore, PersonaMemory, TrajectoryMemory, WorkspaceMemory
from autopersona_flows.cli import main
from autopersona_flows.errors import SnapshotError
from autopersona_flows.memory import MemorySnapshot
from autopersona_flows.memory.snapshots import read_snapshot

PRIVATE_TEXT = "my bank PIN is 4321"


def seed(store: JsonlMemoryStore, user: str = "ada") -> None:
    store.add(user, TrajectoryMemory(query=PRIVATE_TEXT, trace=["a"], insight="i"))
    store.add(user, WorkspaceMemory(state={"file": "notes.md"}))
    store.add_many(
        user,
        "persona",
        [
            PersonaMemory(topic="tone", preference=PRIVATE_TEXT),
            PersonaMemory(topic="length", preference="short"),
        ],
    )


def test_snapshot_holds_every_layer_in_id_order(store: JsonlMemoryStore) -> None:
    seed(store)
    snapshot = store.snapshot("ada")
    assert snapshot.counts == {"trajectory": 1, "workspace": 1, "persona": 2}
    for layer, records in snapshot.memories.items():
        assert records == sorted(store.list("ada", layer), key=lambda r: r.id)
    assert store.snapshot_fingerprint("ada") == snapshot.fingerprint


def test_fingerprint_changes_with_any_change_and_ignores_other_users(
    store: JsonlMemoryStore,
) -> None:
    seed(store)
    before = store.snapshot_fingerprint("ada")
    seed(store, "bob")
    assert store.snapshot_fingerprint("ada") == before
    (tone, _) = store.list("ada", "persona")
    store.update("ada", "persona", tone.id, PersonaMemory(topic="tone", preference="warm"))
    assert store.snapshot_fingerprint("ada") != before


def test_fingerprint_is_identical_across_processes(store: JsonlMemoryStore) -> None:
    seed(store)
    code = (
        "import sys; from autopersona_flows import JsonlMemoryStore; "
        "print(JsonlMemoryStore(sys.argv[1]).snapshot_fingerprint('ada'))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "123"}  # a different hash seed must not matter
    other = subprocess.run(
        [sys.executable, "-c", code, str(store.root)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    assert other.stdout.strip() == store.snapshot_fingerprint("ada")


def test_tampered_snapshots_do_not_validate(store: JsonlMemoryStore) -> None:
    seed(store)
    data = store.snapshot("ada").model_dump(mode="json")
    data["memories"]["persona"][0]["content"]["preference"] = "tampered"
    with pytest.raises(ValidationError, match="fingerprint does not match"):
        MemorySnapshot.model_validate(data)
    data = store.snapshot("ada").model_dump(mode="json")
    data["counts"]["persona"] = 5
    with pytest.raises(ValidationError, match="counts"):
        MemorySnapshot.model_validate(data)


def test_snapshot_of_a_corrupt_bank_fails_and_changes_nothing(
    store: JsonlMemoryStore, store_root: Path
) -> None:
    seed(store)
    (path,) = store_root.glob("users/*/workspace.jsonl")
    path.write_bytes(path.read_bytes() + b"[]\n")
    files = {p: p.read_bytes() for p in store_root.rglob("*") if p.is_file()}
    with pytest.raises(Exception, match="must be a JSON object"):
        store.snapshot("ada")
    assert {p: p.read_bytes() for p in store_root.rglob("*") if p.is_file()} == files


def test_export_and_import_round_trip_through_the_cli(
    run_cli, store: JsonlMemoryStore, tmp_path: Path
) -> None:
    seed(store)
    dest = tmp_path / "exports" / "ada.json"
    dest.parent.mkdir()
    exported = run_cli("export", str(store.root), "ada", str(dest))
    assert exported.returncode == 0, exported.stderr
    fingerprint = store.snapshot_fingerprint("ada")
    assert f"sha256:{fingerprint}" in exported.stdout
    assert "4 memories (trajectory 1, workspace 1, persona 2)" in exported.stdout
    assert PRIVATE_TEXT not in exported.stdout + exported.stderr  # counts and digest only

    data = orjson.loads(dest.read_bytes())
    assert sorted(data) == ["counts", "fingerprint", "memories", "schema_version", "user_id"]
    assert (data["schema_version"], data["user_id"], data["fingerprint"]) == (1, "ada", fingerprint)

    other = tmp_path / "restored"
    imported = run_cli("import", str(dest), str(other))
    assert imported.returncode == 0, imported.stderr
    assert JsonlMemoryStore(other).snapshot_fingerprint("ada") == fingerprint
    assert PRIVATE_TEXT not in imported.stdout


def test_python_module_entry_point_exports(store: JsonlMemoryStore, tmp_path: Path) -> None:
    seed(store)
    dest = tmp_path / "ada.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "autopersona_flows.export_snapshot",
            str(store.root),
            "ada",
            str(dest),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert read_snapshot(dest).fingerprint == store.snapshot_fingerprint("ada")


def test_import_over_existing_memories_needs_replace(
    run_cli, store: JsonlMemoryStore, tmp_path: Path
) -> None:
    seed(store)
    dest = tmp_path / "ada.json"
    assert main(["export", str(store.root), "ada", str(dest)]) == 0
    store.add("ada", PersonaMemory(topic="added later", preference="p"))
    changed = store.snapshot_fingerprint("ada")

    refused = run_cli("import", str(dest), str(store.root))
    assert refused.returncode == 1
    assert "already has 5 memories" in refused.stderr
    assert "pass --replace to overwrite them" in refused.stderr
    assert "replace=True" not in refused.stderr  # the CLI's words, not the Python API's
    assert store.snapshot_fingerprint("ada") == changed

    assert main(["import", str(dest), str(store.root), "--replace"]) == 0
    assert store.snapshot_fingerprint("ada") == read_snapshot(dest).fingerprint
    assert (
        JsonlMemoryStore(store.root).snapshot_fingerprint("ada") == read_snapshot(dest).fingerprint
    )


def test_export_refuses_a_destination_inside_the_store(
    store: JsonlMemoryStore, capsys: pytest.CaptureFixture[str]
) -> None:
    seed(store)
    assert main(["export", str(store.root), "ada", str(store.root / "users" / "x.json")]) == 1
    assert "refusing to export into the store" in capsys.readouterr().err
    assert not (store.root / "users" / "x.json").exists()


def test_a_failed_export_leaves_the_earlier_one_untouched(
    store: JsonlMemoryStore, store_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    seed(store)
    dest = tmp_path / "ada.json"
    assert main(["export", str(store_root), "ada", str(dest)]) == 0
    earlier = dest.read_bytes()
    (path,) = store_root.glob("users/*/persona.jsonl")
    path.write_bytes(path.read_bytes().replace(b'"topic":"length"', b'"topic":7'))
    assert main(["export", str(store_root), "ada", str(dest)]) == 1
    err = capsys.readouterr().err
    assert f"{path}:" in err
    assert dest.read_bytes() == earlier
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_an_unknown_user_exports_an_explicitly_empty_snapshot(
    store: JsonlMemoryStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    seed(store)
    dest = tmp_path / "nobody.json"
    assert main(["export", str(store.root), "nobody", str(dest)]) == 0
    assert "the snapshot is empty" in capsys.readouterr().out
    snapshot = read_snapshot(dest)
    assert snapshot.is_empty
    assert snapshot.memories == {"trajectory": [], "workspace": [], "persona": []}
    restored = tmp_path / "restored"
    assert main(["import", str(dest), str(restored)]) == 0
    assert JsonlMemoryStore(restored).snapshot_fingerprint("nobody") == snapshot.fingerprint


def test_bad_snapshot_files_and_missing_stores_are_clear_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema_version": 2}')
    assert main(["import", str(bad), str(tmp_path / "s")]) == 1
    assert "is not a valid snapshot" in capsys.readouterr().err
    with pytest.raises(SnapshotError, match="cannot read snapshot"):
        read_snapshot(tmp_path / "missing.json")
    assert main(["export", str(tmp_path / "nowhere"), "ada", str(tmp_path / "x.json")]) == 1
    assert "no memory store at" in capsys.readouterr().err


def test_users_and_verify_commands(run_cli, store: JsonlMemoryStore, store_root: Path) -> None:
    seed(store, "ada")
    seed(store, "bob")
    users = run_cli("users", str(store_root))
    assert users.stdout.splitlines() == ["ada", "bob"]
    ok = run_cli("verify", str(store_root))
    assert (ok.returncode, ok.stdout.strip()) == (0, "ok: 2 users, every bank and history readable")
    (tone, _) = store.list("ada", "persona")
    store.update("ada", "persona", tone.id, PersonaMemory(topic="tone", preference="warm"))
    (history,) = store_root.glob("users/ada-*/persona.history.jsonl")
    history.write_bytes(b"not json\n" + history.read_bytes())
    bad_history = run_cli("verify", str(store_root))
    assert bad_history.returncode == 1
    assert f"{history}:1" in bad_history.stderr
    history.write_bytes(history.read_bytes().split(b"\n", 1)[1])
    (path,) = store_root.glob("users/bob-*/trajectory.jsonl")
    path.write_bytes(path.read_bytes() + b"oops\n")
    broken = run_cli("verify", str(store_root))
    assert broken.returncode == 1
    assert f"{path}:3" in broken.stderr


def test_export_into_a_missing_folder_creates_it(
    run_cli, store: JsonlMemoryStore, tmp_path: Path
) -> None:
    seed(store)
    result = run_cli("export", str(store.root), "ada", "./exports/2026/ada.json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    dest = tmp_path / "exports" / "2026" / "ada.json"
    assert read_snapshot(dest).fingerprint == store.snapshot_fingerprint("ada")
    assert [p.name for p in dest.parent.iterdir()] == ["ada.json"]  # no temporary file left


def test_export_with_a_file_in_the_way_fails_cleanly_and_creates_nothing(
    run_cli, store: JsonlMemoryStore, tmp_path: Path
) -> None:
    seed(store)
    (tmp_path / "afile").write_text("not a folder")
    for dest in (tmp_path / "afile" / "ada.json", tmp_path / "afile" / "more" / "ada.json"):
        result = run_cli("export", str(store.root), "ada", str(dest))
        assert result.returncode == 1
        assert result.stderr.startswith("error: cannot write snapshot")
        assert "Not a directory" in result.stderr
        assert "Traceback" not in result.stderr
    assert (tmp_path / "afile").read_text() == "not a folder"


def test_a_snapshot_of_a_user_whose_banks_are_being_created_is_never_torn(
    store: JsonlMemoryStore, store_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A snapshot (through another store object, as another process takes it) of a new
    user reads a layer before its file exists; a writer then adds one memory to each
    layer under all three locks before the snapshot reaches the next layer. The
    snapshot must not see the first layer behind (0, 1, 1): all three or none."""
    reader = JsonlMemoryStore(store_root)
    workspace = reader._bank("ada", "workspace")
    hold = workspace.hold
    written: list[bool] = []

    def write_everything_first(*, exclusive: bool) -> Any:
        if not written:  # the writer's whole transaction, between two layers of the read
            written.append(True)
            writer = threading.Thread(target=write_one_memory_each, args=(store, "ada"))
            writer.start()
            writer.join()
        return hold(exclusive=exclusive)

    monkeypatch.setattr(workspace, "hold", write_everything_first)
    counts = [len(layer) for layer in reader.snapshot("ada").memories.values()]
    assert written
    assert counts == [1, 1, 1]


def write_one_memory_each(store: JsonlMemoryStore, user: str) -> None:
    with ExitStack() as stack:
        for layer in ("trajectory", "workspace", "persona"):
            stack.enter_context(store.locked(user, layer))
        store.add(user, TrajectoryMemory(query="plan the trip"))
        store.add(user, WorkspaceMemory(task="trip", state="booked"))
        store.add(user, PersonaMemory(topic="seat", preference="aisle"))
