"""Extraction, validity phrases and the chat-log adapter, through real ingestion."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from autopersona_flows.errors import IngestionError
from autopersona_flows.memory import (
    ChatMessage,
    ExtractedMemory,
    JsonlMemoryStore,
    MemoryRetriever,
    MemoryUpdater,
    PersonaMemory,
    RawTaskRecord,
    RuleExtractor,
    SearchRequest,
    chat_sessions,
    ingest_task_history,
)
from autopersona_flows.memory.extraction import fact, first_person, statement
from autopersona_flows.memory.validity import valid_until

WEDNESDAY = datetime(2025, 1, 8, 15, 0, tzinfo=UTC)
DAY = timedelta(days=1)


@pytest.mark.parametrize(
    ("text", "end"),
    [
        ("I'm off dairy until March", datetime(2025, 3, 1, tzinfo=UTC)),
        ("working from Lisbon through March", datetime(2025, 4, 1, tzinfo=UTC)),
        ("use the spare room until March 3", datetime(2025, 3, 4, tzinfo=UTC)),
        ("until the 20th of January", datetime(2025, 1, 21, tzinfo=UTC)),
        ("until December", datetime(2025, 12, 1, tzinfo=UTC)),
        ("no calls until Friday", datetime(2025, 1, 11, tzinfo=UTC)),
        ("vegan for the next 3 weeks", WEDNESDAY + 21 * DAY),
        ("on holiday for two weeks", WEDNESDAY + 14 * DAY),
        ("I'm in Berlin this week", datetime(2025, 1, 13, tzinfo=UTC)),
        ("until next week", datetime(2025, 1, 13, tzinfo=UTC)),
        ("until the end of next week", datetime(2025, 1, 20, tzinfo=UTC)),
        ("until the end of the month", datetime(2025, 2, 1, tzinfo=UTC)),
        ("just for today", datetime(2025, 1, 9, tzinfo=UTC)),
        ("until January, said in January", datetime(2025, 2, 1, tzinfo=UTC)),
        (
            "lead walks only until his stitches come out on the 28th of January",
            datetime(2025, 1, 29, tzinfo=UTC),
        ),
        ("no spending until payday on the 28th", datetime(2025, 1, 29, tzinfo=UTC)),
        ("no spending until payday on the 3rd", datetime(2025, 2, 4, tzinfo=UTC)),
    ],
)
def test_time_bounded_statements_end_when_they_say(text: str, end: datetime) -> None:
    assert valid_until(text, WEDNESDAY) == end


@pytest.mark.parametrize(
    "text",
    [
        "my flight on March 3",
        "I've felt this for days",
        "I like tea",
        "until February 30",
        "I've been vegan for 10 years",
        "I tried keto for a month and hated it",
        "I pay through PayPal on the 1st of every month",
        "I'm away for the next 9999 years lol",
        "until March 0000",
    ],
)
def test_dates_that_bound_nothing_are_ignored(text: str) -> None:
    assert valid_until(text, WEDNESDAY) is None


@pytest.mark.parametrize(
    ("sentence", "topic", "preference"),
    [
        ("My seat preference is aisle", "seat preference", "aisle"),
        ("my budget is 150 a night.", "budget", "150 a night"),
        ("My email is john.smith@example.org.", "email", "john.smith@example.org"),
        ("My shoe size is 9.5 UK", "shoe size", "9.5 UK"),
        ("I prefer aisle seats on long flights", "seats", None),
        ("I really hate early meetings", "meetings", None),
        ("I'm allergic to peanuts", "allergies", None),
        ("I'm vegan", "diet", None),
        ("I quit coffee in May", "coffee", None),
        ("Joanna's birthday is the 16th of June", "Joanna's birthday", "the 16th of June"),
        ("My usual is a large americano, black", "usual", "a large americano, black"),
        ("I'm gluten intolerant, so no pasta places please", "intolerances", None),
        ("Always use my Monzo account for transfers", "account", None),
        ("Sold the car!", "car", "Sold the car"),
        ("I'm in Edinburgh till Friday for work", "location", None),
        ("I've given up caffeine completely, so tea please", "caffeine", None),
        ("Actually I've gone back to proper whole milk, the oat stuff was bad", "milk", None),
        ("Mum loves gardening stuff for presents", "Mum's gardening", None),
        ("Dad's into jazz vinyl", "Dad's vinyl", None),
        ("Leo's quit piano, he wants football instead", "Leo's piano", None),
        ("My husband is allergic to peanuts", "husband", "allergic to peanuts"),
    ],
)
def test_first_person_statements_become_memories(
    sentence: str, topic: str, preference: str | None
) -> None:
    memory = first_person(sentence)
    assert memory is not None
    assert memory.topic == topic
    assert memory.preference == (preference or sentence.rstrip("."))


@pytest.mark.parametrize(
    "sentence",
    [
        "Can you book a table for two?",
        "My flight is at 6",
        "I'm in the mood for something with Cate Blanchett",
        "It's the only thing I put in my coffee",
        "I'd like to book a flight to Rome",
        "Sarah wants the window seat",
        "It loves the sun",
        "Sounds like a blast",
        "Looks like you had fun",
        "Dancing is like second nature to me",
        "Their love gives me strength",
        "I'm in a meeting",
        "Never mind",
        "I'm doing great",
        "Here's one- 'Embracing Identity' is the title",
        "I like it",
        "my bank PIN is 4321",
        "I always use the password hunter2",
    ],
)
def test_requests_events_and_secrets_state_nothing(sentence: str) -> None:
    assert first_person(sentence) is None


def test_validity_needs_a_time_with_a_zone() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        valid_until("until March", datetime(2025, 1, 1))


def test_a_listed_item_wins_over_what_the_text_says_of_its_slot() -> None:
    record = RawTaskRecord(
        user_id="ada",
        query="I prefer a window seat this time. I prefer window seats, I'm flying this week.",
        persona=[PersonaMemory(topic="seat", preference="aisle")],
        at=WEDNESDAY,
    )
    assert [
        (item.content.topic, item.content.preference) for item in RuleExtractor().extract(record)
    ] == [("seat", "aisle")]
    unlisted = RawTaskRecord(
        user_id="ada", query="I prefer window seats, I'm flying this week.", at=WEDNESDAY
    )
    (found,) = RuleExtractor().extract(unlisted)
    assert found.valid_until is None  # the trip is bounded, not the preference


def test_a_sentence_bounded_in_time_states_a_situation() -> None:
    record = RawTaskRecord(
        user_id="ada",
        query="The kids are at their grandparents' this week, so no school run reminders. "
        "Can you remind me on Monday?",
        at=WEDNESDAY,
    )
    (found,) = RuleExtractor().extract(record)
    assert found.content.topic == "kids"
    assert found.valid_until == datetime(2025, 1, 13, tzinfo=UTC)


def test_listed_items_come_first_and_are_not_read_twice() -> None:
    record = RawTaskRecord(
        user_id="ada",
        query="I prefer aisle seats. Book me on the 9:40 to Oslo. I'm avoiding dairy until March",
        persona=[PersonaMemory(topic="seat", preference="I prefer aisle seats")],
        at=WEDNESDAY,
    )
    found = RuleExtractor().extract(record)
    assert [(item.content.topic, item.valid_until) for item in found] == [
        ("seat", None),
        ("dairy", datetime(2025, 3, 1, tzinfo=UTC)),
    ]
    assert [item.content for item in RuleExtractor(read_text=False).extract(record)] == [
        record.persona[0]
    ]


def test_a_chat_history_is_ingested_with_the_times_it_was_said(tmp_path: Path) -> None:
    t0 = datetime(2024, 5, 1, 9, 0, tzinfo=UTC)
    log = [
        {"role": "user", "text": "Find me a flight to Rome. I prefer window seats.", "at": t0},
        {"role": "assistant", "text": "Booked 14A, a window.", "at": t0 + timedelta(minutes=1)},
        # Out of order in the file, and a week later: another session.
        {"role": "assistant", "text": "Booked 3C.", "at": t0 + 7 * DAY + timedelta(minutes=2)},
        {"role": "user", "text": "Flight to Oslo. I now like aisle seats.", "at": t0 + 7 * DAY},
        {"role": "user", "text": "I'm using the spare laptop this week", "at": t0 + 8 * DAY},
    ]
    sessions = chat_sessions("ada", log)
    assert [(s.at, s.query, s.outcome) for s in sessions] == [
        (t0, log[0]["text"], "Booked 14A, a window."),
        (t0 + 7 * DAY, log[3]["text"], "Booked 3C."),
        (t0 + 8 * DAY, "I'm using the spare laptop this week", None),
    ]
    assert [entry["role"] for entry in sessions[1].trace] == ["user", "assistant"]
    store = JsonlMemoryStore(tmp_path)
    updater = MemoryUpdater(store)
    for session in reversed(sessions):  # in any order
        ingest_task_history(store, updater, session)
    now = datetime.now(UTC)
    persona = {r.content.topic: r for r in store.list("ada", "persona") if r.holds_at(now)}
    assert persona["seats"].content.preference == "I now like aisle seats"
    assert persona["seats"].at == t0 + 7 * DAY
    assert "laptop" not in persona  # "this week", in May 2024
    (laptop,) = [r for r in store.list("ada", "persona") if r.content.topic == "laptop"]
    assert laptop.valid_until == datetime(2024, 5, 13, tzinfo=UTC)
    found = MemoryRetriever(store).retrieve(
        "ada", [SearchRequest(layer="persona", query="which seat")]
    )
    assert [m.record.content.preference for m in found.persona] == ["I now like aisle seats"]


def test_interleaved_conversations_stay_apart_and_the_assistant_alone_is_no_task() -> None:
    t0 = datetime(2024, 5, 1, tzinfo=UTC)
    minute = timedelta(minutes=1)
    sessions = chat_sessions(
        "ada",
        [
            ChatMessage(role="user", text="a1", at=t0, session="a"),
            ChatMessage(role="user", text="b1", at=t0 + minute, session="b"),
            ChatMessage(role="assistant", text="a2", at=t0 + 2 * minute, session="a"),
            ChatMessage(role="assistant", text="b2", at=t0 + 3 * minute, session="b"),
            ChatMessage(role="assistant", text="I love Nopa's burger", at=t0 + DAY, session="c"),
        ],
    )
    assert [(s.query, s.outcome) for s in sessions] == [("a1", "a2"), ("b1", "b2")]


def test_a_session_id_change_starts_a_session_and_bad_messages_are_named() -> None:
    t0 = datetime(2024, 5, 1, tzinfo=UTC)
    two = chat_sessions(
        "ada",
        [
            ChatMessage(role="user", text="hi", at=t0, session="a"),
            ChatMessage(role="user", text="hello", at=t0 + timedelta(seconds=1), session="b"),
        ],
    )
    assert [s.query for s in two] == ["hi", "hello"]
    with pytest.raises(IngestionError, match=r"message 1: at: .*timezone"):
        chat_sessions(
            "ada",
            [
                {"role": "user", "text": "a", "at": t0},
                {"role": "user", "text": "b", "at": "2024-05-01T10:00:00"},
            ],
        )
    with pytest.raises(IngestionError, match="message 0: expected an object"):
        chat_sessions("ada", ["hello"])  # type: ignore[list-item]
    with pytest.raises(IngestionError, match="gap"):
        chat_sessions("ada", [], gap=timedelta(0))
    with pytest.raises(IngestionError, match="user"):
        chat_sessions("", [{"role": "user", "text": "a", "at": t0}])


class _Nonsense:
    def __init__(self, items: object) -> None:
        self.items = items

    def extract(self, record: RawTaskRecord) -> object:
        return self.items


@pytest.mark.parametrize(
    ("items", "problem"),
    [
        ("aisle", "not a list"),
        ([PersonaMemory(topic="seat", preference="aisle")], "not an ExtractedMemory"),
        (
            [
                ExtractedMemory(
                    content=PersonaMemory(topic="seat", preference="aisle"),
                    valid_until=WEDNESDAY - DAY,
                )
            ],
            "ends .* before the task happened",
        ),
    ],
)
def test_an_extractor_returning_nonsense_writes_nothing(
    tmp_path: Path, items: object, problem: str
) -> None:
    store = JsonlMemoryStore(tmp_path)
    record = RawTaskRecord(user_id="ada", query="book a seat", at=WEDNESDAY)
    with pytest.raises(IngestionError, match=problem):
        ingest_task_history(store, MemoryUpdater(store), record, extractor=_Nonsense(items))  # type: ignore[arg-type]
    assert store.users() == []


@pytest.mark.parametrize(
    ("sentence", "topic"),
    [
        ("ok cool, I'm always a 39 in running shoes", "running shoes size"),
        ("he's fine but I'm an L in everything", "everything size"),
        ("finally got my MSc in public health", "msc"),
        ("I ran the half in 1:52 last weekend", "half"),
        ("just bought my first road bike, a Canyon", "bike"),
    ],
)
def test_facts_people_state_about_themselves_become_memories(sentence: str, topic: str) -> None:
    memory = fact(sentence)
    assert memory is not None
    assert memory.topic == topic
    assert memory.preference == sentence


@pytest.mark.parametrize(
    "sentence",
    [
        "How do I use SharePoint for the team?",
        "what's a good budget for Rome",
        "can you find me a cheaper flight",
        "I started 3 weeks ago",  # a time is no topic
        "I'm looking for a new job",
        "I'm sure",
    ],
)
def test_questions_and_fillers_are_no_memories(sentence: str) -> None:
    assert first_person(sentence) is None
    assert fact(sentence) is None
    assert statement(sentence) is None


def test_a_lasting_statement_is_kept_as_said() -> None:
    said = "right, new rule for all my figures: viridis colour map from now on"
    memory = statement(said)
    assert memory is not None
    assert memory.preference == said
    assert statement("I need a flight to Rome on Friday") is None  # a request
    assert statement("thanks so much, that was great") is None
