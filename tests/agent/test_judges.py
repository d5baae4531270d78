"""The LexicalJudge: does a memory answer a requirement, read on the right fields?"""

from datetime import UTC, datetime
from typing import ClassVar

import numpy as np
import pytest

from autopersona_flows import MemoryRecord, PersonaMemory, TrajectoryMemory, WorkspaceMemory
from autopersona_flows.agent import NodeInfo, PersonaRequest, Requirement
from autopersona_flows.agent.judges import LexicalJudge, Verdict
from autopersona_flows.agent.matchers import DenseWordMatcher
from autopersona_flows.memory import FunctionEmbedder
from autopersona_flows.memory.phrases import (
    attribute_kinds,
    clauses,
    content_roots,
    kin,
    phrase,
    root,
    value_kinds,
)
from autopersona_flows.memory.records import LayerContent
from autopersona_flows.memory.retrieval import ScoredMemory, SearchRequest

AT = datetime(2025, 3, 1, tzinfo=UTC)


def judged(
    requirement: Requirement,
    *contents: LayerContent,
    query: str = "Book me a flight to Lisbon",
    instruction: str = "Choose a flight and a seat",
) -> list[Verdict]:
    """The judge's verdicts on ``contents`` as the candidates of ``requirement``."""
    request = PersonaRequest(
        user_id="ada",
        query=query,
        node=NodeInfo(id="book", instruction=instruction),
        requirements=[requirement],
    )
    candidates = [
        ScoredMemory(
            record=MemoryRecord.of(content, created_at=AT),
            score=0.5,
            search=SearchRequest(layer=content.layer, query=requirement.name),
        )
        for content in contents
    ]
    return LexicalJudge().judge(request, {requirement.name: candidates})[requirement.name]


def answers(requirement: Requirement, content: LayerContent, **context: str) -> bool:
    (verdict,) = judged(requirement, content, **context)
    return verdict.answers and verdict.strength >= 0.5


# -- reading phrases ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "head", "modifiers"),
    [
        ("seat preference", "seat", set()),  # a generic noun names nothing
        ("flight seat", "seat", {"flight"}),
        ("hotel booking method", "method", {"hotel", "book"}),
        ("budget per night", "budget", {"night"}),  # the head comes before a preposition
        ("dog food brand", "brand", {"dog", "food"}),
        ("citing sources", "cit", {"sourc"}),  # a gerund and its plural object: the activity
        ("where to post update", "updat", {"post"}),
        ("Biscuit's food", "food", {"biscuit"}),
    ],
)
def test_a_phrase_names_its_attribute_last(text: str, head: str, modifiers: set[str]) -> None:
    read = phrase(text)
    assert (read.head, set(read.modifiers)) == (head, modifiers)


def test_weak_heads_question_names_and_generic_words() -> None:
    assert phrase("citation style").weak
    assert phrase("citation style").identity == {"cit"}
    assert not phrase("style").weak  # alone it is the attribute
    assert phrase("when I can meet").asks == {"time", "day", "date"}
    assert phrase("what she likes").head is None  # generic words only: about nothing
    assert phrase("max spend").subject == frozenset()  # "max" qualifies, says of what nothing
    assert phrase("quiz length").subject == {"quiz"}


def test_roots_meet_across_derivation_but_not_across_meaning() -> None:
    for a, b in [
        ("dietary", "diet"),
        ("allergic", "allergies"),
        ("plumber", "plumbing"),
        ("citation", "citing"),
        ("updates", "update"),
        ("travelling", "travel"),
    ]:
        assert root(a) == root(b), (a, b)
    for a, b in [("vegetarian", "vegetable"), ("summer", "summary"), ("corner", "corn")]:
        assert root(a) != root(b), (a, b)


def test_clauses_know_negation_preference_and_change() -> None:
    first, second = clauses("honestly I can't stand window seats, put me on the aisle")
    assert first.polarity(first.surface.index("window")) == -1
    assert second.polarity(second.surface.index("aisle")) == 0
    (rather,) = clauses("I'd rather have the aisle than the window")
    assert rather.polarity(rather.surface.index("window")) == -1
    assert rather.polarity(rather.surface.index("aisle")) == 1
    assert clauses("I don't do the gym anymore")[0].ceasing
    assert clauses("so pescatarian now")[0].changing
    assert not clauses("not using any app for now")[0].changing  # "for now" is no change
    assert clauses("Formatted citations in APA")[0].surface[-1] == "APA"  # case kept


