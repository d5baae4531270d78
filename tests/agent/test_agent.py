"""The PersonaAgent and its default policy: ask exactly when something essential is missing."""

import re
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pydantic import ValidationError

from autopersona_flows import (
    JsonlMemoryStore,
    MemoryRecord,
    PersonaMemory,
    PolicyError,
    SearchRequest,
    TrajectoryMemory,
    WorkspaceMemory,
)
from autopersona_flows.agent import (
    ClarifyDecision,
    EvidencePolicy,
    FinalDecision,
    FunctionPlanner,
    FunctionPolicy,
    NodeInfo,
    PersonaAgent,
    PersonaRequest,
    Requirement,
    RuntimeMetrics,
    parse_decision,
)
from autopersona_flows.errors import BlankAnswerError, MemoryBankError, RetrievalError
from autopersona_flows.memory import MemoryBank, MemoryRetriever, MemoryUpdater, RawTaskRecord

CITATION = Requirement("citation style", options=["APA", "MLA", "Chicago"])
NODE = NodeInfo(id="format-bibliography", instruction="Format the bibliography of the paper")


def request(user: str = "ada", *requirements: Requirement, **fields) -> PersonaRequest:
    return PersonaRequest(
        user_id=user,
        query="Finish my paper on retrieval",
        node=NODE,
        requirements=list(requirements),
        **fields,
    )


@pytest.fixture
def agent(store: JsonlMemoryStore) -> PersonaAgent:
    retriever = MemoryRetriever(store)
    updater = MemoryUpdater(store, retriever=retriever)
    for topic, preference in [
        ("tone", "terse, no preamble"),
        ("summary length", "under 500 words"),
        ("citation manager", "Zotero"),  # a different topic than "citation style"
    ]:
        updater.update("ada", "persona", PersonaMemory(topic=topic, preference=preference))
    return PersonaAgent(retriever, metrics=RuntimeMetrics())


def test_requirements_and_requests_are_validated() -> None:
    assert Requirement("tone").name == "tone"
    for bad in (
        lambda: Requirement(""),
        lambda: Requirement("x", layers=()),
        lambda: Requirement("x", layers=("persona", "persona")),
        lambda: Requirement("x", layers=("episodic",)),
        lambda: Requirement("x", options=["a", "a"]),
        lambda: request("ada", CITATION, CITATION),
        lambda: request("ada", retrieval_top_k=0),
        lambda: request("ada", retrieval_min_similarity=1.5),
        lambda: PersonaRequest(user_id="", query="q"),
        lambda: PersonaRequest(user_id="x\ud800", query="q"),
    ):
        with pytest.raises(ValidationError):
            bad()


def test_missing_preference_asks_one_question_naming_it_the_node_and_the_options(
    agent: PersonaAgent,
) -> None:
    decision = agent.decide(request("ada", CITATION))
    assert isinstance(decision, ClarifyDecision)
    assert decision.requirement == "citation style"
    assert decision.options == ["APA", "MLA", "Chicago"]
    assert decision.question == (
        "To format the bibliography of the paper, which citation style would you like? "
        "APA, MLA or Chicago?"
    )
    assert "format-bibliography" not in decision.question  # a node id means nothing to a person
    # The near miss ("citation manager") was retrieved but did not count as evidence.
    assert any(m.record.content.topic == "citation manager" for m in decision.memories.persona)


def test_a_declared_question_is_asked_verbatim(agent: PersonaAgent) -> None:
    asked = Requirement("citation style", question="APA or MLA for this paper?")
    assert agent.decide(request("ada", asked)).question == "APA or MLA for this paper?"


def test_the_answer_is_learned_and_the_question_never_asked_again(
    agent: PersonaAgent, store: JsonlMemoryStore
) -> None:
    question = agent.decide(request("ada", CITATION))
    learned = agent.learn("ada", question, "  APA ")
    assert learned.operation == "add"
    (memory,) = [m for m in store.list("ada", "persona") if m.content.topic == "citation style"]
    assert memory.content.preference == "APA"
    decision = agent.decide(request("ada", CITATION))
    assert isinstance(decision, FinalDecision)
    (constraint,) = [c for c in decision.constraints if c.requirement == "citation style"]
    assert constraint.text == "citation style: APA"
    assert constraint.memory_id == memory.id
    assert constraint.layer == "persona"
    assert constraint.score >= 0.5
    assert "citation style: APA" in decision.guidance
    # A fresh agent over the same store (another process) knows it too.
    fresh = PersonaAgent(MemoryRetriever(JsonlMemoryStore(store.root)))
    assert fresh.decide(request("ada", CITATION)).action == "final"


