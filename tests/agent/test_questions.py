"""Questions as a person would ask them: composed from the requirement, the options said once."""

import pytest

from autopersona_flows.agent import NodeInfo, PersonaRequest, Requirement
from autopersona_flows.agent.questions import compose_question, names_options, options_phrase


def asked(requirement: Requirement, query: str = "", instruction: str | None = None) -> str:
    node = None if instruction is None else NodeInfo(id="step", instruction=instruction)
    request = PersonaRequest(user_id="ada", query=query, node=node, requirements=[requirement])
    return compose_question(requirement, request)


@pytest.mark.parametrize(
    ("requirement", "query", "instruction", "question"),
    [
        (
            Requirement("seat", options=["window", "aisle"]),
            "Book my flight",
            None,
            "To book your flight, which seat would you like? Window or aisle?",
        ),
        (
            Requirement("dietary needs"),
            "Plan my train trip to York",
            None,
            "To plan your train trip to York, what are your dietary needs?",
        ),
        (
            # The work would only repeat the requirement: "to plan breakfasts, ... breakfast".
            Requirement("breakfast"),
            "Plan the week",
            "Plan breakfasts",
            "What breakfast would you like?",
        ),
        (
            Requirement("citation style", options=["APA", "MLA", "Chicago"]),
            "Summarise the retrieval papers and share them",
            "Format the references",
            "To format the references, which citation style would you like? APA, MLA or Chicago?",
        ),
        (
            Requirement("tone", options=["formal", "friendly"], allow_other=True),
            "Write to the landlord",
            "Draft the letter",
            "To draft the letter, which tone would you like? Formal, friendly or something else?",
        ),
        (
            Requirement("home airport", example="Manchester"),
            "Plan a long weekend somewhere sunny",
            "Pick a destination and flights",
            "To pick a destination and flights, what is your home airport? For example: "
            "Manchester.",
        ),
        (
            Requirement("budget per night", description="the most to pay for a room"),
            "Book a B&B in York",
            "Choose accommodation",
            "To choose accommodation, what is your budget per night? (the most to pay for a room)",
        ),
        (
            Requirement("paper size", default="A4"),
            "Print my paper",
            "Print the paper",
            "What paper size would you like? For example: A4.",
        ),
        (
            # A name that is a question already; "I" is the person, said to them as "you".
            Requirement("when I can meet"),
            "Book a meeting with Sam",
            "Find a time",
            "To find a time, could you tell me when you can meet?",
        ),
        (
            # Not an imperative: the request is neither quoted nor turned into a purpose.
            Requirement("travel dates"),
            "I need a hotel in Leeds next month",
            None,
            "What travel dates would you like?",
        ),
        (
            Requirement("delivery slot", options=["morning", "evening"]),
            "Do the weekly shop",
            "Sends the order",  # a description, not an instruction
            "Which delivery slot would you like? Morning or evening?",
        ),
        (
            Requirement("number of guests"),
            "Book the caterer",
            None,
            "To book the caterer, what number of guests would you like?",
        ),
    ],
)
def test_a_question_reads_as_a_person_would_ask_it(
    requirement: Requirement, query: str, instruction: str | None, question: str
) -> None:
    assert asked(requirement, query, instruction) == question


def test_no_composed_question_quotes_the_request_or_says_should_i_use() -> None:
    for name in ("seat", "dietary needs", "sharing channel", "budget", "allergies"):
        for query in ("Plan my train trip to York", "Sort out Friday", "my trip"):
            question = asked(Requirement(name), query)
            assert "should I use" not in question
            assert repr(query) not in question
            assert f'"{query}"' not in question
            assert question[0].isupper()
            assert question.endswith("?")


def test_options_keep_their_case_and_are_said_once() -> None:
    question = asked(Requirement("phone", options=["iPhone 15", "Pixel 8"]), "Order me a case")
    assert question == "To order you a case, which phone would you like? iPhone 15 or Pixel 8?"
    assert names_options(question, ["iPhone 15", "Pixel 8"])
    assert not names_options("Which phone would you like?", ["iPhone 15", "Pixel 8"])
    # A word inside another is not its option: "MLA" is not named by "MLAs".
    assert not names_options("Any MLAs?", ["MLA"])
    assert options_phrase(["APA"], others=True) == "APA or something else"
    assert options_phrase(["a", "b", "c"]) == "a, b or c"


def test_a_declared_question_is_kept_as_written() -> None:
    declared = Requirement("seat", question="Aisle or window, this time?", options=["a", "w"])
    assert asked(declared, "Book my flight") == "Aisle or window, this time?"


def test_a_long_request_is_left_out_and_the_question_stands_alone() -> None:
    query = "Get me on the Thursday evening flight from London City to Dublin for the offsite"
    assert asked(Requirement("seat preference"), query) == "What is your seat preference?"
