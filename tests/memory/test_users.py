"""User ids: every distinct id gets its own bank folder, always inside the store root."""

import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autopersona_flows import InvalidUserIdError, JsonlMemoryStore, PersonaMemory
from autopersona_flows.memory import MemoryRecord
from autopersona_flows.memory.users import check_user_id, is_user_key, user_key

# Valid Unicode text: every code point except the lone surrogates.
user_ids = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=40)


@given(st.sets(user_ids, min_size=2, max_size=30))
def test_distinct_ids_get_distinct_safe_names(ids: set[str]) -> None:
    keys = {user_key(user_id) for user_id in ids}
    assert len(keys) == len(ids)
    assert all(map(is_user_key, keys))  # what listings take for a user folder
    for key in keys:
        assert key == key.lower()
        assert all(c.isascii() and (c.isalnum() or c == "-") for c in key)
        assert not key.startswith(".")


@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ids=st.lists(user_ids, min_size=1, max_size=6, unique=True))
def test_every_user_stays_inside_the_root_and_alone(tmp_path: Path, ids: list[str]) -> None:
    root = tmp_path / f"store-{abs(hash(tuple(ids)))}"
    store = JsonlMemoryStore(root)
    for user_id in ids:
        store.add(user_id, PersonaMemory(topic="owner", preference=f"id:{user_id}"))
    for path in root.rglob("*"):
        assert path.resolve().is_relative_to(root.resolve())
    assert sorted(store.users()) == sorted(ids)
    for user_id in ids:
        (memory,) = store.list(user_id, "persona")
        assert memory.content.preference == f"id:{user_id}"


@pytest.mark.parametrize(
    "user_id",
    ["..", "../evil", "/etc/passwd", "a/b", "a\\b", "a\x00b", ".", "~", "a b", "a_b", "A b"],
)
def test_traversal_attempts_are_contained(tmp_path: Path, user_id: str) -> None:
    root = tmp_path / "store"
    store = JsonlMemoryStore(root)
    store.add(user_id, PersonaMemory(topic="t", preference="p"))
    (folder,) = (root / "users").iterdir()
    assert folder.parent == root / "users"
    assert store.users() == [user_id]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store"]


def test_lookalike_ids_never_share_a_bank(tmp_path: Path) -> None:
    store = JsonlMemoryStore(tmp_path)
    lookalikes = ["a b", "a/b", "a_b", "A_b", "a-b", "ä_b", "a_b "]
    for user_id in lookalikes:
        store.add(user_id, PersonaMemory(topic="owner", preference=user_id))
    for user_id in lookalikes:
        assert [m.content.preference for m in store.list(user_id, "persona")] == [user_id]
    assert len(list((tmp_path / "users").iterdir())) == len(lookalikes)


def test_folder_names_stay_readable() -> None:
    assert user_key("Ada Lovelace").startswith("ada-lovelace-")


@pytest.mark.parametrize(
    ("user_id", "message"),
    [
        ("", "must not be empty"),
        (None, "must be a str"),
        (7, "must be a str"),
        ("x\ud800", "lone surrogate"),
        ("x" * 1025, "at most 1024"),
    ],
)
def test_invalid_ids_are_rejected(user_id: object, message: str, tmp_path: Path) -> None:
    with pytest.raises(InvalidUserIdError, match=message):
        check_user_id(user_id)
    with pytest.raises(InvalidUserIdError, match=message):
        JsonlMemoryStore(tmp_path).list(user_id, "persona")  # type: ignore[arg-type]
    assert not any(tmp_path.iterdir())


def test_the_longest_id_the_readme_promises_works(tmp_path: Path) -> None:
    readme = (Path(__file__).parents[2] / "README.md").read_text(encoding="utf-8")
    promised = re.search(r"user id of valid Unicode up to ([\d,]+) characters", readme)
    assert promised, "the README no longer states the user id limit"
    longest = int(promised.group(1).replace(",", ""))
    store = JsonlMemoryStore(tmp_path)
    store.add("é" * longest, MemoryRecord.of(PersonaMemory(topic="tone", preference="terse")))
    assert len(store.list("é" * longest, "persona")) == 1
    with pytest.raises(InvalidUserIdError, match=f"at most {longest}"):
        check_user_id("é" * (longest + 1))
