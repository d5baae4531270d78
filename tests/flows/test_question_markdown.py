"""The question a person sees: once, in plain words, with the memories that came closest."""

from datetime import UTC, datetime

import jsonschema
import prefect.settings as ps
import pytest

from autopersona_flows import MemoryRecord, PersonaMemory, TrajectoryMemory
from autopersona_flows.agent import ClarifyDecision, NodeInfo, PersonaRequest, Requirement
from autopersona_flows.flows.clarification import (
    artifact_markdown,
    clarification_form,
    field_title,
    question_markdown,
    question_of,
    questions_form,
    step_words,
)
from autopersona_flows.flows.events import flow_run_url
from autopersona_flows.memory.retrieval import MemoryBundle, ScoredMemory, SearchRequest

AT = datetime(2025, 1, 1, tzinfo=UTC)
QUESTION = "Aisle or window?"


def record(content: PersonaMemory | TrajectoryMemory) -> MemoryRecord:
    return MemoryRecord.of(content, created_at=AT)


def found(record: MemoryRecord, score: float, label: str | None = None) -> ScoredMemory:
    return ScoredMemory(
        record=record,
        score=score,
        search=SearchRequest(layer=record.layer, query="q", label=label),
    )


def seat_question(*found_memories: ScoredMemory, instruction: str = "") -> ClarifyDecision:
    persona = [m for m in found_memories if m.record.layer == "persona"]
    trajectory = [m for m in found_memories if m.record.layer == "trajectory"]
    return ClarifyDecision(
        question=QUESTION,
        requirement="seat",
        options=["aisle", "window"],
        memories=MemoryBundle(trajectory=trajectory, persona=persona),
        request=PersonaRequest(
            user_id="ada",
            query="Fly me to Oslo",
            node=NodeInfo(id="book_flight", instruction=instruction),
        ),
    )


def test_the_question_appears_once_and_names_the_step_in_plain_words() -> None:
    decision = seat_question(instruction="Book the flight.")
    text = question_markdown("book_flight", decision)
    assert text.count(QUESTION) == 1
    assert "Book the flight" in text
    assert "book_flight" not in text  # no internal id
    assert question_of(text) == QUESTION
    # The form repeats nothing: no description under its field, the options are its choices.
    answer = clarification_form(decision).model_json_schema()["properties"]["answer"]
    assert "description" not in answer
    assert QUESTION not in str(answer)
    assert answer["enum"] == ["aisle", "window"]


def test_a_form_of_several_questions_titles_a_select_without_listing_its_options_again() -> None:
    style = ClarifyDecision(
        question="Which citation style should I use? Options: APA, MLA.",
        requirement="citation style",
        options=["APA", "MLA"],
    )
    channel = ClarifyDecision(question="Which sharing channel should I use?")
    fields = questions_form([style, channel]).model_json_schema()["properties"]
    assert fields["citation_style"]["title"] == "Which citation style should I use?"
    assert fields["citation_style"]["enum"] == ["APA", "MLA"]
    assert fields["answer_2"]["title"] == "Which sharing channel should I use?"


def test_a_step_without_an_instruction_is_named_by_its_id_made_readable() -> None:
    assert step_words("format_references", seat_question()) == "format references"
    assert "format references" in question_markdown("format_references", seat_question())


def test_each_memory_is_listed_once_closest_first_and_near_zero_ones_not_at_all() -> None:
    aisle = record(PersonaMemory(topic="seat", preference="aisle, mostly"))
    oslo = record(TrajectoryMemory(query="Flight to Oslo", trace=["booked"]))
    faint = record(PersonaMemory(topic="tone", preference="terse"))
    allergy = record(PersonaMemory(topic="health", preference="nut allergy"))
    decision = seat_question(
        found(aisle, 0.3),
        found(aisle, 0.8),  # the same memory found by a second search
        found(aisle, 0.0, "standing"),  # and by a lookup
        found(oslo, 0.2),
        found(faint, 0.02),
        found(allergy, 0.0, "standing"),
    )
    text = question_markdown("book_flight", decision)
    assert text.count("seat: aisle, mostly") == 1
    assert "(persona memory, similarity 0.80)" in text
    assert text.index("seat: aisle, mostly") < text.index("Flight to Oslo")  # by score
    assert "terse" not in text
    assert "nut allergy" not in text
    assert aisle.id not in text  # what memory says, not its id
    # Nothing came close: the section is left out.
    assert "memory" not in question_markdown("book_flight", seat_question(found(faint, 0.02)))


def test_the_artifact_names_the_choices_once_then_says_what_was_answered() -> None:
    decision = seat_question(instruction="Book the flight")
    waiting = artifact_markdown("book_flight", decision)
    assert "Choices" not in waiting  # "Aisle or window?" names them already
    assert "needs an answer" not in waiting
    declared = decision.model_copy(update={"question": "Where would you like to sit?"})
    assert "Choices: aisle, window." in artifact_markdown("book_flight", declared)
    answered = artifact_markdown("book_flight", decision, "aisle")
    assert "Answered before: Book the flight" in answered
    assert "Answer: **aisle**" in answered
    assert "Waiting" not in answered


@pytest.mark.parametrize("blank", ["", " ", "   ", "\t\n"])
def test_a_text_answer_must_hold_more_than_whitespace(blank: str) -> None:
    schema = clarification_form(ClarifyDecision(question="Which tone?")).model_json_schema()
    # Prefect's server validates the resume input against this schema with jsonschema.
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"answer": blank}, schema)
    jsonschema.validate({"answer": " terse "}, schema)


def test_the_run_link_comes_from_the_ui_url_or_else_from_the_api_url() -> None:
    run = "0b4f7a46-7c2a-4a55-9d2c-3d1b8d2f3b11"
    with ps.temporary_settings(
        updates={ps.PREFECT_UI_URL: "https://prefect.example.org/", ps.PREFECT_API_URL: None}
    ):
        assert flow_run_url(run) == f"https://prefect.example.org/runs/flow-run/{run}"
    # Without a UI URL, the API's address without its /api: never "None".
    with ps.temporary_settings(
        updates={ps.PREFECT_API_URL: "http://10.0.0.5:4200/api"},
        restore_defaults={ps.PREFECT_UI_URL},
    ):
        assert flow_run_url(run) == f"http://10.0.0.5:4200/runs/flow-run/{run}"


def test_a_requirement_allowing_other_words_takes_text_beside_its_suggested_options() -> None:
    closed = seat_question()
    request = closed.request
    assert request is not None
    seat = Requirement("seat", options=["aisle", "window"], allow_other=True)
    open_ = closed.model_copy(
        update={"request": request.model_copy(update={"requirements": [seat]})}
    )

    closed_schema = clarification_form(closed).model_json_schema()
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"answer": "exit row"}, closed_schema)

    schema = clarification_form(open_).model_json_schema()
    jsonschema.validate({"answer": "exit row"}, schema)
    jsonschema.validate({"answer": "aisle"}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"answer": "  "}, schema)
    # The question names the suggestions ("Aisle or window?"): neither label repeats them.
    assert schema["properties"]["answer"]["title"] == "Your answer"
    assert field_title(open_) == QUESTION
    # One that does not name them: the label says what the text field suggests.
    unnamed = open_.model_copy(update={"question": "Where would you like to sit?"})
    title = clarification_form(unnamed).model_json_schema()["properties"]["answer"]["title"]
    assert title == "Your answer (aisle, window, or your own words)"
    assert field_title(unnamed) == "Where would you like to sit? (aisle, window, or your own words)"
