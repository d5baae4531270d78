"""EvidencePolicy: which answer is current, when to ask, and what guidance a node gets."""

import subprocess
import sys
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from autopersona_flows import (
    JsonlMemoryStore,
    MemoryRecord,
    PersonaMemory,
    PolicyError,
    TrajectoryMemory,
)
from autopersona_flows.agent import (
    ClarifyDecision,
    EvidencePolicy,
    FinalDecision,
    NodeInfo,
    PersonaAgent,
    PersonaRequest,
    Requirement,
)
from autopersona_flows.agent.evaluation import noise_memories
from autopersona_flows.memory import MemoryRetriever
from autopersona_flows.memory.records import LayerContent
from autopersona_flows.memory.updates import embed_records

START = datetime(2023, 1, 1, tzinfo=UTC)


def remember(store: JsonlMemoryStore, user: str, *contents: LayerContent) -> None:
    """Store ``contents`` as said a month apart, oldest first."""
    for i, content in enumerate(contents):
        when = START + timedelta(days=30 * i)
        store.add(user, MemoryRecord.of(content, created_at=when, updated_at=when))


def ask(
    store: JsonlMemoryStore,
    *requirements: Requirement,
    query: str = "Book me a flight to Rome",
    instruction: str = "Choose the flight and the seat",
    policy: EvidencePolicy | None = None,
) -> FinalDecision | ClarifyDecision:
    request = PersonaRequest(
        user_id="ada",
        query=query,
        node=NodeInfo(id="book", instruction=instruction),
        requirements=list(requirements),
    )
    return PersonaAgent(MemoryRetriever(store), policy).decide(request)


def value_of(decision: FinalDecision | ClarifyDecision, requirement: str) -> str:
    assert isinstance(decision, FinalDecision), decision
    (constraint,) = [c for c in decision.constraints if c.requirement == requirement]
    return constraint.text


SEAT = Requirement("seat")


def test_the_later_of_two_equally_clear_answers_is_current(store: JsonlMemoryStore) -> None:
    remember(
        store,
        "ada",
        PersonaMemory(topic="flight seat", preference="window"),
        PersonaMemory(topic="seat on flights", preference="aisle these days"),
    )
    assert "aisle" in value_of(ask(store, SEAT), "seat")


def test_a_later_change_replaces_a_clearer_older_answer(store: JsonlMemoryStore) -> None:
    diet = Requirement("diet")
    remember(
        store,
        "ada",
        PersonaMemory(topic="diet", preference="vegetarian"),
        PersonaMemory(topic="food", preference="started on fish again, my diet is pescatarian now"),
    )
    text = value_of(ask(store, diet, query="Book dinner", instruction="Find a restaurant"), "diet")
    assert "pescatarian" in text
    assert "vegetarian" not in text


def test_a_weaker_later_mention_does_not_replace_a_clear_answer(store: JsonlMemoryStore) -> None:
    remember(
        store,
        "ada",
        PersonaMemory(topic="flight seat", preference="aisle"),
        PersonaMemory(topic="travel", preference="the seat on my last flight had no legroom"),
    )
    assert value_of(ask(store, SEAT), "seat") == "flight seat: aisle"


def test_choices_repeated_in_past_tasks_answer_and_one_alone_does_not(
    store: JsonlMemoryStore,
) -> None:
    one = TrajectoryMemory(
        query="Flight to Oslo", trace=["booked SK100", "picked seat 14C (aisle)"]
    )
    remember(store, "ada", one)
    single = ask(store, SEAT)
    assert isinstance(single, ClarifyDecision)
    assert single.options == ["aisle"]  # offered, not applied
    remember(store, "bea", one, TrajectoryMemory(query="Flight to Nice", trace=["aisle seat 22D"]))
    decision = PersonaAgent(MemoryRetriever(store)).decide(
        PersonaRequest(user_id="bea", query="Book me a flight to Rome", requirements=[SEAT])
    )
    (constraint,) = [c for c in decision.constraints if c.requirement == "seat"]
    assert constraint.value == "aisle"
    assert len(constraint.evidence) == 2  # both past tasks, the newest first
    assert constraint.reason == "chosen in 2 past tasks"


