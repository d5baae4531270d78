"""The judgement benchmark: reading cases, the committed set, the metrics, noise, the CLI."""

from __future__ import annotations

import subprocess
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest

from autopersona_flows import JsonlMemoryStore
from autopersona_flows.agent import (
    ClarifyDecision,
    Constraint,
    FinalDecision,
    FunctionPolicy,
    PersonaAgent,
    PersonaRequest,
)
from autopersona_flows.agent.evaluation import (
    CATEGORIES,
    JudgementCase,
    JudgementReport,
    cases_kind,
    evaluate_judgement,
    noise_memories,
    read_judgement_cases,
)
from autopersona_flows.errors import EvaluationError
from autopersona_flows.memory import MemoryRetriever
from autopersona_flows.memory.protocol import MemoryStore
from autopersona_flows.memory.records import LAYERS
from autopersona_flows.memory.retrieval import MemoryBundle

DATA = Path(__file__).resolve().parent.parent / "data"
CASES = DATA / "judgement" / "cases.jsonl"
CLARIFICATION_CASES = DATA / "clarification" / "cases.jsonl"

RunCli = Callable[..., subprocess.CompletedProcess[str]]
AgentFactory = Callable[[MemoryStore], PersonaAgent]

# -- builders ----------------------------------------------------------------------------

SEAT = {"name": "seat preference", "options": ["aisle", "window"]}


def _raw(name: str, **fields: Any) -> dict[str, Any]:
    """A case as JSON data: ada books a seat, and a final with no checks is expected."""
    case: dict[str, Any] = {
        "name": name,
        "category": "paraphrase",
        "request": {
            "user_id": "ada",
            "query": name,
            "node": {"id": "choose-seat", "instruction": "Pick a seat on the flight"},
            "requirements": [SEAT],
        },
        "expect": {"action": "final"},
    }
    return case | fields


def _case(name: str, **fields: Any) -> JudgementCase:
    """`_raw` as a case (as the reader validates a line: Python mode, strict)."""
    return JudgementCase.model_validate(_raw(name, **fields))


def _memory(topic: str, preference: str, **fields: Any) -> dict[str, Any]:
    return {
        "layer": "persona",
        "content": {"topic": topic, "preference": preference},
        "at": "2025-03-02T09:00:00Z",
    } | fields


def _constraint(requirement: str | None, text: str, value: str | None = None) -> Constraint:
    return Constraint(
        text=text,
        requirement=requirement,
        value=value,
        memory_id="01J0000000000000000000000A",
        layer="persona",
        score=0.9,
    )


def _ask(request: PersonaRequest) -> ClarifyDecision:
    requirement = request.requirements[0].name if request.requirements else None
    return ClarifyDecision(question="Which one?", requirement=requirement)


def _with_policy(decide: Callable[[PersonaRequest, MemoryBundle], object]) -> AgentFactory:
    """An agent factory: the default retriever and planner, ``decide`` as the policy."""
    return lambda store: PersonaAgent(MemoryRetriever(store), FunctionPolicy(decide))


def _scripted(script: dict[str, Any]) -> AgentFactory:
    """An agent factory whose policy answers each request by its query from ``script``.

    A value is a decision, an exception to raise, or ``"ask"`` for a question about
    the request's first requirement.
    """

    def decide(request: PersonaRequest, memories: MemoryBundle) -> object:
        answer = script[request.query]
        if isinstance(answer, Exception):
            raise answer
        return _ask(request) if answer == "ask" else answer

    return _with_policy(decide)


_always_ask = _with_policy(lambda request, memories: _ask(request))


def _final(*constraints: Constraint) -> FinalDecision:
    return FinalDecision(guidance="go ahead", constraints=list(constraints))


# -- reading a benchmark file ------------------------------------------------------------


def _write(path: Path, *lines: dict[str, Any] | bytes) -> Path:
    path.write_bytes(
        b"".join(
            (line if isinstance(line, bytes) else orjson.dumps(line)) + b"\n" for line in lines
        )
    )
    return path


