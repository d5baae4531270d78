"""Learned answers are slots: never asked twice at the same step or job, in whatever words."""

import pytest

from autopersona_flows import JsonlMemoryStore, PersonaMemory, PolicyError
from autopersona_flows.agent import (
    ClarifyDecision,
    FinalDecision,
    NodeInfo,
    PersonaAgent,
    PersonaRequest,
    Requirement,
)
from autopersona_flows.memory import MemoryRetriever

QUERY = "Book me a flight to Oslo next Monday"
NODE = NodeInfo(id="choose-seat", instruction="Pick a seat on the flight")


def request(
    *requirements: Requirement, node: NodeInfo = NODE, query: str = QUERY
) -> PersonaRequest:
    return PersonaRequest(user_id="ada", query=query, node=node, requirements=list(requirements))


def asked_and_answered(agent: PersonaAgent, requirement: Requirement, answer: str) -> None:
    question = agent.decide(request(requirement))
    assert isinstance(question, ClarifyDecision)
    agent.learn("ada", question, answer)


def value(decision: FinalDecision | ClarifyDecision, requirement: str) -> str | None:
    assert isinstance(decision, FinalDecision), decision
    (constraint,) = [c for c in decision.constraints if c.requirement == requirement]
    return constraint.value or constraint.text


@pytest.fixture
def agent(store: JsonlMemoryStore) -> PersonaAgent:
    return PersonaAgent(MemoryRetriever(store))


def test_an_answer_is_stored_with_everything_it_was_asked_as(
    agent: PersonaAgent, store: JsonlMemoryStore
) -> None:
    seat = Requirement(
        "seat preference",
        description="where on the plane",
        question="Aisle or window?",
        options=["aisle", "window"],
    )
    asked_and_answered(agent, seat, "  aisle please ")
    (memory,) = store.list("ada", "persona")
    assert memory.content == PersonaMemory(
        topic="seat preference",
        preference="aisle please",
        aliases=["where on the plane", "Aisle or window?"],
        options=["aisle", "window"],
        contexts=["choose-seat", "Pick a seat on the flight", QUERY],
        request=QUERY,
    )


@pytest.mark.parametrize(
    "later",
    [
        Requirement("where to sit"),  # no word in common, the same step
        Requirement("seat type", description="window, aisle or middle"),
        Requirement("seating", options=["aisle", "window", "middle"]),
    ],
)
def test_the_same_need_in_other_words_at_the_same_step_is_not_asked_again(
    agent: PersonaAgent, later: Requirement
) -> None:
    asked_and_answered(
        agent, Requirement("seat preference", options=["aisle", "window"]), "aisle please"
    )
    assert "aisle" in (value(agent.decide(request(later)), later.name) or "")


def test_the_same_need_for_the_same_job_at_another_step_is_not_asked_again(
    agent: PersonaAgent,
) -> None:
    asked_and_answered(agent, Requirement("hotel budget"), "under 200 a night")
    later = Requirement("max rate", description="the most to pay per night for a room")
    decision = agent.decide(
        request(later, node=NodeInfo(id="compare-rooms", instruction="Compare"))
    )
    assert "under 200" in (value(decision, "max rate") or "")


def test_a_place_answered_in_a_job_answers_its_need_at_another_step(agent: PersonaAgent) -> None:
    query = "Refill my inhaler prescription"
    send = NodeInfo(id="send-request", instruction="Send the repeat prescription request")
    question = agent.decide(request(Requirement("pharmacy"), node=send, query=query))
    assert isinstance(question, ClarifyDecision)
    agent.learn("ada", question, "Boots on Castle Street")
    notify = NodeInfo(id="notify", instruction="Tell the person where to collect")
    later = request(Requirement("where to collect from"), node=notify, query=query)
    assert value(agent.decide(later), "where to collect from") == "Boots on Castle Street"


def test_an_amount_answered_in_a_job_is_no_other_amount_at_another_step(
    agent: PersonaAgent,
) -> None:
    asked_and_answered(agent, Requirement("hotel budget"), "200 a night")
    tip = Requirement("tip", description="what to leave the driver")
    decision = agent.decide(request(tip, node=NodeInfo(id="book-taxi", instruction="Book a cab")))
    assert isinstance(decision, ClarifyDecision)  # both are amounts; nothing else ties them
    assert decision.requirement == "tip"