def test_a_later_habit_replaces_an_older_statement(store: JsonlMemoryStore) -> None:
    remember(
        store,
        "ada",
        PersonaMemory(topic="flights", preference="window seat, I sleep against the wall"),
        TrajectoryMemory(query="Flight to Rome", trace=["picked seat 12C (aisle)"]),
        TrajectoryMemory(query="Flight to Copenhagen", trace=["picked seat 18D (aisle)"]),
    )
    decision = ask(store, SEAT)
    assert "aisle" in value_of(decision, "seat")
    # The superseded preference is no guidance either: the tool sees one current seat.
    assert all("window" not in c.text for c in decision.constraints)


def test_a_preference_that_stopped_holding_is_asked_about_again(store: JsonlMemoryStore) -> None:
    remember(
        store,
        "ada",
        PersonaMemory(topic="gym schedule", preference="Tue/Thu 6pm at PureGym"),
        PersonaMemory(topic="fitness", preference="I don't do the gym schedule anymore"),
    )
    decision = ask(store, Requirement("gym schedule"), query="Plan my week", instruction="Plan it")
    assert isinstance(decision, ClarifyDecision)
    assert decision.requirement == "gym schedule"


def test_a_standing_constraint_reaches_related_work_only(store: JsonlMemoryStore) -> None:
    remember(
        store,
        "ada",
        PersonaMemory(topic="health", preference="severe peanut allergy, carries an EpiPen"),
    )
    grocery = ask(store, query="Order groceries for the week", instruction="Fill the basket")
    assert isinstance(grocery, FinalDecision)
    assert any("peanut" in c.text for c in grocery.constraints)
    assert "peanut" in grocery.guidance
    (standing,) = grocery.constraints
    assert standing.requirement is None
    assert standing.reason.startswith("a standing constraint")
    references = ask(store, query="Format my bibliography", instruction="Format the references")
    assert not any("peanut" in c.text for c in references.constraints)


def test_guidance_drops_what_a_later_change_replaced_and_keeps_what_still_holds(
    store: JsonlMemoryStore,
) -> None:
    remember(
        store,
        "ada",
        PersonaMemory(topic="Pip (dog)", preference="check every treat label for xylitol"),
        PersonaMemory(topic="Pip (dog)", preference="he eats grain-free food now"),
        PersonaMemory(topic="dinner", preference="vegetarian dinners"),
        PersonaMemory(topic="dinner", preference="no longer vegetarian, fish is fine now"),
    )
    dog = ask(store, query="Order treats for Pip the dog", instruction="Choose Pip's treats")
    assert isinstance(dog, FinalDecision)
    shown = " ".join(c.text for c in dog.constraints)
    assert "xylitol" in shown  # a change on the topic, about something else: both hold
    assert "grain-free" in shown
    dinner = ask(store, query="Plan dinner for Friday", instruction="Pick the dinner recipe")
    assert isinstance(dinner, FinalDecision)
    shown = " ".join(c.text for c in dinner.constraints)
    assert "fish is fine" in shown
    assert "vegetarian dinners" not in shown  # replaced by the announced change


def test_an_answer_given_at_one_node_guides_only_nodes_whose_own_work_it_concerns(
    store: JsonlMemoryStore,
) -> None:
    query = "Summarise the retrieval papers and share them"  # every node's request
    agent = PersonaAgent(MemoryRetriever(store))

    def decide(node: str, instruction: str, *requirements: Requirement) -> PersonaRequest:
        return PersonaRequest(
            user_id="ada",
            query=query,
            node=NodeInfo(id=node, instruction=instruction),
            requirements=list(requirements),
        )

    channel = Requirement("sharing channel")
    asked = agent.decide(decide("share", "Share the summary with the group", channel))
    assert isinstance(asked, ClarifyDecision)
    agent.learn("ada", asked, "email the reading group")

    def shown(request: PersonaRequest) -> str:
        decision = agent.decide(request)
        assert isinstance(decision, FinalDecision)
        return " ".join(c.text for c in decision.constraints)

    assert "reading group" in shown(decide("share", "Share the summary with the group", channel))
    # "share them" in the request is no reason: drafting is not sharing.
    assert "reading group" not in shown(decide("draft", "Draft the summary"))
    assert "reading group" not in shown(decide("gather_sources", "Find the papers"))
    # A node whose own work is sharing is guided by it, asked there or not.
    assert "reading group" in shown(decide("post_notes", "Share the notes on the wiki"))
    # What the person said themselves still reaches any node whose request it concerns.
    remember(store, "ada", PersonaMemory(topic="retrieval papers", preference="cite arXiv"))
    assert "cite arXiv" in shown(decide("draft", "Draft the summary"))


