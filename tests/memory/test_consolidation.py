"""Consolidation: choices repeated across past tasks become persona memories."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from autopersona_flows import PersonaAgent, PersonaRequest, Requirement
from autopersona_flows.memory import (
    JsonlMemoryStore,
    MemoryRetriever,
    MemoryUpdater,
    TrajectoryMemory,
    maintain_user,
)
from autopersona_flows.memory.consolidation import promote_choices

T0 = datetime(2025, 2, 3, 8, 0, tzinfo=UTC)
BOOKINGS = [
    ("Book a flight to Rome", ["searched flights", "booked 14C, an aisle seat"], ""),
    ("flights to Oslo please", ["picked an aisle seat again"], "she likes the aisle"),
    ("I need a flight to Paris on Friday", ["compared fares", "chose aisle 22D"], ""),
]


@pytest.fixture
def updater(tmp_path: Path) -> MemoryUpdater:
    return MemoryUpdater(JsonlMemoryStore(tmp_path))


def remember(
    updater: MemoryUpdater, tasks: list[tuple[str, list[str], str]], start: int = 0
) -> list[str]:
    return [
        updater.add(
            "ada",
            TrajectoryMemory(query=query, trace=trace, insight=insight),
            at=T0 + timedelta(days=start + i),
        ).id
        for i, (query, trace, insight) in enumerate(tasks)
    ]


def test_three_bookings_with_an_aisle_seat_say_aisle(updater: MemoryUpdater) -> None:
    ids = remember(updater, BOOKINGS)
    remember(updater, [("order groceries", ["ordered oat milk and bread"], "")], start=5)
    (decision,) = promote_choices(updater, "ada")
    assert decision.operation == "add"
    memory = decision.record
    assert memory is not None
    assert (memory.content.topic, memory.content.preference) == ("flight", "aisle")
    assert memory.content.sources == ids
    assert memory.at == T0 + timedelta(days=2)  # when the latest of them happened
    assert "chosen in 3 past flight tasks" in memory.content.strategy
    assert [d.operation for d in promote_choices(updater, "ada")] == ["noop"]
    # The agent now answers "seat" from the persona memory, citing where it came from.
    agent = PersonaAgent(MemoryRetriever(updater.store))
    seat = Requirement(name="seat", options=["aisle", "window"])
    request = PersonaRequest(user_id="ada", query="Book a flight to Lisbon", requirements=[seat])
    decided = agent.decide(request)
    assert decided.action == "final"
    assert decided.constraints[0].value == "aisle"


def test_a_habit_that_moves_updates_its_memory(updater: MemoryUpdater) -> None:
    remember(updater, BOOKINGS)
    (first,) = promote_choices(updater, "ada")
    window = [
        (query, [step.replace("aisle", "window") for step in trace], "")
        for query, trace, _ in BOOKINGS
    ]
    remember(updater, window, start=10)
    decisions = promote_choices(updater, "ada")
    # "seat", chosen with both, is what they are choices of: it joins the topic.
    assert [(d.record.content.topic, d.record.content.preference) for d in decisions] == [
        ("flight seat", "aisle"),
        ("flight seat", "window"),
    ]
    now = datetime.now(UTC)
    current = [r for r in updater.store.list("ada", "persona") if r.holds_at(now)]
    assert [(r.id, r.content.preference) for r in current] == [(first.record.id, "window")]
    history = updater.store.history("ada", "persona", first.record.id)
    assert [c.before.content.preference for c in history] == ["aisle", "aisle"]
    again = promote_choices(updater, "ada")
    assert [d.operation for d in again] == ["noop", "noop"]


def test_choices_in_tasks_of_different_kinds_or_too_few_are_not_promoted(
    updater: MemoryUpdater,
) -> None:
    remember(
        updater,
        [
            *BOOKINGS[:2],
            ("train to Leeds on Friday", ["picked an aisle seat"], ""),
            ("hire a car in Faro", ["booked a compact automatic"], ""),
            ("rent a car for the weekend", [{"booked": True, "car": "automatic"}], ""),
        ],
    )
    assert promote_choices(updater, "ada") == []
    assert [
        d.record.content.preference for d in promote_choices(updater, "ada", min_repeats=2)
    ] == ["aisle seat"]
    with pytest.raises(ValueError, match="min_repeats"):
        promote_choices(updater, "ada", min_repeats=1)


def test_tasks_for_another_thing_of_one_kind_and_how_a_choice_was_said_are_no_habit(
    updater: MemoryUpdater,
) -> None:
    """ "Set a monthly X budget" for ten X is no hotel budget; "the new one, actually" no choice."""
    remember(
        updater,
        [
            (f"Set a monthly {thing} budget", [f"chose {amount}"], "")
            for thing, amount in (("grocery", "£400"), ("hotel", "£400"), ("fuel", "£400"))
        ],
    )
    remember(
        updater,
        [
            (f"order {n} printer ink", ["picked the new one actually"], "")
            for n in ("black", "colour", "photo")
        ],
    )
    assert promote_choices(updater, "ada") == []


def test_the_assistants_own_tools_and_other_kinds_of_booking_are_no_choices(
    updater: MemoryUpdater,
) -> None:
    remember(
        updater,
        [
            ("Book a flight to Rome", ["used the flight_search tool", "booked 3A, a window"], ""),
            ("Book a table for two", ["used the flight_search tool", "booked a window table"], ""),
            ("Book a hotel in Oslo", ["used the flight_search tool", "picked a window room"], ""),
        ],
    )
    assert promote_choices(updater, "ada") == []


def test_nightly_maintenance_promotes_choices_once(updater: MemoryUpdater) -> None:
    remember(updater, BOOKINGS)
    store = updater.store
    with pytest.raises(ValueError, match="min_repeats"):
        maintain_user(store, "ada", choices_min_repeats=0, workspace_max_age=timedelta(days=1))
    first = maintain_user(store, "ada")
    assert len(first.promoted) == 1
    assert first.memories["persona"] == 1
    assert maintain_user(store, "ada").promoted == []
    assert maintain_user(store, "ada", choices_min_repeats=None).promoted == []


def test_the_cli_promotes_after_ingesting_unless_told_not_to(run_cli, tmp_path: Path) -> None:
    import orjson

    from autopersona_flows.memory import RawTaskRecord

    path = tmp_path / "tasks.jsonl"
    path.write_bytes(
        b"".join(
            orjson.dumps(
                RawTaskRecord(
                    user_id="ada", query=query, trace=trace, at=T0 + timedelta(days=i)
                ).model_dump(mode="json")
            )
            + b"\n"
            for i, (query, trace, _) in enumerate(BOOKINGS)
        )
    )
    for flags, persona in (((), 1), (("--no-promote",), 0)):
        store = tmp_path / f"store{len(flags)}"
        result = run_cli("ingest", str(store), str(path), *flags)
        assert result.returncode == 0, result.stderr
        assert len(JsonlMemoryStore(store).list("ada", "persona")) == persona
        assert ("persona:add 1" in result.stdout) is bool(persona)
