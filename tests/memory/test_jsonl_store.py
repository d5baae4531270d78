"""JsonlMemoryStore operations on real files."""

from pathlib import Path

import orjson
import pytest

from autopersona_flows import (
    JsonlMemoryStore,
    MemoryNotFoundError,
    MemoryRecord,
    MemoryStore,
    PersonaMemory,
    TrajectoryMemory,
    WorkspaceMemory,
)
from autopersona_flows.cli import main
from autopersona_flows.errors import DuplicateMemoryError
from autopersona_flows.memory.records import Embedding
from autopersona_flows.memory.users import user_key

TRICKY_TEXT = (
    "tab\there, LS\u2028PS\u2029NEL\u0085, CR\r LF\n emoji 🧠👩🏽‍💻, NUL\x00, RTL \u202e, 𝔘𝔫𝔦"
)


def bank_file(root: Path, user: str, layer: str) -> Path:
    (folder,) = [
        f
        for f in (root / "users").iterdir()
        if (f / f"{layer}.jsonl").exists()
        and orjson.loads((f / f"{layer}.jsonl").read_bytes().split(b"\n")[0])["user_id"] == user
    ]
    return folder / f"{layer}.jsonl"


def test_is_a_memory_store(store: JsonlMemoryStore) -> None:
    assert isinstance(store, MemoryStore)


@pytest.mark.parametrize(
    "content",
    [
        TrajectoryMemory(
            query=TRICKY_TEXT,
            trace=[TRICKY_TEXT, {"k": [1, 2.5, None]}],
            outcome={"ok": True},
            insight=TRICKY_TEXT,
        ),
        WorkspaceMemory(task=TRICKY_TEXT, interaction=[{"t": TRICKY_TEXT}], state=[1, "x"]),
        PersonaMemory(topic=TRICKY_TEXT, preference=TRICKY_TEXT, strategy=TRICKY_TEXT),
    ],
    ids=["trajectory", "workspace", "persona"],
)
def test_round_trip_each_layer_through_a_new_instance(store_root: Path, content) -> None:
    added = JsonlMemoryStore(store_root).add("ada", content)
    reread = JsonlMemoryStore(store_root)
    assert reread.get("ada", content.layer, added.id) == added
    assert reread.list("ada", content.layer) == [added]
    # One line per entry: the separators inside the text never split a line.
    lines = bank_file(store_root, "ada", content.layer).read_bytes().split(b"\n")
    assert len(lines) == 3  # header, record, and the empty string after the last newline
    assert lines[-1] == b""


def test_file_is_plain_utf8_jsonl(store: JsonlMemoryStore, store_root: Path) -> None:
    record = store.add("ada", PersonaMemory(topic="greeting", preference="grüß dich 👋"))
    text = bank_file(store_root, "ada", "persona").read_text(encoding="utf-8")
    header, line = text.splitlines()[:2]
    assert orjson.loads(header)["user_id"] == "ada"
    assert "grüß dich 👋" in line
    assert MemoryRecord.model_validate_json(line) == record


def test_add_many_keeps_order_and_accepts_records_or_contents(store: JsonlMemoryStore) -> None:
    explicit = MemoryRecord.of(PersonaMemory(topic="a", preference="1"))
    added = store.add_many("ada", "persona", [PersonaMemory(topic="b", preference="2"), explicit])
    assert added[1] == explicit
    assert [m.content.topic for m in store.list("ada", "persona")] == ["b", "a"]
    assert store.add_many("ada", "persona", []) == []


def test_add_many_rejects_other_layers_and_duplicates_without_writing(
    store: JsonlMemoryStore,
) -> None:
    existing = store.add("ada", PersonaMemory(topic="a", preference="1"))
    with pytest.raises(ValueError, match="item 1: is a trajectory memory"):
        store.add_many(
            "ada",
            "persona",
            [PersonaMemory(topic="b", preference="2"), TrajectoryMemory(query="q")],
        )
    with pytest.raises(DuplicateMemoryError, match="already stored"):
        store.add_many("ada", "persona", [PersonaMemory(topic="c", preference="3"), existing])
    twice = MemoryRecord.of(PersonaMemory(topic="d", preference="4"))
    with pytest.raises(DuplicateMemoryError, match="twice"):
        store.add_many("ada", "persona", [twice, twice])
    with pytest.raises(TypeError, match="got dict"):
        store.add_many("ada", "persona", [{"topic": "e", "preference": "5"}])
    assert store.list("ada", "persona") == [existing]