def test_a_changed_answer_replaces_the_old_one(agent: PersonaAgent) -> None:
    agent.learn("ada", agent.decide(request("ada", CITATION)), "APA")
    question = ClarifyDecision(question="Which citation style?", requirement="citation style")
    assert agent.learn("ada", question, "MLA").operation == "update"
    (constraint,) = agent.decide(request("ada", CITATION)).constraints[:1]
    assert constraint.text == "citation style: MLA"


def test_learn_rejects_empty_answers_and_non_questions(agent: PersonaAgent) -> None:
    question = agent.decide(request("ada", CITATION))
    held = agent.retriever.store.list("ada", "persona")
    for empty in ("", "   ", None):
        # A typed error naming the question (a ValueError, as before); nothing learned.
        with pytest.raises(BlankAnswerError, match=re.escape(repr(question.question))):
            agent.learn("ada", question, empty)  # type: ignore[arg-type]
    assert agent.retriever.store.list("ada", "persona") == held
    with pytest.raises(PolicyError, match="only a clarification"):
        agent.learn("ada", FinalDecision(guidance="g"), "APA")  # type: ignore[arg-type]


def test_the_newest_of_two_preferences_wins(store: JsonlMemoryStore) -> None:
    old = datetime(2025, 1, 1, tzinfo=UTC)
    # The older one is stored first, so it also ranks first on a tie: only the
    # newest-wins rule can pick MLA.
    for preference, when in (("APA", old), ("MLA", old + timedelta(days=30))):
        record = MemoryRecord.of(
            PersonaMemory(topic="citation style", preference=preference), created_at=when
        )
        store.add("ada", record)  # both kept, as if written without the updater
    decision = PersonaAgent(MemoryRetriever(store)).decide(request("ada", CITATION))
    assert decision.constraints[0].text == "citation style: MLA"


def test_another_users_memory_never_counts(agent: PersonaAgent, store: JsonlMemoryStore) -> None:
    store.add("bob", PersonaMemory(topic="citation style", preference="Chicago"))
    decision = agent.decide(request("ada", CITATION))
    assert decision.action == "clarify"
    assert all(
        m.record.id not in {r.id for r in store.list("bob", "persona")} for m in decision.memories
    )


def test_no_requirements_means_no_question(agent: PersonaAgent) -> None:
    decision = agent.decide(
        PersonaRequest(user_id="ada", query="Write a short note in my usual tone")
    )
    assert isinstance(decision, FinalDecision)
    assert any(c.text == "tone: terse, no preamble" for c in decision.constraints)
    nobody = agent.decide(PersonaRequest(user_id="nobody", query="Write a short note"))
    assert nobody.action == "final"
    assert nobody.constraints == []


def test_optional_requirements_never_ask(agent: PersonaAgent) -> None:
    optional = Requirement("citation style", required=False)
    assert agent.decide(request("ada", optional)).action == "final"


def test_workspace_requirements_use_workspace_state(store: JsonlMemoryStore) -> None:
    store.add("ada", WorkspaceMemory(state={"output folder": "reports/2026"}))
    folder = Requirement("output folder", layers=("workspace",))
    decision = PersonaAgent(MemoryRetriever(store)).decide(request("ada", folder))
    assert decision.action == "final"
    assert decision.constraints[0].layer == "workspace"
    assert "reports/2026" in decision.constraints[0].text


def test_the_first_missing_of_several_requirements_is_asked(agent: PersonaAgent) -> None:
    tone = Requirement("tone")
    decision = agent.decide(request("ada", tone, CITATION, Requirement("font")))
    assert (decision.action, decision.requirement) == ("clarify", "citation style")


def test_earlier_choices_are_offered_when_no_options_are_declared(store: JsonlMemoryStore) -> None:
    # One past task chose a style: not enough to apply it, enough to offer it.
    store.add("ada", TrajectoryMemory(query="Fix the refs", trace=["formatted citations in APA"]))
    decision = PersonaAgent(MemoryRetriever(store)).decide(
        request("ada", Requirement("citation style"))
    )
    assert (decision.action, decision.options) == ("clarify", ["APA"])


