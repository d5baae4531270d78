"""The semantic judge: meaning from the shipped encoder, structure kept as rules."""

import json
from pathlib import Path

import pytest

from autopersona_flows import JsonlMemoryStore, MemoryBank, PersonaMemory, PolicyError
from autopersona_flows.agent import (
    ClarifyDecision,
    FinalDecision,
    Judge,
    NodeInfo,
    PersonaAgent,
    PersonaRequest,
    Requirement,
)
from autopersona_flows.agent.semantic import FEATURES, AnswerhoodModel, SemanticJudge
from autopersona_flows.memory.encoders import WEIGHTS

SEAT = Requirement("seat", options=["aisle", "window", "middle"])
FLIGHT = NodeInfo(id="choose-seat", instruction="Pick a seat on the booked flight")


def agent(store: JsonlMemoryStore) -> PersonaAgent:
    return PersonaAgent(MemoryBank(store))


def decide(
    store: JsonlMemoryStore,
    requirement: Requirement,
    query: str = "Book my flight to Lisbon on Friday",
    node: NodeInfo = FLIGHT,
) -> FinalDecision | ClarifyDecision:
    request = PersonaRequest(user_id="ada", query=query, node=node, requirements=[requirement])
    return agent(store).decide(request)


def value(decision: FinalDecision | ClarifyDecision, requirement: str) -> str | None:
    assert isinstance(decision, FinalDecision), decision
    (constraint,) = [c for c in decision.constraints if c.requirement == requirement]
    return constraint.value


def test_it_is_the_default_judge_and_follows_the_protocol() -> None:
    judge = PersonaAgent(MemoryBank("unused-folder-never-written")).policy.judge  # type: ignore[attr-defined]
    assert isinstance(judge, SemanticJudge)
    assert isinstance(judge, Judge)


def test_a_paraphrase_sharing_no_word_answers(store: JsonlMemoryStore) -> None:
    MemoryBank(store).add("ada", PersonaMemory(topic="what I eat", preference="pescatarian"))
    diet = Requirement("dietary needs")
    decision = decide(store, diet, "Book a table for Saturday", NodeInfo(id="book-table"))
    assert "pescatarian" in (value(decision, "dietary needs") or "")


@pytest.mark.parametrize(
    "said",
    [
        "I prefer the aisle over the window or the middle",
        "anything but the window or the middle, I'm up and down all flight",
        "aisle, never the middle",
    ],
)
def test_an_option_is_never_read_out_of_wording_that_rejects_it(
    store: JsonlMemoryStore, said: str
) -> None:
    MemoryBank(store).add("ada", PersonaMemory(topic="flights", preference=said))
    assert value(decide(store, SEAT), "seat") == "aisle"


def test_a_final_value_is_one_of_the_options_or_the_question_names_what_memory_says(
    store: JsonlMemoryStore,
) -> None:
    bank = MemoryBank(store)
    bank.add("ada", PersonaMemory(topic="citation style", preference="Chicago, author-date"))
    style = Requirement("citation style", options=["APA", "MLA"])
    node = NodeInfo(id="format-references", instruction="Format the references")
    decision = decide(store, style, "Finish my essay", node)
    assert isinstance(decision, ClarifyDecision)
    assert decision.requirement == "citation style"
    assert "Chicago" in decision.question  # named, with why it does not answer
    assert decision.options == ["APA", "MLA"]


def test_the_situation_of_the_request_selects_the_value(store: JsonlMemoryStore) -> None:
    MemoryBank(store).add(
        "ada",
        PersonaMemory(topic="flights", preference="on work trips the aisle, otherwise the window"),
    )
    work = decide(store, SEAT, "Book my flight to Berlin for the sales kickoff with the client")
    family = decide(store, SEAT, "Flights to Faro for our family holiday with the kids in August")
    assert value(work, "seat") == "aisle"
    assert value(family, "seat") == "window"


def test_a_correction_for_another_request_is_kept_beside_the_first(
    store: JsonlMemoryStore,
) -> None:
    persona = agent(store)
    seat = Requirement("seat", options=["aisle", "window"])
    pitch = PersonaRequest(
        user_id="ada",
        query="Flight to Leeds for the client pitch on Tuesday",
        node=FLIGHT,
        requirements=[seat],
    )
    holiday = pitch.model_copy(
        update={"query": "Flights to Faro for our family week with the kids"}
    )
    persona.correct(pitch, "seat", "aisle, I need to get off fast for meetings")
    persona.correct(holiday, "seat", "the window, the kids love looking out")
    assert len(store.list("ada", "persona")) == 2  # both held, each for its request
    board = pitch.model_copy(
        update={"query": "Flight to Manchester for the quarterly board meeting"}
    )
    assert value(persona.decide(board), "seat") == "aisle"
    beach = pitch.model_copy(
        update={"query": "Flights to Malaga for a family beach week with the kids"}
    )
    assert value(persona.decide(beach), "seat") == "window"


def test_a_correction_names_a_requirement_of_its_request(store: JsonlMemoryStore) -> None:
    request = PersonaRequest(user_id="ada", query="Book a flight", requirements=[SEAT])
    with pytest.raises(PolicyError, match=r"no requirement 'meal'.*\['seat'\]"):
        agent(store).correct(request, "meal", "vegetarian")


def test_weights_that_do_not_fit_the_features_are_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="cannot read the judge's weights"):
        AnswerhoodModel(tmp_path / "missing.json")
    data = json.loads((WEIGHTS / "judge.json").read_text())
    data["features"] = [*FEATURES[:-1], "something else"]
    path = tmp_path / "judge.json"
    path.write_text(json.dumps(data))
    with pytest.raises(PolicyError, match=rf"missing \['{FEATURES[-1]}'\].*fit_judge\.py"):
        AnswerhoodModel(path)
