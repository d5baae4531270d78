"""The context-dependent and long-term chat benchmarks: their files, runs and reports."""

from pathlib import Path

import orjson
import pytest

from autopersona_flows.agent.evaluation.chats import ChatCase, evaluate_chats, read_chat_cases
from autopersona_flows.agent.evaluation.situations import (
    SituationEpisode,
    evaluate_situations,
    read_situation_episodes,
)
from autopersona_flows.errors import EvaluationError

DATA = Path(__file__).resolve().parent.parent / "data"

EPISODE = {
    "name": "seat",
    "user_id": "sam",
    "node": {"id": "choose-seat", "instruction": "Pick a seat on the booked flight"},
    "requirement": {"name": "seat", "options": ["aisle", "window"]},
    "preferences": [
        {
            "situation": "work trips",
            "value": "aisle",
            "says": ["the aisle, I need to get off fast"],
        },
        {"situation": None, "value": "window", "says": ["the window, I like looking out"]},
    ],
    "change": {
        "at_round": 4,
        "preferences": [
            {"situation": "work trips", "value": "window", "says": ["window now, I sleep on those"]}
        ],
    },
    "rounds": [
        {
            "phase": "learn",
            "query": "Flight to Berlin for the sales kickoff",
            "situation": "work trips",
        },
        {"phase": "learn", "query": "Flights to Faro for our family week", "situation": None},
        {
            "phase": "act",
            "query": "Flight to Leeds for the client audit",
            "situation": "work trips",
        },
        {"phase": "act", "query": "Flights to Malaga for the kids' half-term", "situation": None},
        {
            "phase": "after",
            "query": "Flight to Oslo for the board meeting",
            "situation": "work trips",
        },
        {
            "phase": "after",
            "query": "Flight to Rome for the investor pitch",
            "situation": "work trips",
        },
    ],
}


def test_an_episode_is_run_with_a_simulated_person_phase_by_phase() -> None:
    report = evaluate_situations([SituationEpisode.model_validate(EPISODE)])
    assert report.episodes == 1
    assert set(report.phases) == {"learn", "act", "after"}
    assert report.phases["learn"].rounds == 2
    learn = report.phases["learn"]
    # Two situations, each asked at most once: nothing is asked twice.
    assert learn.questions_per_task <= 1
    assert report.overall.rounds == 6
    for scores in report.phases.values():
        assert 0 <= scores.right <= 1
        assert scores.right_unasked <= scores.right


def test_episodes_naming_situations_no_preference_has_are_refused(tmp_path: Path) -> None:
    bad = {**EPISODE, "change": None, "rounds": [{**EPISODE["rounds"][0], "situation": "the moon"}]}
    path = tmp_path / "episodes.jsonl"
    path.write_bytes(orjson.dumps(bad) + b"\n")
    with pytest.raises(EvaluationError, match=r":1: invalid case: .*the moon"):
        read_situation_episodes(path)


def test_a_chat_history_is_ingested_then_probed() -> None:
    case = ChatCase.model_validate(
        {
            "name": "runner",
            "user_id": "niamh",
            "sessions": [
                {
                    "at": "2025-01-08T19:42:00Z",
                    "messages": [
                        {"role": "user", "text": "help me plan a 10k, race is in April"},
                        {"role": "assistant", "text": "Happy to. What shoes do you run in?"},
                        {"role": "user", "text": "I'm always a 39 in running shoes"},
                    ],
                }
            ],
            "probes": [
                {
                    "request": {
                        "user_id": "niamh",
                        "query": "Order me new running shoes",
                        "node": {"id": "choose-size", "instruction": "Pick the shoe size"},
                        "requirements": [{"name": "shoe size", "description": "EU size"}],
                    },
                    "expect": {"action": "final", "values": {"shoe size": "39"}},
                },
                {
                    "request": {
                        "user_id": "niamh",
                        "query": "Book a massage after the race",
                        "node": {"id": "book", "instruction": "Book the massage"},
                        "requirements": [
                            {"name": "massage pressure", "options": ["light", "firm"]}
                        ],
                    },
                    "expect": {"action": "clarify", "requirement": "massage pressure"},
                },
            ],
        }
    )
    report = evaluate_chats([case])
    assert report.probes == 2
    assert report.answered == 1.0
    assert report.asked == 1.0
    assert report.failures == []


def test_the_committed_sets_read_and_cover_each_phase() -> None:
    for split, count in (("dev", 30), ("test", 40)):
        episodes = read_situation_episodes(DATA / "situations" / f"{split}.jsonl")
        assert len(episodes) == count
        assert {r.phase for e in episodes for r in e.rounds} == {"learn", "act", "after"}
    for split, count in (("dev", 12), ("test", 16)):
        cases = read_chat_cases(DATA / "chats" / f"{split}.jsonl")
        assert len(cases) == count
        kinds = {p.expect.action for c in cases for p in c.probes}
        assert kinds == {"final", "clarify"}