def test_a_high_risk_step_can_demand_stronger_evidence(store: JsonlMemoryStore) -> None:
    store.add("ada", PersonaMemory(topic="payment account", preference="the business card"))
    need = Requirement("payment account")
    agent = PersonaAgent(MemoryRetriever(store))
    assert agent.decide(request("ada", need)).action == "final"
    assert agent.decide(request("ada", need, retrieval_min_similarity=1.0)).action == "clarify"


def test_decisions_are_validated(agent: PersonaAgent) -> None:
    for answer, message in (
        ({"action": "Clarify", "question": "which?"}, "action"),
        ({"action": "clarify", "question": "  "}, "must not be empty"),
        ({"action": "final"}, "guidance"),
        ("not json", "invalid decision"),
        (42, "invalid decision"),
    ):
        broken = PersonaAgent(agent.retriever, FunctionPolicy(lambda r, m, a=answer: a))
        with pytest.raises(PolicyError, match=message):
            broken.decide(request("ada", CITATION))
    assert parse_decision('{"action": "final", "guidance": "ok"}') == FinalDecision(guidance="ok")


def test_policy_decisions_get_the_retrieved_memories(agent: PersonaAgent) -> None:
    seen = []

    def policy(req, memories):
        seen.append(memories)
        return {"action": "final", "guidance": "go"}

    decision = PersonaAgent(agent.retriever, FunctionPolicy(policy)).decide(
        request("ada", CITATION)
    )
    # The decision carries what the policy saw, each memory once, as its best find.
    assert decision.memories == seen[0].distinct()
    ids = [memory.record.id for memory in decision.memories]
    assert len(ids) == len(set(ids)) > 0
    assert set(ids) == {memory.record.id for memory in seen[0]}
    for shown in decision.memories:
        assert shown.score == max(m.score for m in seen[0] if m.record.id == shown.record.id)


def test_planner_and_arguments(agent: PersonaAgent) -> None:
    planned = []

    def plan(req):
        planned.append(req)
        return [SearchRequest(layer="persona", query="tone")]

    custom = PersonaAgent(agent.retriever, planner=FunctionPlanner(plan), top_k=1)
    decision = custom.decide(PersonaRequest(user_id="ada", query="anything"))
    assert len(planned) == 1
    assert [m.record.content.topic for m in decision.memories] == ["tone"]
    with pytest.raises(RetrievalError):
        PersonaAgent(agent.retriever, top_k=0)
    with pytest.raises(RetrievalError):
        PersonaAgent(agent.retriever, min_similarity=2.0)
    assert agent.decide({"user_id": "ada", "query": "q"}).action == "final"


def test_metrics_count_and_time_every_decision(agent: PersonaAgent) -> None:
    question = agent.decide(request("ada", CITATION))
    agent.learn("ada", question, "APA")
    agent.decide(request("ada", CITATION))
    with pytest.raises(PolicyError):
        PersonaAgent(
            agent.retriever, FunctionPolicy(lambda r, m: {}), metrics=agent.metrics
        ).decide(request("ada"))
    snapshot = agent.metrics.snapshot()
    assert snapshot["counts"] == {
        "decisions": 2,
        "finals": 1,
        "clarifications": 1,
        "learned_answers": 1,
        "policy_errors": 1,
    }
    assert snapshot["timings"]["retrieval"]["count"] == 2
    assert snapshot["timings"]["policy"]["max_s"] >= 0


def test_metrics_are_thread_safe() -> None:
    metrics = RuntimeMetrics()

    def work() -> None:
        for _ in range(2000):
            metrics.count("decisions")
            metrics.time("policy", 0.001)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    snapshot = metrics.snapshot()
    assert snapshot["counts"]["decisions"] == 16000
    assert snapshot["timings"]["policy"]["count"] == 16000


def test_requests_round_trip_through_json() -> None:
    original = request(
        "ada", Requirement("output folder", layers=("workspace",), options=["a", "b"]), CITATION
    )
    assert PersonaRequest.model_validate_json(original.model_dump_json()) == original
    assert PersonaRequest.model_validate(original.model_dump(mode="json")) == original