@pytest.mark.parametrize(
    ("asked", "answer", "other"),
    [
        ("airline", "British Airways", "hotel"),
        ("departure city", "London", "hotel area"),
        ("dietary restriction", "vegetarian", "guest of honour"),
    ],
)
def test_an_answer_in_a_job_is_no_need_another_step_names_for_itself(
    agent: PersonaAgent, asked: str, answer: str, other: str
) -> None:
    asked_and_answered(agent, Requirement(asked), answer)
    node = NodeInfo(id="next-step", instruction="Book the rest of the trip")
    decision = agent.decide(request(Requirement(other), node=node))
    assert isinstance(decision, ClarifyDecision)  # named by a noun of its own: not the answer
    assert decision.requirement == other


def test_a_new_answer_keeps_where_the_old_one_was_learned(
    agent: PersonaAgent, store: JsonlMemoryStore
) -> None:
    asked_and_answered(agent, Requirement("seat preference"), "aisle")
    elsewhere = NodeInfo(id="rebook", instruction="Rebook the cancelled flight")
    question = agent.decide(request(Requirement("seat preference"), node=elsewhere))
    assert isinstance(question, FinalDecision)  # known: not asked
    changed = ClarifyDecision(
        question="Seat?",
        requirement="seat preference",
        request=request(Requirement("seat preference"), node=elsewhere),
    )
    agent.learn("ada", changed, "window")
    (memory,) = store.list("ada", "persona")
    assert memory.content.preference == "window"
    assert {"choose-seat", "rebook"} <= set(memory.content.contexts)
    # At the first step, the need in other words still finds the (new) answer.
    assert value(agent.decide(request(Requirement("where to sit"))), "where to sit") == "window"


def test_another_need_at_the_same_step_is_asked(agent: PersonaAgent) -> None:
    asked_and_answered(agent, Requirement("seat preference", options=["aisle", "window"]), "aisle")
    meal = Requirement("meal", options=["vegetarian", "standard"])  # the answer is no meal
    assert isinstance(agent.decide(request(meal)), ClarifyDecision)
    time = Requirement("departure time")  # an answer with no time in it is no departure time
    assert isinstance(agent.decide(request(time)), ClarifyDecision)


def test_an_answer_answers_its_own_requirement_not_its_neighbours(agent: PersonaAgent) -> None:
    asked_and_answered(agent, Requirement("seat preference"), "aisle")
    both = request(Requirement("seat preference"), Requirement("baggage"))
    decision = agent.decide(both)
    assert isinstance(decision, ClarifyDecision)
    assert decision.requirement == "baggage"


def test_a_changed_answer_replaces_the_old_one_and_a_new_process_knows_it(
    agent: PersonaAgent, store: JsonlMemoryStore
) -> None:
    seat = Requirement("seat preference", options=["aisle", "window"])
    asked_and_answered(agent, seat, "aisle")
    agent.learn("ada", ClarifyDecision(question="Seat?", requirement="seat preference"), "window")
    fresh = PersonaAgent(MemoryRetriever(JsonlMemoryStore(store.root)))
    assert value(fresh.decide(request(seat)), "seat preference") == "window"
    assert len(store.list("ada", "persona")) == 1


def test_an_answer_is_learned_for_the_person_asked_only(agent: PersonaAgent) -> None:
    question = agent.decide(request(Requirement("seat preference")))
    with pytest.raises(PolicyError, match="asked for user 'ada', not 'bob'"):
        agent.learn("bob", question, "aisle")


def test_memories_written_before_slots_keep_their_exact_form() -> None:
    # No new field appears in an old memory's JSON: digests, fingerprints and the
    # files of older banks stay byte for byte what they were.
    old = PersonaMemory(topic="tone", preference="terse")
    assert old.model_dump_json() == '{"topic":"tone","preference":"terse","strategy":""}'
    assert PersonaMemory.model_validate_json(old.model_dump_json()) == old