def test_a_valid_file_loads(tmp_path: Path) -> None:
    ask = _raw(
        "ask",
        category="missing",
        expect={"action": "clarify", "requirement": "seat preference", "options": ["aisle"]},
    )
    path = _write(
        tmp_path / "cases.jsonl",
        _raw("answer", memories=[_memory("flight seat", "aisle")], group="seats"),
        b"",  # blank lines are skipped
        ask,
    )
    first, second = read_judgement_cases(str(path))
    assert (first.name, first.category, first.group) == ("answer", "paraphrase", "seats")
    assert first.memories[0].at == datetime(2025, 3, 2, 9, tzinfo=UTC)
    assert first.request.requirements[0].options == ["aisle", "window"]
    assert (second.expect.action, second.expect.requirement) == ("clarify", "seat preference")


def test_requirement_layers_may_be_a_json_array(tmp_path: Path) -> None:
    persona_only = {**SEAT, "layers": ["persona"]}
    follow_up = {
        "request": {
            "user_id": "ada",
            "query": "again",
            "requirements": [{"name": "where to sit", "layers": ["persona", "trajectory"]}],
        },
        "value": "aisle",
    }
    line = _raw(
        "layers",
        category="learn",
        request={"user_id": "ada", "query": "q", "requirements": [persona_only]},
        expect={"action": "clarify", "requirement": "seat preference"},
        learn={"answer": "aisle", "then": [follow_up]},
    )
    (case,) = read_judgement_cases(str(_write(tmp_path / "cases.jsonl", line)))
    assert case.request.requirements[0].layers == ("persona",)
    assert case.learn is not None
    assert case.learn.then[0].request.requirements[0].layers == ("persona", "trajectory")


CLARIFY = {"action": "clarify", "requirement": "seat preference"}
AGAIN = {"request": {"user_id": "ada", "query": "again"}, "value": "aisle"}


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b'{"name": "x", "category": ', "not valid JSON"),
        (_raw("x", category="vibes"), r"invalid case: category: Input should be 'paraphrase'"),
        (
            _raw("x", expect={**CLARIFY, "values": {"seat preference": "aisle"}}),
            "invalid case: .*a clarification applies nothing: values",
        ),
        (
            _raw("x", expect={"action": "final", "requirement": "seat preference"}),
            "invalid case: .*requirement and options are what a clarification asks about",
        ),
        (
            _raw("x", expect={"action": "final", "values": {"meal": "vegan"}}),
            r"invalid case: .*values or stale name requirements the request lacks: \['meal'\]",
        ),
        (
            _raw("x", learn={"answer": "aisle", "then": [AGAIN]}),
            "invalid case: .*a learn loop starts with a clarification: expect.action must be",
        ),
        (_raw("x", expect={"action": "final", "extra": 1}), "invalid case: expect.extra"),
    ],
    ids=[
        "json",
        "category",
        "clarify-values",
        "final-requirement",
        "values",
        "final-learn",
        "extra",
    ],
)
def test_a_malformed_line_names_the_file_the_line_and_the_field(
    tmp_path: Path, line: dict[str, Any] | bytes, message: str
) -> None:
    path = _write(tmp_path / "cases.jsonl", _raw("good"), line)
    with pytest.raises(EvaluationError, match=f"cases.jsonl:2: {message}"):
        read_judgement_cases(str(path))


def test_duplicate_names_and_an_empty_file_are_refused(tmp_path: Path) -> None:
    path = _write(tmp_path / "cases.jsonl", _raw("twice"), _raw("other"), _raw("twice"))
    with pytest.raises(
        EvaluationError, match=r"cases.jsonl:3: case 'twice' was already defined on line 1"
    ):
        read_judgement_cases(str(path))
    (tmp_path / "empty.jsonl").write_bytes(b"\n  \n")
    with pytest.raises(EvaluationError, match=r"empty.jsonl holds no case"):
        read_judgement_cases(str(tmp_path / "empty.jsonl"))
    with pytest.raises(EvaluationError, match=r"cannot read .*missing\.jsonl"):
        read_judgement_cases(str(tmp_path / "missing.jsonl"))


# -- the committed benchmark -------------------------------------------------------------