def test_a_learned_answer_is_not_asked_again_when_the_requirement_has_a_description(
    agent: PersonaAgent,
) -> None:
    described = Requirement(
        "citation style", description="how references and in-text citations are formatted"
    )
    question = agent.decide(request("ada", described))
    agent.learn("ada", question, "APA")
    assert agent.decide(request("ada", described)).action == "final"


def test_one_requirement_never_takes_another_requirements_evidence(store: JsonlMemoryStore) -> None:
    store.add("eve", PersonaMemory(topic="email tone", preference="warm but brief"))
    store.add("eve", PersonaMemory(topic="email sign-off", preference="Best, Eve"))
    both = [Requirement("email tone"), Requirement("email sign-off")]
    decision = PersonaAgent(MemoryRetriever(store)).decide(request("eve", *both))
    assert decision.action == "final"
    assert [c.requirement for c in decision.constraints[:2]] == ["email tone", "email sign-off"]


def test_evidence_is_not_repeated_as_guidance(store: JsonlMemoryStore) -> None:
    old = datetime(2025, 1, 1, tzinfo=UTC)
    for preference, when in (("APA", old), ("MLA", old + timedelta(days=1))):
        store.add(
            "ada",
            MemoryRecord.of(
                PersonaMemory(topic="citation style", preference=preference), created_at=when
            ),
        )
    decision = PersonaAgent(MemoryRetriever(store)).decide(request("ada", CITATION))
    ids = [c.memory_id for c in decision.constraints]
    assert len(ids) == len(set(ids))


def test_any_user_id_the_store_accepts_is_a_valid_request(store: JsonlMemoryStore) -> None:
    store.add(" ", PersonaMemory(topic="citation style", preference="APA"))
    decision = PersonaAgent(MemoryRetriever(store)).decide(request(" ", CITATION))
    assert decision.action == "final"
    with pytest.raises(ValueError, match="max_guidance"):
        EvidencePolicy(max_guidance=-1)


# --- built from a MemoryBank ---------------------------------------------------------------------


def test_an_agent_over_a_bank_from_a_path_decides_learns_and_ingests_through_it(
    store_root: Path,
) -> None:
    bank = MemoryBank(str(store_root))
    bank.update("ada", "persona", PersonaMemory(topic="tone", preference="terse, no preamble"))
    agent = PersonaAgent(bank)
    assert agent.bank is bank
    assert (agent.retriever, agent.updater) == (bank.retriever, bank.updater)

    question = agent.decide(request("ada", CITATION))
    assert isinstance(question, ClarifyDecision)
    assert agent.learn("ada", question, "APA").operation == "add"
    decision = agent.decide(request("ada", CITATION))
    assert isinstance(decision, FinalDecision)
    assert "citation style: APA" in decision.guidance
    (learned,) = bank.retrieve(
        "ada", [SearchRequest(layer="persona", query="citation style")], top_k=1
    )
    assert learned.record.id == decision.constraints[0].memory_id

    task = RawTaskRecord(
        user_id="ada",
        query="Format the bibliography",
        persona=[PersonaMemory(topic="citation style", preference="Chicago")],
    )
    result = bank.ingest(task)
    assert result.counts() == {"trajectory:add": 1, "persona:update": 1}
    (constraint,) = agent.decide(request("ada", CITATION)).constraints[:1]
    assert constraint.text == "citation style: Chicago"


def test_the_old_wiring_gets_a_bank_of_its_own_parts(store: JsonlMemoryStore) -> None:
    retriever = MemoryRetriever(store)
    updater = MemoryUpdater(store, retriever=retriever)
    agent = PersonaAgent(retriever, updater=updater)
    assert (agent.retriever, agent.updater) == (retriever, updater)
    assert (agent.bank.store, agent.bank.retriever, agent.bank.updater) == (
        store,
        retriever,
        updater,
    )
    alone = PersonaAgent(retriever)
    assert alone.updater.retriever is retriever
    assert alone.bank.retriever is retriever


def test_a_bank_brings_its_own_updater(store: JsonlMemoryStore) -> None:
    bank = MemoryBank(store)
    with pytest.raises(MemoryBankError, match="brings its updater"):
        PersonaAgent(bank, updater=MemoryUpdater(store, retriever=bank.retriever))