def test_a_standing_constraint_is_shown_even_when_a_later_change_shares_its_topic(
    store: JsonlMemoryStore,
) -> None:
    remember(
        store,
        "ada",
        PersonaMemory(topic="allergies", preference="peanut allergy, carries an EpiPen"),
        PersonaMemory(topic="allergies", preference="carries an EpiPen now for shellfish too"),
    )
    grocery = ask(store, query="Order groceries for the week", instruction="Fill the basket")
    assert isinstance(grocery, FinalDecision)
    shown = " ".join(c.text for c in grocery.constraints)
    assert "peanut" in shown  # a stale allergy shown costs less than a live one dropped
    assert "shellfish" in shown


def test_a_topic_answer_must_be_one_of_the_declared_options(store: JsonlMemoryStore) -> None:
    remember(store, "ada", PersonaMemory(topic="citation style", preference="Chicago"))
    style = Requirement("citation style", options=["APA", "MLA"])
    decision = ask(store, style, query="Format my references", instruction="Format them")
    assert isinstance(decision, ClarifyDecision)  # Chicago is not on offer: ask, with the choices
    assert decision.options == ["APA", "MLA"]
    remember(store, "bob", PersonaMemory(topic="citation style", preference="APA, 7th edition"))
    request = PersonaRequest(user_id="bob", query="Format my references", requirements=[style])
    answered = PersonaAgent(MemoryRetriever(store)).decide(request)
    assert isinstance(answered, FinalDecision)
    assert answered.constraints[0].value == "APA"


def test_an_answer_whose_topic_says_it_no_longer_holds_is_asked_again(
    store: JsonlMemoryStore,
) -> None:
    remember(
        store,
        "ada",
        PersonaMemory(topic="to-do app", preference="Todoist, project 'Home'"),
        PersonaMemory(topic="apps", preference="deleted Todoist, not using any to-do app now"),
    )
    app = Requirement("task app", options=["Todoist", "Apple Reminders", "Google Tasks"])
    decision = ask(store, app, query="Add a task to my list", instruction="Create the task")
    assert isinstance(decision, ClarifyDecision)
    assert decision.requirement == "task app"


def test_a_standing_constraint_is_found_in_any_bank_at_any_similarity(
    store: JsonlMemoryStore,
) -> None:
    remember(store, "ada", PersonaMemory(topic="health", preference="severe peanut allergy"))
    noise = noise_memories(["groceries", "order", "basket", "week"], 300, seed=3)
    for record in noise:
        remember(store, "ada", record.content)
    request = PersonaRequest(
        user_id="ada",
        query="Order groceries for the week",
        node=NodeInfo(id="basket", instruction="Fill the basket"),
        retrieval_min_similarity=0.99,  # nothing resembles the request this closely
    )
    decision = PersonaAgent(MemoryRetriever(store)).decide(request)
    assert isinstance(decision, FinalDecision)
    assert any("peanut" in c.text for c in decision.constraints)


def test_evidence_records_why_and_from_what(store: JsonlMemoryStore) -> None:
    remember(
        store,
        "ada",
        PersonaMemory(topic="seat", preference="aisle", strategy="row 10 or further back"),
    )
    (constraint,) = [c for c in ask(store, SEAT).constraints if c.requirement]
    assert constraint.text == "seat: aisle (row 10 or further back)"
    assert constraint.value == "aisle"
    assert constraint.evidence == [constraint.memory_id]
    assert "names the requirement" in constraint.reason
    assert constraint.score == 1.0


def test_a_bank_full_of_memories_sharing_words_changes_nothing(
    store: JsonlMemoryStore, tmp_path
) -> None:
    seat = PersonaMemory(topic="flight seat", preference="aisle")
    remember(store, "ada", seat)
    quiet = ask(store, SEAT)
    noisy = JsonlMemoryStore(tmp_path / "noisy")
    remember(noisy, "ada", seat)
    noise = noise_memories(["seat", "flight", "Rome"], 400, seed=1, avoid=["seat"])
    for layer in ("trajectory", "workspace", "persona"):
        batch = [r for r in noise if r.layer == layer]
        embedded = embed_records(MemoryRetriever(noisy).embedder, [r.content for r in batch])
        noisy.add_many(
            "ada",
            layer,
            [
                r.model_copy(update={"embedding": e.embedding})
                for r, e in zip(batch, embedded, strict=True)
            ],
        )
    crowded = ask(noisy, SEAT)
    assert value_of(quiet, "seat") == value_of(crowded, "seat") == "flight seat: aisle"
    (a,) = [c for c in quiet.constraints if c.requirement]
    (b,) = [c for c in crowded.constraints if c.requirement]
    assert a.score == b.score  # the threshold means the same in any bank
    missing = ask(noisy, Requirement("meal request"))
    assert isinstance(missing, ClarifyDecision)  # 400 near misses answer nothing