@pytest.fixture(scope="module")
def committed() -> list[JudgementCase]:
    return read_judgement_cases(str(CASES))


def test_the_committed_benchmark_is_large_and_covers_every_category(
    committed: list[JudgementCase],
) -> None:
    assert len(committed) >= 150
    per_category = Counter(case.category for case in committed)
    assert set(per_category) == set(CATEGORIES)
    assert min(per_category.values()) >= 8, per_category
    assert len({case.name for case in committed}) == len(committed)


def test_learn_follow_ups_name_the_need_in_other_words(committed: list[JudgementCase]) -> None:
    learn = [case for case in committed if case.learn is not None]
    assert len(learn) >= 8
    for case in learn:
        assert case.learn is not None
        asked = case.expect.requirement or case.request.requirements[0].name
        for follow_up in case.learn.then:
            names = {r.name for r in follow_up.request.requirements}
            assert names, case.name
            assert asked not in names, case.name


def test_consistency_groups_have_several_members(committed: list[JudgementCase]) -> None:
    groups = Counter(case.group for case in committed if case.group is not None)
    assert groups
    assert min(groups.values()) >= 2, groups


# -- the metrics, on hand-made cases -----------------------------------------------------


def test_the_unnecessary_question_rate_counts_questions_on_final_cases() -> None:
    cases = [
        _case("f1"),
        _case("f2"),
        _case("f3"),
        _case("c1", category="missing", expect=CLARIFY),
    ]
    script = {"f1": "ask", "f2": _final(), "f3": _final(), "c1": "ask"}
    report = evaluate_judgement(cases, _scripted(script))
    assert report.overall.unnecessary_question_rate == pytest.approx(1 / 3)
    assert report.overall.decision_accuracy == pytest.approx(3 / 4)
    assert report.overall.clarification_precision == pytest.approx(1 / 2)
    assert report.overall.clarification_recall == 1.0
    assert report.categories["missing"].unnecessary_question_rate is None  # no final case
    eager = evaluate_judgement(cases, _always_ask)
    assert eager.overall.unnecessary_question_rate == 1.0


def _learn_case(name: str) -> JudgementCase:
    def follow_up(requirement: str, node: str) -> dict[str, Any]:
        request = {
            "user_id": "ada",
            "query": "Book me a flight to Oslo next Monday",
            "node": {"id": node, "instruction": "Pick a seat on the flight"},
            "requirements": [{"name": requirement}],
        }
        return {"request": request, "value": "aisle"}

    return _case(
        name,
        category="learn",
        request={
            "user_id": "ada",
            "query": "Book me a flight to Oslo next Monday",
            "node": {"id": "choose-seat", "instruction": "Pick a seat on the flight"},
            "requirements": [SEAT],
        },
        expect={**CLARIFY, "options": ["aisle", "window"]},
        learn={
            "answer": "aisle please",
            "then": [
                follow_up("where to sit", "choose-seat"),
                follow_up("seat type", "choose-seat"),
            ],
        },
    )


def test_a_policy_that_always_asks_repeats_every_follow_up() -> None:
    report = evaluate_judgement([_learn_case("learn")], _always_ask)
    result = report.result("learn")
    assert (result.action, result.follow_ups, result.repeated) == ("clarify", 2, 2)
    assert result.follow_ups_carried == 0
    assert not result.correct
    assert report.overall.repeat_question_rate == 1.0


def test_a_follow_up_answered_without_the_learned_value_is_not_carried() -> None:
    def decide(request: PersonaRequest, memories: MemoryBundle) -> object:
        (requirement,) = request.requirements
        if requirement.name == "seat preference":
            return _ask(request)
        return _final(_constraint(requirement.name, "window, as usual", value="window"))

    result = evaluate_judgement([_learn_case("learn")], _with_policy(decide)).result("learn")
    assert (result.follow_ups, result.repeated, result.follow_ups_carried) == (2, 0, 0)
    assert not result.correct