def test_values_have_shapes_and_attributes_take_them() -> None:
    assert "amount" in value_kinds("never more than €150 a night")
    assert "time" in value_kinds("finishes at 3:15")
    assert "day" in value_kinds("long run Sundays")
    assert "size" in value_kinds("I'm a UK 8 now")
    assert "dose" in value_kinds("half a tablet of Apoquel 16mg")
    assert "version" in value_kinds("runtime python3.11")
    assert not value_kinds("quiet room away from the lift")
    assert attribute_kinds(content_roots("budget")) == {"amount"}
    assert kin(root("price"), root("budget"))
    assert not kin(root("price"), root("seat"))


# -- topics ---------------------------------------------------------------------------------

SEAT = Requirement("seat preference", options=["aisle", "window"])


def test_a_topic_naming_the_attribute_answers_in_other_words() -> None:
    assert answers(SEAT, PersonaMemory(topic="flight seat", preference="aisle, always"))
    budget = Requirement("budget per night")
    hotel = PersonaMemory(topic="hotel spend", preference="around €150 a night")
    assert answers(budget, hotel, query="Find a hotel in Lyon", instruction="Book a hotel")


@pytest.mark.parametrize(
    ("requirement", "memory", "query"),
    [
        # The same subject, another attribute.
        ("hotel budget", ("hotel booking method", "always through the company portal"), "hotel"),
        ("budget", ("budget spreadsheet", "the shared one on the drive"), "plan the trip"),
        # The same attribute, another subject.
        ("quiz length", ("lesson length", "45 minutes"), "write a quiz for year 9"),
        # A word shared in another sense ("training" / "train").
        ("travel class", ("dog training class", "Wednesdays 6pm"), "book a train to York"),
        ("citation style", ("citation manager", "Zotero"), "format my references"),
        # A seat of another journey than this one.
        ("seat preference", ("train seat", "forward-facing, table"), "book a flight"),
    ],
)
def test_a_neighbouring_topic_never_answers(
    requirement: str, memory: tuple[str, str], query: str
) -> None:
    topic, preference = memory
    content = PersonaMemory(topic=topic, preference=preference)
    assert not answers(Requirement(requirement), content, query=query, instruction=query)


def test_a_neighbouring_topic_answers_when_its_value_says_so_plainly() -> None:
    pickup = Requirement("school pickup time")
    run = PersonaMemory(
        topic="Mia school run", preference="Mia finishes at 3:15, pick up at the gate"
    )
    assert answers(pickup, run, query="Tell Grandma the details", instruction="Message Grandma")


# -- values ---------------------------------------------------------------------------------


def test_a_vague_topic_answers_through_its_value() -> None:
    travel = PersonaMemory(
        topic="travel", preference="honestly I can't stand window seats, put me on the aisle"
    )
    (verdict,) = judged(SEAT, travel)
    assert verdict.answers
    assert verdict.value == "aisle"  # the option said, not the one hated
    misc = PersonaMemory(topic="misc", preference="oh and I always want receipts as PDFs")
    assert answers(Requirement("receipt format"), misc)


def test_a_value_of_the_attribute_for_another_subject_does_not_answer() -> None:
    groceries = PersonaMemory(topic="money", preference="keep the grocery budget under 80 a week")
    assert not answers(Requirement("hotel budget"), groceries, query="Find a hotel in Rome")


def test_a_value_of_the_right_shape_alone_does_not_answer() -> None:
    # A time under a vague topic is some time: lunch's is not the workout's.
    workout = Requirement("workout time")
    lunch = PersonaMemory(topic="lunch", preference="block 12:30-1:15 every day")
    assert not answers(workout, lunch, query="Schedule my strength sessions")
    # With the subject named beside it, it is the workout's.
    gym = PersonaMemory(topic="training", preference="workouts start by 6:30 or never")
    assert answers(workout, gym, query="Schedule my strength sessions")


def test_declared_options_must_be_stated() -> None:
    plain = PersonaMemory(topic="writing tone", preference="plain and direct")
    template = Requirement("slide template", options=["university", "plain"])
    assert not answers(template, plain, query="Make slides", instruction="Build the deck")


def test_a_preference_that_no_longer_holds_ceases_without_answering() -> None:
    (verdict,) = judged(
        Requirement("gym schedule"),
        PersonaMemory(topic="gym schedule", preference="I don't do the gym anymore"),
        query="Plan my week",
    )
    assert (verdict.answers, verdict.ceases) == (False, True)
    (changed,) = judged(
        Requirement("diet"),
        PersonaMemory(topic="diet", preference="started eating fish again, so pescatarian now"),
        query="Book dinner",
    )
    assert changed.answers
    assert changed.changes
    assert not changed.ceases