def test_add_rejects_a_duplicate_id(store: JsonlMemoryStore) -> None:
    record = store.add("ada", PersonaMemory(topic="a", preference="1"))
    with pytest.raises(DuplicateMemoryError):
        store.add("ada", record)
    with pytest.raises(TypeError, match="MemoryRecord or a layer content model"):
        store.add("ada", "just text")  # type: ignore[arg-type]
    assert store.list("ada", "persona") == [record]


def test_update_keeps_identity_and_records_history(store: JsonlMemoryStore) -> None:
    first = store.add(
        "ada",
        MemoryRecord.of(
            content=PersonaMemory(topic="tone", preference="formal"),
            embedding=Embedding.of("m", [1.0]),
        ),
    )
    other = store.add("ada", PersonaMemory(topic="length", preference="short"))
    updated = store.update(
        "ada", "persona", first.id, PersonaMemory(topic="tone", preference="casual")
    )
    assert updated.id == first.id
    assert updated.created_at == first.created_at
    assert updated.updated_at >= first.updated_at
    assert updated.embedding is None  # the old embedding described the old content
    assert store.list("ada", "persona") == [updated, other]  # position kept, identity by id
    (change,) = store.history("ada", "persona", first.id)
    assert (change.operation, change.before, change.after) == ("update", first, updated)
    assert JsonlMemoryStore(store.root).history("ada", "persona", first.id) == [change]
    assert store.history("ada", "persona", other.id) == []


def test_update_validates_content_for_the_layer(store: JsonlMemoryStore) -> None:
    record = store.add("ada", PersonaMemory(topic="tone", preference="formal"))
    with pytest.raises(TypeError, match="must be a PersonaMemory"):
        store.update("ada", "persona", record.id, TrajectoryMemory(query="q"))
    updated = store.update("ada", "persona", record.id, {"topic": "tone", "preference": "warm"})
    assert updated.content.preference == "warm"


def test_delete_removes_and_keeps_history(store: JsonlMemoryStore) -> None:
    keep = store.add("ada", TrajectoryMemory(query="keep"))
    gone = store.add("ada", TrajectoryMemory(query="gone"))
    assert store.delete("ada", "trajectory", gone.id) == gone
    assert store.list("ada", "trajectory") == [keep]
    with pytest.raises(MemoryNotFoundError):
        store.get("ada", "trajectory", gone.id)
    (change,) = store.history("ada", "trajectory", gone.id)
    assert (change.operation, change.before, change.after) == ("delete", gone, None)
    assert JsonlMemoryStore(store.root).list("ada", "trajectory") == [keep]


def test_unknown_ids_are_typed_not_found_errors(store: JsonlMemoryStore) -> None:
    store.add("ada", PersonaMemory(topic="t", preference="p"))
    missing = MemoryRecord.of(PersonaMemory(topic="t", preference="p")).id
    for call in (
        lambda: store.get("ada", "persona", missing),
        lambda: store.update("ada", "persona", missing, PersonaMemory(topic="t", preference="q")),
        lambda: store.delete("ada", "persona", missing),
        lambda: store.get("bob", "persona", missing),
    ):
        with pytest.raises(MemoryNotFoundError, match=missing) as info:
            call()
        assert isinstance(info.value, KeyError)
        assert str(info.value).startswith("no persona memory")


def test_every_call_is_partitioned_by_user(store: JsonlMemoryStore) -> None:
    ada = store.add("ada", PersonaMemory(topic="t", preference="ada's"))
    store.add("bob", PersonaMemory(topic="t", preference="bob's"))
    assert [m.content.preference for m in store.list("bob", "persona")] == ["bob's"]
    with pytest.raises(MemoryNotFoundError):
        store.get("bob", "persona", ada.id)
    with pytest.raises(MemoryNotFoundError):
        store.delete("bob", "persona", ada.id)
    assert store.snapshot("bob").counts["persona"] == 1
    assert store.list("ada", "persona") == [ada]
    # The same record (same id) may exist for two users without colliding.
    store.add("bob", ada)
    assert store.get("bob", "persona", ada.id) == ada