def test_a_question_is_judged_by_its_requirement_and_options() -> None:
    expect = {**CLARIFY, "options": ["aisle", "window"]}
    cases = [_case(name, category="missing", expect=expect) for name in ("right", "bare", "off")]
    script = {
        "right": ClarifyDecision(
            question="Aisle or window?", requirement="seat preference", options=["Window", "AISLE"]
        ),
        "bare": "ask",  # the right requirement, no options
        "off": ClarifyDecision(
            question="Any meal?", requirement="meal", options=["aisle", "window"]
        ),
    }
    report = evaluate_judgement(cases, _scripted(script))
    checks = {r.name: (r.requirement_correct, r.options_offered, r.correct) for r in report.results}
    assert checks == {
        "right": (True, True, True),
        "bare": (True, False, False),
        "off": (False, True, False),
    }
    assert report.overall.decision_accuracy == 1.0
    assert report.overall.accuracy == pytest.approx(1 / 3)


def test_the_default_agent_asks_once_then_applies_what_it_learned() -> None:
    report = evaluate_judgement([_learn_case("learn")])
    result = report.result("learn")
    assert (result.action, result.requirement_correct, result.options_offered) == (
        "clarify",
        True,
        True,
    )
    assert (result.follow_ups, result.repeated, result.follow_ups_carried) == (2, 0, 2)
    assert result.correct
    assert report.overall.repeat_question_rate == 0.0


def test_no_follow_ups_leaves_the_repeat_rate_undefined() -> None:
    report = evaluate_judgement([_case("f")], _always_ask)
    assert report.overall.repeat_question_rate is None


def test_adherence_counts_finals_carrying_every_value_and_no_stale_one() -> None:
    seat = "seat preference"
    values = {"action": "final", "values": {seat: "aisle"}}
    with_stale = {**values, "stale": {seat: ["window"]}}
    cases = [
        _case("text", expect=values),  # carried in the text, whatever the case
        _case("value", expect=values),  # carried in the value only
        _case("stale", expect=with_stale),  # carries the stale value too
        _case("other", expect=values),  # the value, under another requirement
        _case("asked", expect=values),  # a question: no constraint to judge
        _case("plain"),  # nothing expected: not counted
    ]
    script = {
        "text": _final(_constraint(seat, "Seat preference: AISLE, near the front")),
        "value": _final(_constraint(seat, "as last time", value="Aisle")),
        "stale": _final(_constraint(seat, "aisle or window")),
        "other": _final(_constraint("meal", "aisle"), _constraint(None, "aisle")),
        "asked": "ask",
        "plain": _final(_constraint(seat, "window")),
    }
    report = evaluate_judgement(cases, _scripted(script))
    assert report.overall.adherence == pytest.approx(2 / 4)
    assert [report.result(n).values_carried for n in ("text", "value", "stale", "other")] == [
        True,
        True,
        True,
        False,
    ]
    assert report.result("stale").stale_avoided is False
    assert report.result("text").stale_avoided is None  # nothing stale expected
    assert report.result("asked").values_carried is None
    assert [r.name for r in report.results if r.correct] == ["text", "value", "plain"]


def test_near_miss_acceptance_counts_near_miss_cases_answered() -> None:
    near = {"category": "near_miss", "expect": CLARIFY}
    cases = [_case("n1", **near), _case("n2", **near), _case("n3", **near), _case("f")]
    script = {"n1": _final(), "n2": "ask", "n3": "ask", "f": _final()}
    report = evaluate_judgement(cases, _scripted(script))
    assert report.overall.near_miss_acceptance == pytest.approx(1 / 3)
    assert report.categories["near_miss"].near_miss_acceptance == pytest.approx(1 / 3)
    assert report.categories["paraphrase"].near_miss_acceptance is None