# -- trajectories and workspace ---------------------------------------------------------------


def test_a_past_task_choice_is_a_choice_and_its_lesson_a_statement() -> None:
    picked = TrajectoryMemory(
        query="Flight to Rome", trace=["booked BA548", "picked seat 12C (aisle)"]
    )
    (choice,) = judged(Requirement("seat"), picked)
    assert (choice.kind, choice.value) == ("choice", "aisle")
    lesson = TrajectoryMemory(
        query="Book the Oslo trip",
        trace=["booked"],
        insight="she changed the seat to the aisle again",
    )
    (statement,) = judged(Requirement("seat"), lesson)
    assert statement.kind == "statement"
    assert statement.answers


def test_workspace_state_answers_by_its_keys() -> None:
    state = WorkspaceMemory(
        task="web-checkout",
        state={"node": "20.11.1", "package_manager": "pnpm 8.15", "repo": "web-checkout"},
    )
    (manager,) = judged(Requirement("package manager"), state, query="Write the CI workflow")
    assert manager.answers
    assert "pnpm 8.15" in (manager.value or "")
    (version,) = judged(Requirement("Node version"), state, query="Write the CI workflow")
    assert version.answers
    assert "20.11.1" in (version.value or "")
    (nothing,) = judged(Requirement("base branch"), state, query="Open the pull request")
    assert not nothing.answers


def test_strength_does_not_depend_on_the_rest_of_the_bank() -> None:
    seat = PersonaMemory(topic="flight seat", preference="aisle")
    alone = judged(SEAT, seat)
    noise = [PersonaMemory(topic=f"seat cushion {i}", preference="blue") for i in range(300)]
    crowded = judged(SEAT, seat, *noise)
    assert alone[0].strength == crowded[0].strength > 0.5
    assert not any(verdict.answers for verdict in crowded[1:])


# -- dense word matching --------------------------------------------------------------------


class WordVectors:
    """An embedder of single words: synonyms share an axis, everything else its own."""

    name, dim = "words", 8
    AXES: ClassVar[dict[str, int]] = {"diet": 0, "eat": 0, "food": 0, "seat": 1, "chair": 1}

    def __init__(self) -> None:
        self.embedded: list[str] = []

    def embed(self, texts: list[str]) -> np.ndarray:
        self.embedded += texts
        vectors = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            axis = self.AXES.get(text, 2 + sum(map(ord, text)) % (self.dim - 2))
            vectors[i, axis] = 1.0
        return vectors


def test_a_word_matcher_widens_what_counts_as_the_same_word() -> None:
    words = WordVectors()
    matcher = DenseWordMatcher(FunctionEmbedder(words.embed, name="words", dim=8))
    assert matcher.same("diet", "eat")
    assert not matcher.same("diet", "seat")
    assert matcher.same("anything", "anything")
    matcher.same("diet", "food")
    assert sorted(words.embedded) == ["diet", "eat", "food", "seat"]  # each word once
    memory = PersonaMemory(topic="what I eat", preference="no red meat, fish is fine")
    diet = Requirement("diet")
    request = PersonaRequest(user_id="ada", query="Plan dinners", requirements=[diet])
    candidate = ScoredMemory(
        record=MemoryRecord.of(memory, created_at=AT),
        score=0.5,
        search=SearchRequest(layer="persona", query="diet"),
    )
    (plain,) = LexicalJudge().judge(request, {"diet": [candidate]})["diet"]
    (dense,) = LexicalJudge(matcher).judge(request, {"diet": [candidate]})["diet"]
    assert not plain.answers
    assert dense.answers
    assert dense.strength >= 0.5


def test_a_word_matcher_keeps_at_most_max_words_and_checks_its_arguments() -> None:
    words = WordVectors()
    matcher = DenseWordMatcher(FunctionEmbedder(words.embed, name="words", dim=8), max_words=2)
    matcher.same("diet", "eat")
    matcher.same("diet", "seat")  # "eat" was least recently used: it goes
    matcher.same("diet", "eat")
    assert words.embedded == ["diet", "eat", "seat", "eat"]
    assert len(matcher._vectors) == 2
    embedder = FunctionEmbedder(words.embed, name="words", dim=8)
    for bad in ({"threshold": 0.0}, {"threshold": 1.5}, {"max_words": 0}, {"max_words": True}):
        with pytest.raises(ValueError, match="must"):
            DenseWordMatcher(embedder, **bad)
