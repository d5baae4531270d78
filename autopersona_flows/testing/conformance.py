"""`MemoryStoreConformance`: each guarantee of `MemoryStore` as one small test."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import cast

import pytest

from autopersona_flows.errors import (
    DuplicateMemoryError,
    InvalidUserIdError,
    MemoryNotFoundError,
    SnapshotError,
)
from autopersona_flows.memory.jsonl import JsonlMemoryStore
from autopersona_flows.memory.protocol import MemoryStore
from autopersona_flows.memory.records import (
    LAYERS,
    LayerContent,
    MemoryLayer,
    MemoryRecord,
    TrajectoryMemory,
)
from autopersona_flows.memory.snapshots import MemorySnapshot
from autopersona_flows.testing._support import (
    OTHER,
    TIMEOUT,
    USER,
    Job,
    embedding_of,
    persona,
    persona_of,
    run_threads,
    sample,
    seed,
)
from autopersona_flows.testing.comparisons import assert_same_memories

__all__ = ["MemoryStoreConformance"]


class MemoryStoreConformance:
    """The guarantees of `MemoryStore`, as tests any implementation can run.

    Subclass in a test module and provide the `store` fixture (a fresh, empty store) and
    `reopen` fixture (a callable returning a second store object over the same data, as
    another process or worker would open it).
    """

    @pytest.fixture
    def store(self) -> MemoryStore:
        """A fresh, empty store: override this fixture in the subclass."""
        pytest.fail(f"{type(self).__name__} must override the `store` fixture")

    @pytest.fixture
    def reopen(self) -> Callable[[], MemoryStore]:
        """A callable opening a second store object over `store`'s data: override it."""
        pytest.fail(f"{type(self).__name__} must override the `reopen` fixture")

    # -- round trips -----------------------------------------------------------------------

    def test_is_a_memory_store(self, store: MemoryStore) -> None:
        """The store structurally satisfies the `MemoryStore` protocol."""
        assert isinstance(store, MemoryStore)

    @pytest.mark.parametrize("layer", LAYERS)
    def test_add_content_wraps_it_in_a_new_record(
        self, store: MemoryStore, layer: MemoryLayer
    ) -> None:
        """Content is stored in a new record of its layer, exactly as given."""
        added = store.add(USER, sample(layer))
        assert (added.layer, added.content) == (layer, sample(layer))
        assert store.get(USER, layer, added.id) == added
        assert store.list(USER, layer) == [added]

    def test_add_record_stores_it_exactly(self, store: MemoryStore) -> None:
        """An explicit record keeps its id, timestamps and embedding bytes."""
        created = datetime(2001, 2, 3, 4, 5, 6, 789012, tzinfo=UTC)
        record = MemoryRecord.of(
            persona(),
            created_at=created,
            updated_at=created + timedelta(days=1),
            embedding=embedding_of(1e-7, -3.4e38, 0.0),
        )
        assert store.add(USER, record) == record
        assert store.get(USER, "persona", record.id) == record

    def test_list_is_oldest_first(self, store: MemoryStore) -> None:
        """`list` returns records oldest first, and an update keeps a record's place."""
        base = datetime.now(UTC) - timedelta(hours=1)
        records = [
            MemoryRecord.of(persona(str(i)), created_at=base + timedelta(seconds=i))
            for i in range(3)
        ]
        for record in records:
            store.add(USER, record)
        assert store.list(USER, "persona") == records
        records[0] = store.update(USER, "persona", records[0].id, persona("0", "new"))
        assert store.list(USER, "persona") == records

    def test_add_many_returns_and_stores_in_the_order_given(self, store: MemoryStore) -> None:
        """`add_many` accepts records and contents and returns them in the order given."""
        explicit = MemoryRecord.of(persona("b"))  # older than the records made for "a" and "c"
        added = store.add_many(USER, "persona", [persona("a"), explicit, persona("c")])
        assert [persona_of(r).topic for r in added] == ["a", "b", "c"]
        assert added[1] == explicit
        assert sorted(store.list(USER, "persona"), key=lambda r: r.id) == [explicit, *added[::2]]
        assert store.add_many(USER, "persona", []) == []

    def test_update_keeps_identity_and_replaces_content_and_embedding(
        self, store: MemoryStore
    ) -> None:
        """An update keeps id and created_at; content and embedding are replaced (or dropped)."""
        first = store.add(USER, MemoryRecord.of(persona(), embedding=embedding_of(1.0)))
        new = embedding_of(2.0, 3.0)
        updated = store.update(USER, "persona", first.id, persona("t", "1"), embedding=new)
        assert (updated.id, updated.created_at) == (first.id, first.created_at)
        assert updated.updated_at >= first.updated_at
        assert (updated.content, updated.embedding) == (persona("t", "1"), new)
        assert store.get(USER, "persona", first.id) == updated
        dropped = store.update(USER, "persona", first.id, persona("t", "2"))
        assert store.get(USER, "persona", first.id).embedding is dropped.embedding is None

    def test_event_time_and_reasons_are_kept(
        self, store: MemoryStore, reopen: Callable[[], MemoryStore]
    ) -> None:
        """When a memory was stated, until when it holds, and why it changed, survive."""
        said = datetime(2024, 3, 1, 9, 30, tzinfo=UTC)
        record = store.add(
            USER, MemoryRecord.of(persona(), stated_at=said, valid_until=said + timedelta(days=7))
        )
        assert record.at == said
        later = said + timedelta(days=30)
        updated = store.update(
            USER, "persona", record.id, persona("t", "2"), at=later, reason="changed her mind"
        )
        assert (updated.stated_at, updated.valid_until, updated.at) == (later, None, later)
        store.delete(USER, "persona", record.id, reason="no longer holds")
        again = reopen()
        changes = again.history(USER, "persona", record.id)
        assert [(c.before, c.reason) for c in changes] == [
            (record, "changed her mind"),
            (updated, "no longer holds"),
        ]
        other = again.add(USER, persona("o"))
        again.delete(USER, "persona", other.id)
        everything = again.history(USER, "persona")
        assert [c.before.id for c in everything] == [record.id, record.id, other.id]
        unsaid = again.add(USER, persona("u"))
        assert (unsaid.stated_at, unsaid.valid_until, unsaid.at) == (None, None, unsaid.updated_at)

    def test_delete_returns_the_removed_record(self, store: MemoryStore) -> None:
        """`delete` returns the record it removed; the others stay."""
        keep, gone = store.add(USER, persona("keep")), store.add(USER, persona("gone"))
        assert store.delete(USER, "persona", gone.id) == gone
        assert store.list(USER, "persona") == [keep]
        with pytest.raises(MemoryNotFoundError):
            store.get(USER, "persona", gone.id)

    def test_history_keeps_superseded_and_deleted_versions(self, store: MemoryStore) -> None:
        """`history` lists every superseded and deleted version, oldest first."""
        v1 = store.add(USER, persona("t", "1"))
        untouched = store.add(USER, persona("other"))
        v2 = store.update(USER, "persona", v1.id, persona("t", "2"))
        v3 = store.update(USER, "persona", v1.id, persona("t", "3"))
        assert store.delete(USER, "persona", v1.id) == v3
        changes = store.history(USER, "persona", v1.id)
        assert [(c.operation, c.before, c.after) for c in changes] == [
            ("update", v1, v2),
            ("update", v2, v3),
            ("delete", v3, None),
        ]
        assert [c.at for c in changes] == sorted(c.at for c in changes)
        assert store.history(USER, "persona", untouched.id) == []

    def test_history_is_the_changes_the_bank_went_through(
        self, store: MemoryStore, reopen: Callable[[], MemoryStore]
    ) -> None:
        """Each update and delete is in the history once, in order; a refused one is not.

        Each entry's ``after`` is the version the bank then held: the history never
        lists a change the bank did not have.
        """
        a, b = store.add(USER, persona("a", "0")), store.add(USER, persona("b", "0"))
        missing = MemoryRecord.of(persona()).id
        refused: list[Callable[[], object]] = [
            lambda: store.update(USER, "persona", missing, persona()),
            lambda: store.delete(USER, "persona", missing),
            lambda: store.update(USER, "persona", a.id, TrajectoryMemory(query="q")),
        ]
        for call in refused:
            with pytest.raises((KeyError, TypeError, ValueError)):
                call()
        assert store.history(USER, "persona") == []
        a1 = store.update(USER, "persona", a.id, persona("a", "1"))
        b1 = store.update(USER, "persona", b.id, persona("b", "1"))
        a2 = store.update(USER, "persona", a.id, persona("a", "2"))
        store.delete(USER, "persona", b.id)
        for call in refused:
            with pytest.raises((KeyError, TypeError, ValueError)):
                call()
        again = reopen()
        assert [(c.operation, c.before, c.after) for c in again.history(USER, "persona")] == [
            ("update", a, a1),
            ("update", b, b1),
            ("update", a1, a2),
            ("delete", b1, None),
        ]
        assert again.list(USER, "persona") == [a2]

    def test_buried_is_kept_through_updates_until_unburied(
        self, store: MemoryStore, reopen: Callable[[], MemoryStore]
    ) -> None:
        """``buried=True`` sets `MemoryRecord.buried_at`; later updates keep it; False clears it.

        Each burial and unburial is an update in the history, and the change feed
        carries it, so an index built on `changes` learns of it.
        """
        record = store.add(USER, MemoryRecord.of(persona("t", "1"), embedding=embedding_of(1.0)))
        cursor = store.changes(USER, "persona").cursor
        buried = store.update(
            USER,
            "persona",
            record.id,
            record.content,
            embedding=record.embedding,
            at=record.at,
            reason="wrong",
            buried=True,
        )
        assert buried.buried_at is not None
        assert (buried.content, buried.embedding, buried.at) == (
            record.content,
            record.embedding,
            record.at,
        )
        assert store.changes(USER, "persona", cursor).records == [buried]
        edited = store.update(USER, "persona", record.id, persona("t", "2"))
        assert edited.buried_at == buried.buried_at
        again = reopen()
        assert again.get(USER, "persona", record.id) == edited
        unburied = again.update(USER, "persona", record.id, edited.content, buried=False)
        assert unburied.buried_at is None
        assert [
            (c.before.buried_at is None, c.after and c.after.buried_at is None)
            for c in again.history(USER, "persona", record.id)
        ] == [
            (True, False),
            (False, False),
            (False, True),
        ]
        assert next(c.reason for c in again.history(USER, "persona", record.id)) == "wrong"

    # -- validation and errors -------------------------------------------------------------

    @pytest.mark.parametrize("user_id", ["", "\ud800"], ids=["empty", "lone-surrogate"])
    def test_invalid_user_ids_are_refused(self, store: MemoryStore, user_id: str) -> None:
        """Every method refuses a user id that is empty or not valid Unicode."""
        record = MemoryRecord.of(persona())
        # Copied unvalidated: a lone surrogate has no JSON form to fingerprint.
        snapshot = MemorySnapshot.of(USER, {}).model_copy(update={"user_id": user_id})
        calls: list[Callable[[], object]] = [
            lambda: store.add(user_id, record),
            lambda: store.add_many(user_id, "persona", [persona()]),
            lambda: store.get(user_id, "persona", record.id),
            lambda: store.list(user_id, "persona"),
            lambda: store.update(user_id, "persona", record.id, persona()),
            lambda: store.delete(user_id, "persona", record.id),
            lambda: store.history(user_id, "persona", record.id),
            lambda: store.changes(user_id, "persona"),
            lambda: store.locked(user_id, "persona").__enter__(),
            lambda: store.snapshot(user_id),
            lambda: store.snapshot_fingerprint(user_id),
            lambda: store.restore(snapshot),
        ]
        for call in calls:
            with pytest.raises(InvalidUserIdError):
                call()
        assert store.users() == []

    def test_unknown_layer_is_refused(self, store: MemoryStore) -> None:
        """A layer that is not one of `LAYERS` is a ValueError."""
        episodic = cast("MemoryLayer", "episodic")  # not a layer: what a caller may still pass
        for call in (
            lambda: store.list(USER, episodic),
            lambda: store.add_many(USER, episodic, [persona()]),
            lambda: store.changes(USER, episodic),
        ):
            with pytest.raises(ValueError, match=r"(?i)episodic"):  # the message names it
                call()

    def test_unknown_ids_are_memory_not_found(self, store: MemoryStore) -> None:
        """An unknown id, or one of another layer, is MemoryNotFoundError (a KeyError)."""
        known, missing = store.add(USER, persona()).id, MemoryRecord.of(persona()).id
        for call in (
            lambda: store.get(USER, "persona", missing),
            lambda: store.update(USER, "persona", missing, persona()),
            lambda: store.delete(USER, "persona", missing),
            lambda: store.get(USER, "trajectory", known),
            lambda: store.delete(USER, "workspace", known),
        ):
            with pytest.raises(MemoryNotFoundError) as info:
                call()
            assert isinstance(info.value, KeyError)
            assert known in str(info.value) or missing in str(info.value)

    def test_duplicate_ids_are_refused_and_store_nothing(self, store: MemoryStore) -> None:
        """Adding a stored id, or a batch repeating one, is DuplicateMemoryError; none lands."""
        stored = store.add(USER, persona("stored"))
        twice = MemoryRecord.of(persona("twice"))
        for call in (
            lambda: store.add(USER, MemoryRecord.of(persona("impostor"), id=stored.id)),
            lambda: store.add_many(USER, "persona", [persona("new"), twice, twice]),
            lambda: store.add_many(USER, "persona", [persona("new"), stored]),
        ):
            with pytest.raises(DuplicateMemoryError):
                call()
        assert store.list(USER, "persona") == [stored]

    def test_add_many_with_another_layer_stores_nothing(self, store: MemoryStore) -> None:
        """A batch with content or a record of another layer is a ValueError, stores nothing."""
        other_layer: list[MemoryRecord | LayerContent] = [
            TrajectoryMemory(query="q"),
            MemoryRecord.of(TrajectoryMemory(query="q")),
        ]
        for item in other_layer:
            with pytest.raises(ValueError, match=r"(?i)trajectory"):  # names the stray layer
                store.add_many(USER, "persona", [persona(), item])
        assert (store.list(USER, "persona"), store.list(USER, "trajectory")) == ([], [])

    def test_update_with_content_of_another_layer_is_refused(self, store: MemoryStore) -> None:
        """Content of another layer never replaces a record's content."""
        record = store.add(USER, persona())
        with pytest.raises((TypeError, ValueError)):
            store.update(USER, "persona", record.id, TrajectoryMemory(query="q"))
        assert store.get(USER, "persona", record.id) == record

    # -- user isolation --------------------------------------------------------------------

    def test_users_never_touch_each_others_records(self, store: MemoryStore) -> None:
        """No call returns, changes or counts another user's records."""
        ada = store.add(USER, persona("t", "ada's"))
        bob = store.add(OTHER, persona("t", "bob's"))
        cursor = store.changes(USER, "persona").cursor
        for call in (
            lambda: store.get(OTHER, "persona", ada.id),
            lambda: store.update(OTHER, "persona", ada.id, persona("t", "hijacked")),
            lambda: store.delete(OTHER, "persona", ada.id),
        ):
            with pytest.raises(MemoryNotFoundError):
                call()
        assert store.list(OTHER, "persona") == [bob]
        assert store.history(OTHER, "persona", ada.id) == []
        assert store.snapshot(OTHER).memories["persona"] == [bob]
        assert store.snapshot(OTHER).counts == {"trajectory": 0, "workspace": 0, "persona": 1}
        assert store.changes(OTHER, "persona").records == [bob]
        assert ada not in store.changes(OTHER, "persona", cursor).records
        assert store.list(USER, "persona") == [ada]

    def test_the_same_id_may_exist_for_two_users(self, store: MemoryStore) -> None:
        """Ids are unique per user and layer, not store-wide."""
        record = store.add(USER, persona())
        assert store.add(OTHER, record) == record
        store.delete(OTHER, "persona", record.id)
        assert store.get(USER, "persona", record.id) == record

    def test_user_ids_are_used_exactly(self, store: MemoryStore) -> None:
        """Case, spaces and accents make different users; `users` lists each once, sorted."""
        names = ["ada", "Ada", " ada", "ada ", "adá", "a/../da", "👩🏽‍💻"]
        for name in names:
            store.add(name, persona("owner", name))
        store.add(USER, TrajectoryMemory(query="a second layer"))  # still listed once
        for name in names:
            assert [persona_of(r).preference for r in store.list(name, "persona")] == [name]
        assert store.users() == sorted(names)

    # -- change feed -----------------------------------------------------------------------

    def test_changes_since_a_cursor_hold_only_what_changed(self, store: MemoryStore) -> None:
        """After writes, a cursor yields only the current versions and deleted ids."""
        a, b, _ = store.add_many(USER, "persona", [persona("a"), persona("b"), persona("c")])
        cursor = store.changes(USER, "persona").cursor
        added = store.add(USER, persona("d"))
        a = store.update(USER, "persona", a.id, persona("a", "new"))
        store.delete(USER, "persona", b.id)
        changed = store.changes(USER, "persona", cursor)
        assert changed.full is False
        assert sorted(changed.records, key=lambda r: r.id) == sorted([a, added], key=lambda r: r.id)
        assert changed.deleted == [b.id]
        quiet = store.changes(USER, "persona", changed.cursor)
        assert (quiet.full, quiet.records, quiet.deleted) == (False, [], [])

    def test_a_cursor_sees_writes_of_another_store_object(
        self, store: MemoryStore, reopen: Callable[[], MemoryStore]
    ) -> None:
        """Another process's feed shows this one's writes on its next call."""
        gone = store.add(USER, persona("gone"))
        other = reopen()
        theirs, ours = other.changes(USER, "persona").cursor, store.changes(USER, "persona").cursor
        added = store.add(USER, persona("added"))
        store.delete(USER, "persona", gone.id)
        # Each object's cursor in the other: honoured, or started over; never a lost change.
        for view, cursor in ((other, theirs), (store, theirs), (other, ours)):
            seen = view.changes(USER, "persona", cursor)
            assert seen.records == [added]
            assert seen.full or seen.deleted == [gone.id]

    # Only cursors no backend could have issued: "0" or "1:2" may be valid somewhere.
    @pytest.mark.parametrize("cursor", [None, "", "not a cursor", "\ud800"])
    def test_no_or_unknown_cursor_gives_the_full_bank(
        self, store: MemoryStore, cursor: str | None
    ) -> None:
        """No cursor, or a garbage one, gives the whole bank: never an error or a gap."""
        assert store.changes(USER, "persona", cursor).full
        records = store.add_many(USER, "persona", [persona("a"), persona("b")])
        changed = store.changes(USER, "persona", cursor)
        assert (changed.full, changed.deleted) == (True, [])
        assert sorted(changed.records, key=lambda r: r.id) == records

    def test_a_replaced_bank_starts_the_feed_over(self, store: MemoryStore) -> None:
        """After `restore(replace=True)`, an earlier cursor gives the full bank."""
        store.add(USER, persona("old"))
        cursor = store.changes(USER, "persona").cursor
        new = MemoryRecord.of(persona("new"))
        store.restore(MemorySnapshot.of(USER, {"persona": [new]}), replace=True)
        changed = store.changes(USER, "persona", cursor)
        assert (changed.full, changed.records) == (True, [new])

    def test_an_id_deleted_twice_since_a_cursor_is_listed_once(self, store: MemoryStore) -> None:
        """``deleted`` names each id once, however often it came and went."""
        store.add(USER, persona("already there"))
        cursor = store.changes(USER, "persona").cursor
        record = MemoryRecord.of(persona())
        for _ in range(2):
            store.add(USER, record)
            store.delete(USER, "persona", record.id)
        changed = store.changes(USER, "persona", cursor)
        assert (changed.full, changed.records, changed.deleted) == (False, [], [record.id])

    # -- snapshots, fingerprints, restore --------------------------------------------------

    def test_restoring_an_empty_snapshot_creates_no_user(self, store: MemoryStore) -> None:
        """An empty restore writes nothing a later `users` call would list."""
        store.restore(MemorySnapshot.of(OTHER, {}))
        assert OTHER not in store.users()

    def test_snapshot_matches_the_banks(self, store: MemoryStore) -> None:
        """A snapshot holds every layer in id order and validates as a snapshot."""
        seed(store)
        snapshot = store.snapshot(USER)
        assert snapshot.user_id == USER
        for layer in LAYERS:
            assert snapshot.memories[layer] == sorted(store.list(USER, layer), key=lambda r: r.id)
        assert MemorySnapshot.model_validate_json(snapshot.model_dump_json()) == snapshot

    def test_fingerprint_is_stable_for_equal_data(
        self, store: MemoryStore, reopen: Callable[[], MemoryStore]
    ) -> None:
        """Equal data gives equal fingerprints; any change gives another."""
        assert store.snapshot_fingerprint(USER) == MemorySnapshot.of(USER, {}).fingerprint
        seed(store)
        before = store.snapshot_fingerprint(USER)
        assert before == store.snapshot(USER).fingerprint == reopen().snapshot_fingerprint(USER)
        seed(store, OTHER)
        assert store.snapshot_fingerprint(USER) == before
        (record, *_) = store.list(USER, "trajectory")
        store.update(USER, "trajectory", record.id, TrajectoryMemory(query="changed"))
        assert store.snapshot_fingerprint(USER) != before

    def test_restore_into_an_empty_store_gives_it_back(
        self, store: MemoryStore, reopen: Callable[[], MemoryStore]
    ) -> None:
        """A restored snapshot comes back exactly, with an equal fingerprint."""
        records = {layer: [MemoryRecord.of(sample(layer))] for layer in LAYERS}
        snapshot = MemorySnapshot.of(USER, records)
        store.restore(snapshot)
        assert store.snapshot(USER) == snapshot
        assert reopen().snapshot_fingerprint(USER) == snapshot.fingerprint

    def test_restore_over_existing_memories_needs_replace(self, store: MemoryStore) -> None:
        """Without ``replace`` a restore over memories is a SnapshotError and changes nothing."""
        seed(store)
        before = store.snapshot(USER)
        snapshot = MemorySnapshot.of(USER, {"persona": [MemoryRecord.of(persona("new"))]})
        with pytest.raises(SnapshotError):
            store.restore(snapshot)
        assert store.snapshot(USER) == before
        store.restore(snapshot, replace=True)
        assert store.snapshot(USER) == snapshot
        assert store.list(USER, "trajectory") == []

    def test_agrees_with_the_reference_store(
        self, store: MemoryStore, tmp_path_factory: pytest.TempPathFactory
    ) -> None:
        """Snapshots move both ways between this store and `JsonlMemoryStore` unchanged."""
        reference = JsonlMemoryStore(tmp_path_factory.mktemp("reference-jsonl"))
        seed(reference)
        store.restore(reference.snapshot(USER))
        assert_same_memories(reference, store, USER)
        seed(store, OTHER)
        reference.restore(store.snapshot(OTHER))
        assert_same_memories(store, reference, OTHER)

    # -- erasure ---------------------------------------------------------------------------

    def test_erase_removes_the_user_and_only_the_user(
        self, store: MemoryStore, reopen: Callable[[], MemoryStore]
    ) -> None:
        """Every layer and its history go, counted; another user's memories stay as they were."""
        seed(store)
        seed(store, OTHER)
        other_before = store.snapshot(OTHER)
        other_history = store.history(OTHER, "persona")
        erased = store.erase(USER)
        assert (erased.user_id, erased.found, erased.memories, erased.changes) == (USER, True, 4, 2)
        for view in (store, reopen()):
            assert view.users() == [OTHER]
            assert view.snapshot(USER).is_empty
            for layer in LAYERS:
                assert view.list(USER, layer) == []
                assert view.history(USER, layer) == []
            assert view.snapshot(OTHER) == other_before
            assert view.history(OTHER, "persona") == other_history

    def test_erasing_a_user_never_stored_finds_nothing(self, store: MemoryStore) -> None:
        """Not an error (a retried erase just finishes): ``found`` is false, nothing changes."""
        seed(store, OTHER)
        before = store.snapshot(OTHER)
        assert store.erase(USER).found is False
        assert (store.users(), store.snapshot(OTHER)) == ([OTHER], before)
        seed(store)
        assert store.erase(USER).found is True
        assert store.erase(USER).found is False  # asked twice: the second finds nothing

    def test_an_erased_user_starts_afresh(self, store: MemoryStore) -> None:
        """After an erase, writes start an empty bank and an old cursor reads it whole."""
        seed(store)
        cursor = store.changes(USER, "persona").cursor
        store.erase(USER)
        assert store.changes(USER, "persona", cursor).full
        record = store.add(USER, persona("new"))
        changed = store.changes(USER, "persona", cursor)
        assert (changed.full, changed.records) == (True, [record])
        assert store.list(USER, "persona") == [record]
        assert store.history(USER, "persona") == []

    def test_erase_waits_for_a_locked_bank(self, store: MemoryStore) -> None:
        """An erase waits for a `locked` block to end, then removes what it wrote too."""
        seed(store)
        entered, release = threading.Event(), threading.Event()
        times: dict[str, float] = {}

        def holder() -> None:
            with store.locked(USER, "persona"):
                entered.set()
                release.wait(TIMEOUT)
                store.add(USER, persona("written while the erase waited"))
                times["released"] = time.monotonic()

        def eraser() -> None:
            assert entered.wait(TIMEOUT)
            store.erase(USER)
            times["erased"] = time.monotonic()

        held, erasing = Job(holder), Job(eraser)
        try:
            assert entered.wait(TIMEOUT)
            time.sleep(0.3)
            assert erasing.is_alive(), "an erase went ahead while a bank was locked"
        finally:
            release.set()
        deadline = time.monotonic() + TIMEOUT
        held.outcome(deadline)
        erasing.outcome(deadline)
        assert times["released"] <= times["erased"]
        assert store.snapshot(USER).is_empty
        assert store.users() == []

    # -- concurrency -----------------------------------------------------------------------

    def test_concurrent_adds_all_land(
        self, store: MemoryStore, reopen: Callable[[], MemoryStore]
    ) -> None:
        """600 adds from 12 threads over two store objects all land, with unique ids."""
        other = reopen()

        def writer(target: MemoryStore, thread: int) -> None:
            for i in range(50):
                target.add(USER, persona(f"{thread}-{i}"))

        jobs = [lambda t=t: writer(store, t) for t in range(8)]
        jobs += [lambda t=t: writer(other, t) for t in range(8, 12)]
        run_threads(*jobs)
        for view in (store, other, reopen()):
            records = view.list(USER, "persona")
            assert len({r.id for r in records}) == len(records) == 600
            assert {persona_of(r).topic for r in records} == {
                f"{t}-{i}" for t in range(12) for i in range(50)
            }

    @pytest.mark.parametrize("writer_object", ["same", "reopened"])
    def test_locked_blocks_other_writers_until_released(
        self, store: MemoryStore, reopen: Callable[[], MemoryStore], writer_object: str
    ) -> None:
        """While one thread holds `locked`, a writer on another thread waits for it."""
        target = store if writer_object == "same" else reopen()
        entered, release = threading.Event(), threading.Event()
        times: dict[str, float] = {}

        def holder() -> None:
            with store.locked(USER, "persona"):
                entered.set()
                release.wait(TIMEOUT)
                times["released"] = time.monotonic()

        def writer() -> None:
            assert entered.wait(TIMEOUT)
            target.add(USER, persona("waited"))
            times["written"] = time.monotonic()

        held, wrote = Job(holder), Job(writer)
        try:
            assert entered.wait(TIMEOUT)
            time.sleep(0.3)
            assert wrote.is_alive(), "a writer went ahead while the bank was locked"
        finally:
            release.set()
        deadline = time.monotonic() + TIMEOUT
        held.outcome(deadline)
        wrote.outcome(deadline)
        assert times["released"] <= times["written"]

    def test_locked_is_reentrant_for_its_own_thread(self, store: MemoryStore) -> None:
        """Calls inside `locked` on the same thread reuse the lock instead of deadlocking."""

        def read_decide_write() -> MemoryRecord:
            with store.locked(USER, "persona"):
                record = store.add(USER, persona())
                assert store.list(USER, "persona") == [record]
                return store.update(USER, "persona", record.id, persona("tone", "warm"))

        (updated,) = run_threads(read_decide_write)
        assert store.list(USER, "persona") == [updated]

    def test_add_many_is_all_or_nothing_for_readers(
        self, store: MemoryStore, reopen: Callable[[], MemoryStore]
    ) -> None:
        """A reader polling `list` never sees part of a batch, in this or another object."""
        batch, batches, done = 20, 25, threading.Event()

        def write() -> None:
            try:
                for b in range(batches):
                    store.add_many(USER, "persona", [persona(f"{b}-{i}") for i in range(batch)])
            finally:
                done.set()

        def poll(view: MemoryStore) -> set[int]:
            seen = {len(view.list(USER, "persona"))}
            while not done.is_set():
                seen.add(len(view.list(USER, "persona")))
            return seen

        _, *views_seen = run_threads(write, lambda: poll(store), lambda: poll(reopen()))
        for seen in views_seen:
            assert isinstance(seen, set)
            assert all(count % batch == 0 for count in seen), sorted(seen)
        assert len(store.list(USER, "persona")) == batch * batches

    # -- durability ------------------------------------------------------------------------

    def test_everything_written_is_there_after_reopen(
        self, store: MemoryStore, reopen: Callable[[], MemoryStore]
    ) -> None:
        """A store object opened before or after the writes sees all of them."""
        early = reopen()
        assert early.list(USER, "persona") == []  # warm any per-object view first
        changed = seed(store)
        carol: dict[MemoryLayer, list[MemoryRecord]] = {
            "workspace": [MemoryRecord.of(sample("workspace"))]
        }
        store.restore(MemorySnapshot.of("carol", carol))
        for view in (early, reopen()):
            assert view.users() == store.users() == [USER, "carol"]
            for user in (USER, "carol"):
                assert_same_memories(store, view, user)
            for memory_id in changed:
                assert view.history(USER, "persona", memory_id) == store.history(
                    USER, "persona", memory_id
                )