def test_consistency_counts_groups_whose_members_decided_alike() -> None:
    seat = "seat preference"
    cases = [
        _case("a1", group="same"),
        _case("a2", group="same", category="consistency"),
        _case("b1", group="action"),
        _case("b2", group="action"),
        _case("c1", group="values"),
        _case("c2", group="values"),
        _case("alone"),
    ]
    script = {
        "a1": _final(_constraint(seat, "seat preference: aisle", value="aisle")),
        # Another requirement name and other words, the same value: alike.
        "a2": _final(_constraint("where to sit", "sit on the aisle", value="Aisle")),
        "b1": _final(),
        "b2": "ask",
        "c1": _final(_constraint(seat, "aisle", value="aisle")),
        "c2": _final(_constraint(seat, "window", value="window")),
        "alone": "ask",
    }
    report = evaluate_judgement(cases, _scripted(script))
    assert report.overall.consistency == pytest.approx(1 / 3)
    # A category scores the groups it has a member of.
    assert report.categories["consistency"].consistency == 1.0
    assert report.categories["paraphrase"].consistency == pytest.approx(1 / 3)


def test_no_group_leaves_consistency_undefined() -> None:
    report = evaluate_judgement([_case("f")], _always_ask)
    assert report.overall.consistency is None


def test_a_failing_policy_is_the_cases_error_and_the_run_goes_on() -> None:
    cases = [_case("boom"), _case("invalid"), _case("fine")]
    script = {"boom": RuntimeError("tool down"), "invalid": {"action": "maybe"}, "fine": _final()}
    report = evaluate_judgement(cases, _scripted(script))
    boom, invalid, fine = report.results
    assert (boom.action, boom.action_correct, boom.correct) == (None, False, False)
    assert boom.error == "RuntimeError: tool down"
    assert invalid.error is not None
    assert invalid.error.startswith("PolicyError: the policy returned an invalid decision")
    assert (fine.action, fine.correct, fine.error) == ("final", True, None)
    assert report.overall.accuracy == pytest.approx(1 / 3)
    assert report.overall.decision_accuracy == pytest.approx(1 / 3)


def test_an_empty_or_ambiguous_case_list_is_refused() -> None:
    with pytest.raises(EvaluationError, match="empty"):
        evaluate_judgement([])
    with pytest.raises(EvaluationError, match="must be unique"):
        evaluate_judgement([_case("twice"), _case("twice")])


def _seen_by_policy() -> tuple[dict[str, set[str]], AgentFactory]:
    """A factory whose policy records the preferences it was shown, per query."""
    seen: dict[str, set[str]] = {}

    def decide(request: PersonaRequest, memories: MemoryBundle) -> FinalDecision:
        seen[request.query] = {m.record.content.preference for m in memories.persona}
        return _final()

    return seen, _with_policy(decide)


def test_cases_sharing_a_user_id_never_see_each_others_memories() -> None:
    cases = [
        _case("one", memories=[_memory("flight seat", "aisle, always")]),
        _case("two", memories=[_memory("flight seat", "window, for the view")]),
    ]
    seen, factory = _seen_by_policy()
    evaluate_judgement(cases, factory)
    assert seen == {"one": {"aisle, always"}, "two": {"window, for the view"}}
    # And the default agent answers each case from its own memory only.
    report = evaluate_judgement(
        [
            _case("one", memories=[_memory("flight seat", "aisle, always")]),
            _case("two", memories=[_memory("flight seat", "window, for the view")]),
        ]
    )
    for name, own, other in [("one", "aisle", "window"), ("two", "window", "aisle")]:
        decision = report.result(name).decision
        assert isinstance(decision, FinalDecision), name
        texts = " ".join(c.text for c in decision.constraints)
        assert own in texts
        assert other not in texts


def test_a_memory_of_a_user_id_differing_in_case_is_not_the_requests() -> None:
    ada = _memory("flight seat", "aisle, always")
    expect = {**CLARIFY, "options": ["aisle", "window"]}
    cases = [
        _case(
            "other-user", category="isolation", memories=[{**ada, "user_id": "Ada"}], expect=expect
        ),
        # The same memory, the request's user's, answers it: so "Ada" was kept apart.
        _case("own", memories=[{**ada, "user_id": "ada"}]),
    ]
    report = evaluate_judgement(cases)
    other = report.result("other-user")
    assert (other.action, other.requirement_correct, other.correct) == ("clarify", True, True)
    assert isinstance(other.decision, ClarifyDecision)
    assert len(other.decision.memories) == 0
    assert report.result("own").action == "final"