def test_layers_are_separate(store: JsonlMemoryStore) -> None:
    store.add("ada", PersonaMemory(topic="t", preference="p"))
    assert store.list("ada", "trajectory") == []
    assert store.list("ada", "workspace") == []
    with pytest.raises(ValueError, match="unknown memory layer"):
        store.list("ada", "episodic")  # type: ignore[arg-type]


def test_reads_of_unknown_users_write_nothing(store_root: Path) -> None:
    store = JsonlMemoryStore(store_root)
    assert store.list("nobody", "persona") == []
    assert store.users() == []
    assert store.snapshot("nobody").is_empty
    assert not store_root.exists()


def test_users_lists_every_user_once(store: JsonlMemoryStore) -> None:
    store.add("zoe", PersonaMemory(topic="t", preference="p"))
    store.add("ada", TrajectoryMemory(query="q"))
    store.add("ada", PersonaMemory(topic="t", preference="p"))
    assert store.users() == ["ada", "zoe"]


def test_compaction_bounds_the_file_and_keeps_the_data(
    store: JsonlMemoryStore, store_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(JsonlMemoryStore, "compact_min_dead", 16)
    keep = [store.add("ada", PersonaMemory(topic=f"keep {i}", preference="p")) for i in range(10)]
    churn = store.add("ada", PersonaMemory(topic="churn", preference="0"))
    path = bank_file(store_root, "ada", "persona")
    other = JsonlMemoryStore(store_root)
    assert len(other.list("ada", "persona")) == 11  # warm the second instance's view
    inode = path.stat().st_ino
    for i in range(1, 200):
        churn = store.update(
            "ada", "persona", churn.id, PersonaMemory(topic="churn", preference=str(i))
        )
        lines = path.read_bytes().count(b"\n")
        assert lines <= 1 + 11 + max(16, 11) + 1
    assert path.stat().st_ino != inode  # rewritten at least once
    assert store.list("ada", "persona") == [*keep, churn]
    assert other.list("ada", "persona") == [*keep, churn]  # the other view noticed the rewrite
    assert len(store.history("ada", "persona", churn.id)) == 199
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]


def test_locked_holds_the_bank_across_calls(store: JsonlMemoryStore) -> None:
    with store.locked("ada", "persona"):
        record = store.add("ada", PersonaMemory(topic="t", preference="p"))
        assert store.list("ada", "persona") == [record]
    assert store.get("ada", "persona", record.id) == record


def test_unknown_store_format_is_refused(store_root: Path) -> None:
    store_root.mkdir()
    (store_root / "store.json").write_bytes(b'{"format": "autopersona-jsonl-store", "version": 9}')
    with pytest.raises(Exception, match="version 1"):
        JsonlMemoryStore(store_root)


def test_files_are_created_with_a_header_atomically(
    store: JsonlMemoryStore, store_root: Path
) -> None:
    store.add("ada", PersonaMemory(topic="t", preference="p"))
    folder = bank_file(store_root, "ada", "persona").parent
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["persona.jsonl", "persona.lock"]
    assert orjson.loads((store_root / "store.json").read_bytes())["version"] == 1


