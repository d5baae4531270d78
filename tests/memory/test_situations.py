"""Situations a preference holds in, read by structure: the words that mark a condition."""

import pytest

from autopersona_flows.memory.situations import situated


@pytest.mark.parametrize(
    ("text", "parts"),
    [
        (
            "for work trips the aisle, otherwise window",
            [("work trips", "the aisle"), (None, "window")],
        ),
        (
            "aisle on work trips; window with the kids",
            [("work trips", "aisle"), ("the kids", "window")],
        ),
        ("20 degrees in winter, 18 in summer", [("winter", "20 degrees"), ("summer", "18")]),
        ("aisle for work, window otherwise", [("work", "aisle"), (None, "window")]),
        ("with the kids: window", [("the kids", "window")]),
        ("when it's for work, aisle", [("it's for work", "aisle")]),
        ("on weekends I sleep till 9", [("weekends", "I sleep till 9")]),
        (
            "if I'm with the girls get a table for four",
            [("I'm with the girls", "get a table for four")],
        ),
        (
            "when I bake for Ella it's gluten-free everything",
            [("I bake for Ella", "it's gluten-free everything")],
        ),
    ],
)
def test_conditions_and_their_values_are_parted(
    text: str, parts: list[tuple[str | None, str]]
) -> None:
    assert [(part.situation, part.text) for part in situated(text)] == parts


@pytest.mark.parametrize(
    "text",
    [
        "aisle seat pls, I'm up and down the whole flight",
        "window if possible",  # a hedge
        "flat white with oat milk, extra hot",  # "with" a value, not a situation
        "with oat milk please",
        "keep it around €150 a night, that's the max the team budget allows",
        "Table for two at 8, by the window",
        # Two long parts with prepositions are no parallel situations.
        "correction - they've moved her to room 22 on the ground floor, easier for the wheelchair",
        "I try to stay under €180 a night, even if it means a bit further",  # concessive
    ],
)
def test_plain_values_hold_in_general(text: str) -> None:
    ((situation, kept),) = [(part.situation, part.text) for part in situated(text)]
    assert situation is None
    assert kept == text