def test_latency_is_measured() -> None:
    report = evaluate_judgement([_case("f1"), _case("f2")])
    assert report.overall.latency_p50_ms > 0
    assert all(result.latency_s > 0 for result in report.results)


def test_the_report_is_json_data_without_memory_contents() -> None:
    quoted = "the zebra-striped aisle seat, row 7"
    case = _case("secret", memories=[_memory("flight seat", quoted)])
    report = evaluate_judgement([case])
    decision = report.result("secret").decision
    assert isinstance(decision, FinalDecision)
    assert quoted in decision.constraints[0].text  # the decision quotes the memory
    data = report.to_dict()
    encoded = orjson.dumps(data)
    assert orjson.loads(encoded) == data
    assert JudgementReport.model_validate_json(encoded).overall == report.overall
    assert "zebra" not in encoded.decode()
    assert "decision" not in data["results"][0]
    assert set(data["categories"]) == {"paraphrase"}


def test_a_result_is_found_by_name() -> None:
    report = evaluate_judgement([_case("f1"), _case("f2")], _always_ask)
    assert report.result("f2").name == "f2"
    with pytest.raises(KeyError, match="nobody"):
        report.result("nobody")


# -- noise -------------------------------------------------------------------------------

WORDS = ["flight", "Lisbon", "seat"]


def _contents(records: list[Any]) -> list[tuple[Any, ...]]:
    return [(r.layer, r.content, r.created_at) for r in records]


def test_noise_is_deterministic_for_a_seed() -> None:
    first = noise_memories(WORDS, 50, seed=7)
    assert _contents(first) == _contents(noise_memories(WORDS, 50, seed=7))
    assert _contents(first) != _contents(noise_memories(WORDS, 50, seed=8))


def test_noise_spans_every_layer_shares_a_word_and_keeps_to_its_years() -> None:
    records = noise_memories(WORDS, 300, seed=3)
    assert len(records) == 300
    assert Counter(r.layer for r in records).keys() == {"persona", "trajectory", "workspace"}
    for record in records:
        text = record.content.model_dump_json()
        assert any(word in text for word in WORDS), text
        assert (
            datetime(2021, 1, 1, tzinfo=UTC) <= record.created_at < datetime(2027, 1, 1, tzinfo=UTC)
        )
    assert [r.created_at for r in records] == sorted(r.created_at for r in records)


def test_noise_never_uses_a_requirement_word_as_its_attribute() -> None:
    def attributes(records: list[Any]) -> str:
        return " ".join(r.content.model_dump_json().lower() for r in records)

    plain = attributes(noise_memories(WORDS, 300, seed=3))
    assert "parking" in plain
    assert "wifi" in plain  # without `avoid`, both attributes occur
    avoided = attributes(noise_memories(WORDS, 300, seed=3, avoid=["Parking spot", "wifi"]))
    assert "parking" not in avoided
    assert "wifi" not in avoided


def test_noise_needs_a_word() -> None:
    with pytest.raises(ValueError, match="at least one word"):
        noise_memories([], 3, seed=1)
    with pytest.raises(ValueError, match="at least one word"):
        noise_memories(["  "], 3, seed=1)


def test_the_evaluator_seeds_noise_without_the_requirements_words(tmp_path: Path) -> None:
    store = JsonlMemoryStore(tmp_path / "store")
    noise = {"count": 300, "seed": 3, "words": WORDS}
    request = {"user_id": "ada", "query": "Park the car", "requirements": [{"name": "parking"}]}
    case = _case("noisy", memories=[_memory("flight seat", "aisle")], noise=noise, request=request)
    evaluate_judgement([case], _always_ask, store=store)
    (user,) = store.users()
    stored = [record for layer in LAYERS for record in store.list(user, layer)]
    assert len(stored) == 301  # the case's memory and the noise, in the request's bank
    assert "parking" in " ".join(r.content.model_dump_json() for r in noise_memories(WORDS, 300, 3))
    assert not any("parking" in record.content.model_dump_json() for record in stored)


# -- the default agent on the committed benchmark: a regression floor --------------------


@pytest.fixture(scope="module")
def default_report(committed: list[JudgementCase]) -> JudgementReport:
    return evaluate_judgement(committed)


