"""Links inside a JSONL store never lead its reads or writes outside it.

The store's folder may itself be a link; a bank, history, lock, user folder or
``users/`` linked outside the (resolved) folder raises `UnsafeLinkError` naming the
path, and the file it leads to is neither read nor written.
"""

from collections.abc import Callable
from pathlib import Path

import pytest

from autopersona_flows import JsonlMemoryStore, MemoryRecord, PersonaMemory
from autopersona_flows.cli import main
from autopersona_flows.errors import UnsafeLinkError
from autopersona_flows.memory.users import user_key

# What the review found written to: a file whose last line had no newline yet.
PRECIOUS = b"someone else's file\nits last line, not yet ended"


def _seeded(root: Path) -> tuple[JsonlMemoryStore, MemoryRecord, Path]:
    """Ada with a persona record, updated once (so it has a history); her folder."""
    store = JsonlMemoryStore(root)
    record = store.add("ada", PersonaMemory(topic="tone", preference="terse"))
    store.update("ada", "persona", record.id, PersonaMemory(topic="tone", preference="warm"))
    return store, record, root / "users" / user_key("ada")


def _link_out(path: Path, outside: Path, *, keep: bool = True) -> Path:
    """Replace ``path`` by a link to ``outside`` (which gets ``path``'s bytes if ``keep``)."""
    outside.parent.mkdir(parents=True, exist_ok=True)
    if keep and path.exists():
        path.replace(outside)
    path.unlink(missing_ok=True)
    path.symlink_to(outside)
    return outside


def _every_call(store: JsonlMemoryStore, record: MemoryRecord) -> dict[str, Callable[[], object]]:
    content = PersonaMemory(topic="tone", preference="formal")
    return {
        "list": lambda: store.list("ada", "persona"),
        "history": lambda: store.history("ada", "persona"),
        "snapshot": lambda: store.snapshot("ada"),
        "add": lambda: store.add("ada", content),
        "update": lambda: store.update("ada", "persona", record.id, content),
        "delete": lambda: store.delete("ada", "persona", record.id),
        "compact": lambda: store.compact("ada"),
    }


@pytest.mark.parametrize(
    ("what", "allowed"),
    [
        ("persona.history.jsonl", {"list", "snapshot"}),  # the bank is fine; writes check both
        ("persona.jsonl", set()),
        ("persona.lock", set()),  # readers take the lock too
    ],
)
def test_a_file_linked_outside_is_never_read_or_written(
    tmp_path: Path, what: str, allowed: set[str]
) -> None:
    _, record, folder = _seeded(tmp_path / "store")
    outside = _link_out(folder / what, tmp_path / "elsewhere" / what, keep=False)
    outside.write_bytes(PRECIOUS)
    for name, call in _every_call(JsonlMemoryStore(tmp_path / "store"), record).items():
        if name in allowed:
            call()
            continue
        with pytest.raises(UnsafeLinkError) as info:
            call()
        assert (info.value.path, info.value.target) == (folder / what, outside.resolve()), name
        assert f"{folder / what} leads to {outside.resolve()}, outside the store" in str(info.value)
    assert outside.read_bytes() == PRECIOUS


def test_a_link_to_a_file_that_does_not_exist_yet_creates_nothing_outside(tmp_path: Path) -> None:
    store = JsonlMemoryStore(tmp_path / "store")
    record = store.add("ada", PersonaMemory(topic="tone", preference="terse"))
    history = tmp_path / "store" / "users" / user_key("ada") / "persona.history.jsonl"
    outside = tmp_path / "elsewhere" / "history.jsonl"
    history.symlink_to(outside)  # dangling: an append would create it
    with pytest.raises(UnsafeLinkError):
        store.update("ada", "persona", record.id, PersonaMemory(topic="tone", preference="warm"))
    assert not outside.parent.exists()
    assert store.get("ada", "persona", record.id) == record  # and the bank did not change


@pytest.mark.parametrize("linked", ["user folder", "users"])
def test_a_folder_linked_outside_is_refused_and_nothing_is_made_there(
    tmp_path: Path, linked: str
) -> None:
    root = tmp_path / "store"
    _, record, folder = _seeded(root)
    path = folder if linked == "user folder" else root / "users"
    outside = _link_out(path, tmp_path / "elsewhere" / path.name)
    before = {p: p.read_bytes() for p in outside.rglob("*") if p.is_file()}
    fresh = JsonlMemoryStore(root)
    for call in _every_call(fresh, record).values():
        with pytest.raises(UnsafeLinkError):
            call()
    with pytest.raises(UnsafeLinkError):
        fresh.users()  # a listing must not skip a user silently (migrate would lose them)
    if linked == "users":
        with pytest.raises(UnsafeLinkError):
            fresh.add("bob", PersonaMemory(topic="t", preference="p"))
    assert {p: p.read_bytes() for p in outside.rglob("*") if p.is_file()} == before


def test_a_store_whose_folder_is_a_link_works_as_usual(tmp_path: Path) -> None:
    real = tmp_path / "disks" / "memory"
    real.mkdir(parents=True)
    link = tmp_path / "memory"
    link.symlink_to(real)
    store, record, _ = _seeded(link)
    assert [r.id for r in store.list("ada", "persona")] == [record.id]
    snapshot = store.snapshot("ada")
    store.delete("ada", "persona", record.id)
    assert [c.operation for c in store.history("ada", "persona", record.id)] == ["update", "delete"]
    store.restore(snapshot, replace=True)
    assert store.compact("ada") == 0
    assert JsonlMemoryStore(link).users() == ["ada"]
    assert JsonlMemoryStore(real).snapshot_fingerprint("ada") == snapshot.fingerprint
    assert main(["verify", str(link)]) == 0


def test_links_that_stay_inside_the_store_are_followed(tmp_path: Path) -> None:
    root = tmp_path / "store"
    _, record, folder = _seeded(root)
    archive = root / "archive" / folder.name
    archive.parent.mkdir()
    folder.replace(archive)
    folder.symlink_to(Path("..") / "archive" / folder.name)  # relative, and inside
    store = JsonlMemoryStore(root)
    assert store.get("ada", "persona", record.id).content.preference == "warm"
    store.update("ada", "persona", record.id, PersonaMemory(topic="tone", preference="formal"))
    assert len(JsonlMemoryStore(root).history("ada", "persona")) == 2


def test_verify_names_a_link_that_leads_outside(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "store"
    _, _, folder = _seeded(root)
    outside = _link_out(folder / "persona.history.jsonl", tmp_path / "elsewhere" / "h.jsonl")
    assert main(["verify", str(root)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {folder / 'persona.history.jsonl'} leads to {outside}")
    assert "Traceback" not in err


def test_a_store_marker_linked_outside_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "store"
    _seeded(root)
    outside = _link_out(root / "store.json", tmp_path / "elsewhere" / "store.json")
    with pytest.raises(UnsafeLinkError) as info:
        JsonlMemoryStore(root)
    assert info.value.target == outside


def test_a_history_linked_inside_to_a_file_not_made_yet_is_created_there(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = JsonlMemoryStore(root)
    record = store.add("ada", PersonaMemory(topic="tone", preference="terse"))
    history = root / "users" / user_key("ada") / "persona.history.jsonl"
    target = root / "histories" / "ada.jsonl"
    target.parent.mkdir()
    history.symlink_to(target)
    store.update("ada", "persona", record.id, PersonaMemory(topic="tone", preference="warm"))
    assert len(target.read_bytes().splitlines()) == 1
    assert [c.before for c in JsonlMemoryStore(root).history("ada", "persona")] == [record]
