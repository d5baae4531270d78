"""Event time: when a memory was said, how long it holds, and what that changes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import pytest
from pydantic import ValidationError

from autopersona_flows.errors import RetrievalError
from autopersona_flows.memory import (
    JsonlMemoryStore,
    MemoryRecord,
    MemoryRetriever,
    MemoryUpdater,
    PersonaMemory,
    RawTaskRecord,
    SearchRequest,
    WorkspaceMemory,
    ingest_task_history,
)
from autopersona_flows.memory.maintenance import expire_workspace, maintain_user, retire_expired

DAY = timedelta(days=1)
T0 = datetime(2025, 1, 6, 9, 0, tzinfo=UTC)


@pytest.fixture
def store(tmp_path: Path) -> JsonlMemoryStore:
    return JsonlMemoryStore(tmp_path / "store")


def topics(store: JsonlMemoryStore, user: str = "ada") -> dict[str, str]:
    return {r.content.topic: r.content.preference for r in store.list(user, "persona")}


def test_a_record_without_event_time_is_stored_as_before() -> None:
    record = MemoryRecord.of(PersonaMemory(topic="tone", preference="terse"))
    stored = orjson.loads(record.model_dump_json())
    assert "stated_at" not in stored
    assert "valid_until" not in stored
    assert record.at == record.updated_at
    timed = record.model_copy(update={"stated_at": T0})
    assert orjson.loads(timed.model_dump_json())["stated_at"].startswith("2025-01-06T09:00:00")


def test_a_validity_that_ends_before_it_was_stated_is_refused() -> None:
    content = PersonaMemory(topic="tone", preference="terse")
    with pytest.raises(ValidationError, match="valid_until is not later than stated_at"):
        MemoryRecord.of(content, stated_at=T0, valid_until=T0 - DAY)
    with pytest.raises(ValidationError, match="timezone-aware"):
        MemoryRecord.of(content, stated_at=datetime(2025, 1, 6))


def test_a_history_ingested_out_of_order_ends_as_one_ingested_in_order(tmp_path: Path) -> None:
    said = [
        (T0, "window"),
        (T0 + 30 * DAY, "aisle"),
        (T0 + 60 * DAY, "aisle, near the front"),
    ]
    finals = {}
    for order in ("in", "out"):
        store = JsonlMemoryStore(tmp_path / order)
        updater = MemoryUpdater(store)
        events = said if order == "in" else [said[2], said[0], said[1]]
        for at, value in events:
            ingest_task_history(
                store,
                updater,
                RawTaskRecord(
                    user_id="ada",
                    query="book my flight",
                    at=at,
                    persona=[PersonaMemory(topic="flight seat", preference=value)],
                ),
            )
        retriever = MemoryRetriever(store)
        found = retriever.retrieve("ada", [SearchRequest(layer="persona", query="flight seat")])
        finals[order] = [m.record.content.preference for m in found.persona]
        past = retriever.retrieve(
            "ada", [SearchRequest(layer="persona", query="flight seat")], include_past=True
        )
        assert {m.record.content.preference for m in past.persona} <= {v for _, v in said}
        trajectories = store.list("ada", "trajectory")
        assert sorted(r.at for r in trajectories) == [at for at, _ in said]
    assert finals == {"in": ["aisle, near the front"], "out": ["aisle, near the front"]}


def test_an_earlier_statement_arriving_late_is_kept_as_past(store: JsonlMemoryStore) -> None:
    updater = MemoryUpdater(store)
    updater.update("ada", "persona", PersonaMemory(topic="diet", preference="vegan"), at=T0)
    late = updater.update(
        "ada", "persona", PersonaMemory(topic="diet", preference="vegetarian"), at=T0 - 90 * DAY
    )
    assert late.operation == "add"
    assert "kept as past" in late.reason
    assert late.record is not None
    assert late.record.valid_until == T0
    retriever = MemoryRetriever(store)
    search = [SearchRequest(layer="persona", query="diet")]
    assert [m.record.content.preference for m in retriever.retrieve("ada", search).persona] == [
        "vegan"
    ]
    then = retriever.retrieve("ada", search, as_of=T0 - 30 * DAY)
    assert [m.record.content.preference for m in then.persona] == ["vegetarian"]
    assert retriever.retrieve("ada", search, as_of=T0 - 100 * DAY).persona == []


def test_reworded_topics_update_one_slot_and_other_attributes_stay_apart(
    store: JsonlMemoryStore,
) -> None:
    updater = MemoryUpdater(store)
    said = [
        ("seat preference", "window"),
        ("hotel budget", "150 a night"),
        ("hotel location", "near the station"),
        ("seat", "aisle"),
        ("budget for hotels", "120 a night"),
        ("flight budget", "400"),
        ("dog's name", "Rex"),
        ("name", "Ada"),
        ("daily budget", "100 euros"),
        ("personal email", "ada@example.org"),
        ("work email", "ada@work.example"),
    ]
    for i, (topic, value) in enumerate(said):
        updater.update(
            "ada", "persona", PersonaMemory(topic=topic, preference=value), at=T0 + i * DAY
        )
    assert topics(store) == {
        "seat": "aisle",
        "budget for hotels": "120 a night",
        "hotel location": "near the station",
        "flight budget": "400",
        "dog's name": "Rex",
        "name": "Ada",
        "daily budget": "100 euros",
        "personal email": "ada@example.org",
        "work email": "ada@work.example",
    }
    (seat,) = [r for r in store.list("ada", "persona") if r.content.topic == "seat"]
    (change,) = store.history("ada", "persona", seat.id)
    assert change.before.content.preference == "window"
    assert "newer value" in change.reason


def test_a_slot_may_hold_several_values_when_the_person_adds_one(store: JsonlMemoryStore) -> None:
    updater = MemoryUpdater(store)
    updater.update("ada", "persona", PersonaMemory(topic="allergies", preference="peanuts"))
    added = updater.update(
        "ada", "persona", PersonaMemory(topic="food allergies", preference="shellfish as well")
    )
    assert added.operation == "add"
    assert sorted(topics(store).values()) == ["peanuts", "shellfish as well"]


def test_a_reversal_under_another_topic_supersedes_with_its_reason(
    store: JsonlMemoryStore,
) -> None:
    updater = MemoryUpdater(store)
    updater.update("ada", "persona", PersonaMemory(topic="coffee order", preference="flat white"))
    updater.update("ada", "persona", PersonaMemory(topic="breakfast", preference="porridge"))
    ended = updater.update(
        "ada", "persona", PersonaMemory(topic="health", preference="I quit coffee in May")
    )
    assert ended.operation == "update"
    assert ended.reason.startswith("no longer holds")
    assert topics(store) == {"health": "I quit coffee in May", "breakfast": "porridge"}
    (change,) = store.history("ada", "persona", ended.target_id)
    assert change.before.content.topic == "coffee order"
    assert change.reason.startswith("no longer holds")
    # Words shared with the topic's attribute alone end nothing.
    updater.update(
        "ada", "persona", PersonaMemory(topic="takeaway", preference="no longer order in")
    )
    assert set(topics(store)) == {"health", "breakfast", "takeaway"}


def test_expired_memories_leave_current_results_and_exact_lookups(
    store: JsonlMemoryStore,
) -> None:
    now = datetime.now(UTC)
    updater = MemoryUpdater(store)
    gone = updater.add(
        "ada",
        PersonaMemory(topic="parking", preference="use the staff car park", contexts=["park"]),
        at=now - 10 * DAY,
        valid_until=now - DAY,
    )
    kept = updater.add(
        "ada",
        PersonaMemory(topic="parking", preference="street parking", contexts=["park"]),
        at=now - 20 * DAY,
        valid_until=now + DAY,
    )
    retriever = MemoryRetriever(store)
    search = [SearchRequest(layer="persona", query="parking car park")]
    assert [m.record for m in retriever.retrieve("ada", search).persona] == [kept]
    assert retriever.containing("ada", "persona", ["parking"]) == [kept]
    assert retriever.learned_at("ada", ["park"]) == [kept]
    assert {m.record.id for m in retriever.retrieve("ada", search, include_past=True).persona} == {
        gone.id,
        kept.id,
    }
    as_of = retriever.retrieve("ada", search, as_of=now - 5 * DAY)
    assert {m.record.id for m in as_of.persona} == {gone.id, kept.id}
    # Said again once expired: stored anew, not a duplicate of the expired one.
    again = updater.update("ada", "persona", gone.content)
    assert again.operation != "noop"


def test_recency_weighs_by_default_and_as_asked(store: JsonlMemoryStore) -> None:
    updater = MemoryUpdater(store)
    now = datetime.now(UTC)
    old = updater.add("ada", PersonaMemory(topic="tea", preference="green tea"), at=now - 400 * DAY)
    new = updater.add("ada", PersonaMemory(topic="tea", preference="black tea"), at=now - DAY)
    retriever = MemoryRetriever(store)
    search = [SearchRequest(layer="persona", query="green tea")]

    def scores(**when: timedelta | None) -> dict[str, float]:
        return {m.record.id: m.score for m in retriever.retrieve("ada", search, **when).persona}

    plain = scores(recency_half_life=None)
    weighed = scores(recency_half_life=30 * DAY)
    assert plain[old.id] > plain[new.id]
    assert weighed[new.id] == pytest.approx(plain[new.id], rel=0.02)
    assert weighed[old.id] == pytest.approx(plain[old.id] / 2, rel=0.01)
    # By default, the retriever's: 90 days, 400 days ago is near the floor of 1/2.
    default = scores()
    assert default[old.id] == pytest.approx(plain[old.id] * (1 + 2 ** (-400 / 90)) / 2, rel=0.01)
    timeless = MemoryRetriever(store, recency_half_life=None)
    assert {m.record.id: m.score for m in timeless.retrieve("ada", search).persona} == plain
    for bad in ({"as_of": datetime(2025, 1, 1)}, {"recency_half_life": timedelta(0)}):
        with pytest.raises(RetrievalError):
            retriever.retrieve("ada", search, **bad)


def test_workspace_expires_by_when_it_was_observed(store: JsonlMemoryStore) -> None:
    updater = MemoryUpdater(store)
    now = datetime.now(UTC)
    backfilled = updater.add("ada", WorkspaceMemory(state="draft v1"), at=now - 40 * DAY)
    ended = updater.add(
        "ada",
        WorkspaceMemory(state="room booked"),
        at=now - DAY,
        valid_until=now - timedelta(minutes=1),
    )
    fresh = updater.add("ada", WorkspaceMemory(state="draft v2"))
    assert expire_workspace(store, "ada", timedelta(days=30)) == sorted([backfilled.id, ended.id])
    assert store.list("ada", "workspace") == [fresh]
    assert store.history("ada", "workspace", ended.id)[0].reason == "expired"


def test_a_decision_as_of_a_time_uses_what_held_then(store: JsonlMemoryStore) -> None:
    from autopersona_flows import PersonaAgent, PersonaRequest, Requirement

    updater = MemoryUpdater(store)
    updater.update("ada", "persona", PersonaMemory(topic="citation style", preference="MLA"), at=T0)
    updater.update(
        "ada", "persona", PersonaMemory(topic="citation style", preference="APA"), at=T0 + 30 * DAY
    )
    updater.update(
        "ada", "persona", PersonaMemory(topic="citation style", preference="Chicago"), at=T0 - DAY
    )
    agent = PersonaAgent(MemoryRetriever(store))
    need = [Requirement(name="citation style", options=["APA", "MLA", "Chicago"])]

    def value(**when: datetime) -> str | None:
        decision = agent.decide(
            PersonaRequest(user_id="ada", query="format my references", requirements=need, **when)
        )
        return decision.constraints[0].value if decision.action == "final" else None

    assert value() == "APA"
    assert value(as_of=T0 - DAY / 2) == "Chicago"  # kept as past until MLA was said
    assert value(as_of=T0 + DAY) == "MLA"  # from the history: APA replaced it later
    assert value(as_of=T0 - 2 * DAY) is None
    with pytest.raises(RetrievalError, match="timezone-aware"):
        MemoryRetriever(store).containing("ada", "persona", ["style"], as_of=datetime(2025, 1, 1))


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (("running shoes", "EU 42, neutral"), ("trainers for running", "43 these days")),
        (("printer", "HP LaserJet M110"), ("home printer", "it's actually a Brother HL-L2350")),
        (("tea", "builder's tea, two sugars"), ("sugar", "cut sugar out completely")),
        (
            ("cat sitter", "Marta comes in twice a day"),
            ("pets", "Marta's moved to Porto so Miso goes to the cattery now"),
        ),
        (("pizza", "pepperoni, thin crust"), ("takeaway pizza", "margherita, I've gone veggie")),
        (
            ("Dad's vinyl", "Dad's into jazz vinyl"),
            ("Dad's records", "Dad's gone off records, he wants whisky now"),
        ),
    ],
    ids=["reworded", "correction", "named-in-value", "same-person", "gone", "someone-else"],
)
def test_a_change_announced_in_other_words_replaces_what_it_changes(
    store: JsonlMemoryStore, old: tuple[str, str], new: tuple[str, str]
) -> None:
    updater = MemoryUpdater(store)
    updater.update("ada", "persona", PersonaMemory(topic="films", preference="thrillers"))
    first = updater.update("ada", "persona", PersonaMemory(topic=old[0], preference=old[1]))
    later = updater.update("ada", "persona", PersonaMemory(topic=new[0], preference=new[1]))
    assert later.operation == "update"
    assert later.target_id == first.record.id
    assert later.reason.startswith(("changed, in other words", "no longer holds", "newer value"))
    assert topics(store) == {"films": "thrillers", new[0]: new[1]}


@pytest.mark.parametrize(
    "new",
    [
        ("hotel location", "near the beach now"),  # another shape of value
        ("hotel budget", "also 40 for parking"),  # adds
        ("flight budget", "400 now"),  # another attribute
        ("seat", "aisle"),  # announces nothing
    ],
)
def test_a_change_of_another_attribute_replaces_nothing(
    store: JsonlMemoryStore, new: tuple[str, str]
) -> None:
    updater = MemoryUpdater(store)
    updater.update("ada", "persona", PersonaMemory(topic="hotel budget", preference="£150 a night"))
    decision = updater.update("ada", "persona", PersonaMemory(topic=new[0], preference=new[1]))
    assert decision.operation == "add"
    assert len(store.list("ada", "persona")) == 2


def test_a_change_arriving_before_what_it_changed_still_wins(store: JsonlMemoryStore) -> None:
    updater = MemoryUpdater(store)
    later = PersonaMemory(topic="trainers for running", preference="43 these days")
    updater.update("ada", "persona", later, at=T0 + 30 * DAY)
    early = updater.update(
        "ada", "persona", PersonaMemory(topic="running shoes", preference="EU 42"), at=T0
    )
    assert "kept as past" in early.reason
    now = datetime.now(UTC)
    assert [r.content for r in store.list("ada", "persona") if r.holds_at(now)] == [later]


def test_a_bounded_statement_sets_the_standing_one_aside_until_it_ends(
    store: JsonlMemoryStore,
) -> None:
    updater = MemoryUpdater(store)
    standing = updater.update(
        "ada", "persona", PersonaMemory(topic="phone number", preference="+1 415 555 0199"), at=T0
    )
    said = T0 + 10 * DAY
    temporary = updater.update(
        "ada",
        "persona",
        PersonaMemory(topic="phone number", preference="temp UK number 07700 900123"),
        at=said,
        valid_until=said + 20 * DAY,
    )
    assert temporary.operation == "add"
    assert "beside memory" in temporary.reason
    retriever = MemoryRetriever(store)
    search = [SearchRequest(layer="persona", query="phone number")]

    def values(when: datetime) -> set[str]:
        found = retriever.retrieve("ada", search, as_of=when).persona
        return {m.record.content.preference for m in found}

    assert values(said + DAY) == {"+1 415 555 0199", "temp UK number 07700 900123"}
    assert values(said + 30 * DAY) == {"+1 415 555 0199"}
    assert store.get("ada", "persona", standing.record.id) == standing.record


def test_records_and_history_written_before_event_time_read_and_write_back_unchanged() -> None:
    from autopersona_flows.memory import MemoryChange

    # Lines as the release before event time wrote them.
    record = (
        '{"id":"01JH5Z0Q3B8M1V6W9X2Y4Z7A0C","layer":"persona","content":{"topic":"tone",'
        '"preference":"terse","strategy":""},"created_at":"2025-01-06T09:00:00Z",'
        '"updated_at":"2025-01-07T10:30:00Z","embedding":null}'
    )
    change = (
        '{"operation":"delete","at":"2025-01-08T00:00:00Z","before":' + record + ',"after":null}'
    )
    assert MemoryRecord.model_validate_json(record).model_dump_json() == record
    assert MemoryChange.model_validate_json(change).model_dump_json() == change
    old = MemoryRecord.model_validate_json(record)
    assert (old.stated_at, old.valid_until) == (None, None)
    assert old.at == old.updated_at


def test_a_history_ingested_twice_adds_nothing_the_second_time(store: JsonlMemoryStore) -> None:
    updater = MemoryUpdater(store)
    tasks = [
        RawTaskRecord(
            user_id="ada",
            query="book a flight to Rome",
            at=T0 + i * DAY,
            persona=[PersonaMemory(topic="seat", preference="aisle")],
        )
        for i in range(2)  # the same request on two days: two tasks
    ]
    first = [ingest_task_history(store, updater, task).counts() for task in tasks]
    assert first == [
        {"trajectory:add": 1, "persona:add": 1},
        {"trajectory:add": 1, "persona:noop": 1},
    ]
    again = [ingest_task_history(store, updater, task).counts() for task in tasks]
    assert again == [{"trajectory:noop": 1, "persona:noop": 1}] * 2
    assert len(store.list("ada", "trajectory")) == 2


def test_a_newer_state_of_a_task_updates_it(store: JsonlMemoryStore) -> None:
    updater = MemoryUpdater(store)
    task = {"site": "opentable", "id": 17}
    first = updater.update("ada", "workspace", WorkspaceMemory(task=task, state={"step": 1}))
    later = updater.update("ada", "workspace", WorkspaceMemory(task=task, state={"step": 2}))
    assert later.operation == "update"
    assert later.target_id == first.record.id
    assert [r.content.state for r in store.list("ada", "workspace")] == [{"step": 2}]
    other = updater.update("ada", "workspace", WorkspaceMemory(task={"id": 18}, state={"step": 2}))
    assert other.operation == "add"


@pytest.mark.parametrize(
    ("preference", "topic", "ends_it"),
    [
        ("I quit coffee in May", "coffee order", True),
        ("I cancelled my gym membership", "gym membership", True),
        ("I cancelled the dentist appointment on Friday", "dentist", False),
        ("I stopped working from home last month", "home address", False),
        ("I no longer take the coffee machine to the office", "coffee order", False),
        ("I'm used to early flights from Gatwick", "flight time", False),
    ],
)
def test_an_end_is_of_what_follows_it(preference: str, topic: str, ends_it: bool) -> None:
    from autopersona_flows.memory.slots import ends

    assert ends(preference, topic) is ends_it


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (("milk", "Switched to oat milk"), ("commute", "Switched to the 7:40 train")),
        (("coffee", "Actually I take it black"), ("running shoes", "Actually size 43")),
        (
            ("hotel location", "near the station"),
            ("hotel location", "old town, the station is too noisy"),
        ),
    ],
)
def test_words_opening_two_sentences_relate_nothing(
    store: JsonlMemoryStore, old: tuple[str, str], new: tuple[str, str]
) -> None:
    updater = MemoryUpdater(store)
    updater.update("ada", "persona", PersonaMemory(topic=old[0], preference=old[1]))
    decision = updater.update("ada", "persona", PersonaMemory(topic=new[0], preference=new[1]))
    kept = {(r.content.topic, r.content.preference) for r in store.list("ada", "persona")}
    if new[0] == old[0]:  # "too noisy" adds nothing: the new value replaces the old
        assert decision.operation == "update"
        assert kept == {new}
    else:
        assert kept == {old, new}


def test_a_memory_restated_without_its_end_no_longer_expires(store: JsonlMemoryStore) -> None:
    updater = MemoryUpdater(store)
    now = datetime.now(UTC)
    diet = PersonaMemory(topic="diet", preference="off dairy")
    first = updater.update("ada", "persona", diet, at=now - DAY, valid_until=now + DAY)
    again = updater.update("ada", "persona", diet)
    assert again.operation == "update"
    assert again.record.valid_until is None
    assert again.record.id == first.record.id
    assert "restated" in store.history("ada", "persona", first.record.id)[0].reason
    assert updater.update("ada", "persona", diet).operation == "noop"


@pytest.mark.parametrize(
    ("when", "problem"),
    [
        ({"at": datetime(2025, 1, 1)}, "at must be a timezone-aware"),
        ({"valid_until": datetime(2025, 1, 1)}, "valid_until must be a timezone-aware"),
        ({"at": T0, "valid_until": T0 - DAY}, "is not after at"),
    ],
)
def test_times_without_a_zone_or_in_the_wrong_order_are_refused_before_any_write(
    store: JsonlMemoryStore, when: dict[str, datetime], problem: str
) -> None:
    updater = MemoryUpdater(store)
    content = PersonaMemory(topic="tone", preference="terse")
    for write in (updater.add, lambda user, c, **kw: updater.update(user, "persona", c, **kw)):
        with pytest.raises(ValueError, match=problem):
            write("ada", content, **when)
    assert store.users() == []


def test_a_later_standing_statement_ends_a_bounded_one_on_its_slot(
    store: JsonlMemoryStore,
) -> None:
    updater = MemoryUpdater(store)
    number = "phone number"
    updater.update("ada", "persona", PersonaMemory(topic=number, preference="555-0100"), at=T0)
    temporary = updater.update(
        "ada",
        "persona",
        PersonaMemory(topic=number, preference="555-0199"),
        at=T0 + DAY,
        valid_until=T0 + 30 * DAY,
    )
    updater.update(
        "ada", "persona", PersonaMemory(topic=number, preference="555-0777"), at=T0 + 5 * DAY
    )
    ended = store.get("ada", "persona", temporary.record.id)
    assert ended.valid_until == T0 + 5 * DAY
    assert ended.at == T0 + DAY
    assert "ended by memory" in store.history("ada", "persona", ended.id)[0].reason
    now = datetime.now(UTC)
    assert [r.content.preference for r in store.list("ada", "persona") if r.holds_at(now)] == [
        "555-0777"
    ]


def test_a_task_keeps_its_zone_so_today_ends_at_the_persons_midnight() -> None:
    from datetime import timezone

    from autopersona_flows.memory import RuleExtractor

    new_york = timezone(timedelta(hours=-5))
    record = RawTaskRecord(
        user_id="ada",
        query="book a desk",
        persona=[PersonaMemory(topic="desk", preference="the quiet room, today only")],
        at=datetime(2025, 1, 8, 20, 0, tzinfo=new_york),
    )
    (found,) = RuleExtractor().extract(record)
    assert found.valid_until == datetime(2025, 1, 9, 0, 0, tzinfo=new_york)


def test_as_of_reads_what_an_update_or_a_delete_replaced_for_the_time_it_held(
    store: JsonlMemoryStore,
) -> None:
    updater = MemoryUpdater(store)
    seat = updater.update("ada", "persona", PersonaMemory(topic="seat", preference="window"), at=T0)
    updater.update(
        "ada", "persona", PersonaMemory(topic="seat", preference="aisle"), at=T0 + 10 * DAY
    )
    tone = updater.add("ada", PersonaMemory(topic="tone", preference="terse"), at=T0)
    store.delete("ada", "persona", tone.id)
    retriever = MemoryRetriever(store)

    def said(query: str, when: datetime) -> list[str]:
        found = retriever.retrieve("ada", [SearchRequest(layer="persona", query=query)], as_of=when)
        return [m.record.content.preference for m in found.persona]

    assert said("seat", T0 + DAY) == ["window"]
    assert said("seat", T0 + 20 * DAY) == ["aisle"]
    assert said("tone", T0 + DAY) == ["terse"]  # deleted long after
    assert said("tone", datetime.now(UTC) + DAY) == []
    assert (
        retriever.containing("ada", "persona", ["window"], as_of=T0 + DAY)[0].id == seat.record.id
    )
    assert said("seat", datetime.now(UTC)) == ["aisle"]  # the live index is untouched


def test_maintenance_retires_what_ended_and_a_look_back_still_finds_it(
    store: JsonlMemoryStore,
) -> None:
    updater = MemoryUpdater(store)
    trip = updater.add(
        "ada",
        PersonaMemory(topic="hotel city", preference="Lisbon"),
        at=T0,
        valid_until=T0 + 7 * DAY,
    )
    standing = updater.add("ada", PersonaMemory(topic="seat", preference="aisle"), at=T0)
    busy = updater.add("ada", WorkspaceMemory(state="on call"), at=T0, valid_until=T0 + 2 * DAY)

    assert retire_expired(store, "ada", now=T0 + DAY) == []
    report = maintain_user(store, "ada", now=T0 + 10 * DAY, choices_min_repeats=None)

    assert report.retired == [busy.id, trip.id]  # layer by layer: workspace, then persona
    assert [r.id for r in store.list("ada", "persona")] == [standing.id]
    assert store.list("ada", "workspace") == []
    (change,) = store.history("ada", "persona", trip.id)
    assert (change.operation, change.reason) == ("delete", "expired")
    then = MemoryRetriever(store).retrieve(
        "ada", [SearchRequest(layer="persona", query="hotel city")], as_of=T0 + 3 * DAY
    )
    assert trip.id in [s.record.id for s in then.persona]
    assert maintain_user(store, "ada", now=T0 + 10 * DAY).retired == []
    with pytest.raises(ValueError, match="timezone-aware"):
        retire_expired(store, "ada", now=datetime(2025, 1, 1))