def test_the_default_agent_never_asks_twice(default_report: JudgementReport) -> None:
    assert default_report.overall.repeat_question_rate == 0


def test_the_default_agent_meets_the_floors(default_report: JudgementReport) -> None:
    overall = default_report.overall
    assert overall.near_miss_acceptance is not None
    assert overall.near_miss_acceptance <= 0.1
    assert overall.adherence is not None
    assert overall.adherence >= 0.85
    assert overall.decision_accuracy >= 0.78
    assert overall.accuracy >= 0.75
    assert [r.error for r in default_report.results if r.error] == []


@pytest.mark.parametrize("category", ["missing", "isolation", "learn", "hidden"])
def test_the_default_agent_gets_the_safety_categories_right(
    default_report: JudgementReport, category: str
) -> None:
    assert default_report.categories[category].accuracy >= 0.9


# -- the command line --------------------------------------------------------------------


def test_eval_prints_a_table_per_category(run_cli: RunCli, committed: list[JudgementCase]) -> None:
    result = run_cli("eval", str(CASES))
    assert result.returncode == 0, result.stderr
    assert "judgement benchmark" in result.stdout
    rows = {}
    for line in result.stdout.splitlines():
        if line.startswith("│"):
            name, cases, *_ = (cell.strip() for cell in line.strip("│").split("│"))
            rows[name] = cases
    assert list(rows) == [*CATEGORIES, "all"]
    assert rows["all"] == str(len(committed))


def test_eval_json_prints_the_report(run_cli: RunCli, committed: list[JudgementCase]) -> None:
    result = run_cli("eval", str(CASES), "--json")
    assert result.returncode == 0, result.stderr
    data = orjson.loads(result.stdout)  # one JSON object, nothing else
    assert data["overall"]["cases"] == len(committed)
    assert set(data["categories"]) == set(CATEGORIES)


def test_eval_of_a_clarification_set_needs_a_store(run_cli: RunCli) -> None:
    result = run_cli("eval", str(CLARIFICATION_CASES))
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr.startswith("error: ")
    assert "--store" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_cases_file_is_told_by_its_first_case(tmp_path: Path) -> None:
    assert cases_kind(CLARIFICATION_CASES) == "clarification"
    assert cases_kind(DATA / "judgement" / "cases.jsonl") == "judgement"
    blank_first = _write(tmp_path / "blank.jsonl", b"", b"   ", _raw("good"))
    assert cases_kind(blank_first) == "judgement"
    assert cases_kind(_write(tmp_path / "broken.jsonl", b"{not json")) == "judgement"
    with pytest.raises(EvaluationError, match="cannot read"):
        cases_kind(tmp_path / "missing.jsonl")


def test_eval_of_a_judgement_benchmark_refuses_a_store(run_cli: RunCli, tmp_path: Path) -> None:
    path = _write(tmp_path / "cases.jsonl", _raw("good"))
    result = run_cli("eval", str(path), "--store", str(tmp_path / "store"), "--seed", str(path))
    assert (result.returncode, result.stdout) == (1, "")
    assert "bring their own memories: --store and --seed apply to clarification sets" in (
        result.stderr
    )
    assert not (tmp_path / "store").exists()  # nothing written


def test_eval_of_a_malformed_judgement_file_names_the_line(run_cli: RunCli, tmp_path: Path) -> None:
    path = _write(tmp_path / "cases.jsonl", _raw("good"), _raw("bad", category="vibes"))
    result = run_cli("eval", str(path))
    assert (result.returncode, result.stdout) == (1, "")
    assert "cases.jsonl:2: invalid case: category" in result.stderr
    assert "Traceback" not in result.stderr


def test_eval_of_a_judgement_file_broken_on_its_first_line_names_the_line(
    run_cli: RunCli, tmp_path: Path
) -> None:
    path = _write(tmp_path / "cases.jsonl", b'{"name": "bad", "category": ', _raw("good"))
    result = run_cli("eval", str(path))
    assert result.returncode == 1
    assert "cases.jsonl:1: not valid JSON" in result.stderr