class _Judge:
    def __init__(self, answer: object) -> None:
        self.answer = answer
        self.calls = 0

    def judge(self, request: object, candidates: object) -> object:
        self.calls += 1
        return self.answer(candidates) if callable(self.answer) else self.answer


def test_a_judge_is_held_to_its_contract(store: JsonlMemoryStore) -> None:
    remember(store, "ada", PersonaMemory(topic="seat", preference="aisle"))
    stray = _Judge({"seat": [{"memory_id": "01J0000000000000000000000Z", "answers": True}]})
    with pytest.raises(PolicyError, match="not among its candidates"):
        ask(store, SEAT, policy=EvidencePolicy(judge=stray))
    for nonsense in (42, {"seat": [{"memory_id": 3}]}, {"seat": [{"answers": "maybe"}]}):
        with pytest.raises(PolicyError, match="invalid verdicts"):
            ask(store, SEAT, policy=EvidencePolicy(judge=_Judge(nonsense)))


def test_a_judge_that_breaks_is_told_apart_from_one_that_answers_nonsense(
    store: JsonlMemoryStore,
) -> None:
    remember(store, "ada", PersonaMemory(topic="seat", preference="aisle"))

    def broken(candidates: object) -> object:
        raise KeyError("seat")

    with pytest.raises(PolicyError, match="raised KeyError") as caught:
        ask(store, SEAT, policy=EvidencePolicy(judge=_Judge(broken)))
    assert isinstance(caught.value.__cause__, KeyError)

    def unreachable(candidates: object) -> object:
        raise ConnectionRefusedError("the judge's server is down")

    with pytest.raises(ConnectionRefusedError):  # left as it is: a task may retry it
        ask(store, SEAT, policy=EvidencePolicy(judge=_Judge(unreachable)))

    def slow(candidates: object) -> object:
        raise httpx.ReadTimeout("the judge's server did not answer")  # not an OSError

    with pytest.raises(httpx.ReadTimeout):
        ask(store, SEAT, policy=EvidencePolicy(judge=_Judge(slow)))


def test_the_default_tier_loads_no_http_client() -> None:
    # httpx is the LLM tier's; EvidencePolicy tells its errors apart without importing it.
    code = (
        "import sys\n"
        "from autopersona_flows.agent import EvidencePolicy, LexicalJudge, PersonaAgent\n"
        "print('httpx' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_later_answers_within_the_margin_do_not_drift_away_from_the_clearest(
    store: JsonlMemoryStore,
) -> None:
    # 1.0, then 0.9 (within the margin of 0.1: it replaces), then 0.8: within the
    # margin of 0.9 but not of the clearest; compared step by step it would win.
    # Three topics, three slots: a later value on the same topic would replace them all.
    strengths = {"aisle": 1.0, "window": 0.9, "middle": 0.8}
    topics = {"aisle": "seat", "window": "flight seat", "middle": "seat on planes"}
    remember(
        store,
        "ada",
        *(PersonaMemory(topic=topics[value], preference=value) for value in strengths),
    )

    def verdicts(candidates: dict) -> dict:
        return {
            name: [
                {
                    "memory_id": m.record.id,
                    "answers": True,
                    "strength": strengths[m.record.content.preference],
                    "value": m.record.content.preference,
                }
                for m in memories
            ]
            for name, memories in candidates.items()
        }

    decision = ask(store, SEAT, policy=EvidencePolicy(margin=0.1, judge=_Judge(verdicts)))
    assert isinstance(decision, FinalDecision)
    (constraint,) = [c for c in decision.constraints if c.requirement]
    assert constraint.value == "window"


def test_no_judge_is_asked_when_nothing_was_recalled(store: JsonlMemoryStore) -> None:
    judge = _Judge({})
    decision = ask(store, SEAT, policy=EvidencePolicy(judge=judge))
    assert isinstance(decision, ClarifyDecision)
    assert judge.calls == 0


def test_policy_arguments_are_checked() -> None:
    for bad in ({"threshold": 1.5}, {"margin": -0.1}, {"threshold": True}, {"max_guidance": -1}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            EvidencePolicy(**bad)