def test_changes_feed_is_incremental_and_survives_compaction(
    store: JsonlMemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(JsonlMemoryStore, "compact_min_dead", 4)
    start = store.changes("ada", "persona")
    assert (start.full, start.records) == (True, [])
    a = store.add("ada", PersonaMemory(topic="a", preference="1"))
    b = store.add("ada", PersonaMemory(topic="b", preference="1"))
    first = store.changes("ada", "persona", start.cursor)
    assert {r.id for r in first.records} == {a.id, b.id}
    nothing = store.changes("ada", "persona", first.cursor)
    assert (nothing.full, nothing.records, nothing.deleted) == (False, [], [])

    for i in range(10):  # enough churn to compact the file several times
        a = store.update("ada", "persona", a.id, PersonaMemory(topic="a", preference=str(i)))
    store.delete("ada", "persona", b.id)
    after = store.changes("ada", "persona", first.cursor)
    assert after.full is False  # this process's own compactions keep the feed going
    assert (after.records, after.deleted) == ([a], [b.id])


def test_changes_start_over_for_unknown_cursors_and_other_views(store: JsonlMemoryStore) -> None:
    a = store.add("ada", PersonaMemory(topic="a", preference="1"))
    cursor = store.changes("ada", "persona").cursor
    assert store.changes("ada", "persona", "bogus").full
    other = JsonlMemoryStore(store.root)
    resumed = other.changes("ada", "persona", cursor)  # another process's cursor means nothing here
    assert (resumed.full, resumed.records) == (True, [a])
    assert store.changes("bob", "persona", cursor).records == []


def test_temporary_files_of_a_killed_rewrite_are_removed(
    store: JsonlMemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(JsonlMemoryStore, "compact_min_dead", 2)
    record = store.add("ada", PersonaMemory(topic="t", preference="0"))
    folder = bank_file(store.root, "ada", "persona").parent
    leftover = folder / ".persona.jsonl.k1ll3d.tmp"  # what a writer killed mid-rewrite leaves
    leftover.write_bytes(b"half a bank")
    for i in range(1, 5):  # enough dead entries to compact
        store.update("ada", "persona", record.id, PersonaMemory(topic="t", preference=str(i)))
    assert not leftover.exists()
    assert store.get("ada", "persona", record.id).content.preference == "4"


def test_a_failed_compaction_does_not_fail_the_write_that_landed(
    store: JsonlMemoryStore, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from autopersona_flows.memory import _banks

    monkeypatch.setattr(JsonlMemoryStore, "compact_min_dead", 2)
    record = store.add("ada", PersonaMemory(topic="t", preference="0"))

    def disk_full(path: Path, data: bytes) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_banks, "atomic_write", disk_full)
    for i in range(1, 6):  # each update triggers a compaction that fails
        record = store.update(
            "ada", "persona", record.id, PersonaMemory(topic="t", preference=str(i))
        )
    assert "No space left on device" in caplog.text
    monkeypatch.undo()
    assert JsonlMemoryStore(store.root).get("ada", "persona", record.id).content.preference == "5"
    assert len(store.history("ada", "persona", record.id)) == 5


def test_what_else_lies_in_users_is_ignored_by_every_listing(
    store: JsonlMemoryStore, store_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store.add("ada", PersonaMemory(topic="t", preference="p"))
    store.add("bob", TrajectoryMemory(query="q"))
    users = store_root / "users"
    (users / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")  # what macOS Finder leaves
    (users / "._ada").write_bytes(b"AppleDouble")
    (users / "notes.txt").write_text("ada moved to the new laptop")
    (users / "ada copy").mkdir()  # a folder duplicated in a file manager
    (users / "ada copy" / "persona.jsonl").write_bytes(
        bank_file(store_root, "ada", "persona").read_bytes()
    )

    assert store.users() == JsonlMemoryStore(store_root).users() == ["ada", "bob"]
    assert [(s.path.name, s.damage) for s in store.strays()] == [
        ("ada copy", False),
        ("notes.txt", False),
    ]
    assert main(["users", str(store_root)]) == 0
    assert capsys.readouterr().out.splitlines() == ["ada", "bob"]
    assert main(["verify", str(store_root)]) == 0
    out, err = capsys.readouterr()
    assert out == "ok: 2 users, every bank and history readable\n"
    assert err.splitlines() == [
        f"warning: {users / 'ada copy'}: not a user folder (not a name the store gives); ignored",
        f"warning: {users / 'notes.txt'}: not a user folder (not a name the store gives); ignored",
    ]
    assert main(["reindex", str(store_root)]) == 0
    assert "of 2 users" in capsys.readouterr().out
    assert main(["migrate", "--from", str(store_root), "--to", str(tmp_path / "copy")]) == 0
    assert JsonlMemoryStore(tmp_path / "copy").users() == ["ada", "bob"]


def test_a_file_with_a_user_folders_name_is_damage_that_verify_reports(
    store: JsonlMemoryStore, store_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store.add("ada", PersonaMemory(topic="t", preference="p"))
    carol = store_root / "users" / user_key("carol")
    carol.write_text("carol's folder, replaced by a file")
    assert store.users() == ["ada"]  # listing goes on
    (stray,) = store.strays()
    assert (stray.path, stray.damage) == (carol, True)
    assert main(["users", str(store_root)]) == 0
    assert capsys.readouterr().out == "ada\n"
    assert main(["verify", str(store_root)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"damage: {carol}: a user folder's name on something that is not a")
    assert err.splitlines()[-1] == f"error: damage in {carol.parent}: {carol.name} (see above)"
