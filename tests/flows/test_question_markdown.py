"""The question a person sees: its options, and the memories that came closest."""

from datetime import UTC, datetime

from autopersona_flows import MemoryRecord, PersonaMemory, TrajectoryMemory
from autopersona_flows.agent import ClarifyDecision
from autopersona_flows.flows.clarification import question_markdown
from autopersona_flows.memory.retrieval import MemoryBundle, ScoredMemory, SearchRequest

AT = datetime(2025, 1, 1, tzinfo=UTC)


def found(content, score: float, label: str | None = None) -> ScoredMemory:
    return ScoredMemory(
        record=MemoryRecord.of(content, created_at=AT),
        score=score,
        search=SearchRequest(layer=content.layer, query="q", label=label),
    )


def test_the_closest_memories_are_shown_whatever_their_layer_and_lookups_are_not() -> None:
    close = found(PersonaMemory(topic="seat", preference="aisle, mostly"), 0.8)
    far = found(TrajectoryMemory(query="Flight to Oslo", trace=["booked"]), 0.2)
    allergy = found(PersonaMemory(topic="health", preference="nut allergy"), 0.0, "standing")
    decision = ClarifyDecision(
        question="Aisle or window?",
        requirement="seat",
        options=["aisle", "window"],
        memories=MemoryBundle(trajectory=[far], persona=[allergy, close]),
    )
    text = question_markdown("choose-seat", decision)
    assert "**Aisle or window?**" in text
    assert "Options: `aisle`, `window`" in text
    assert text.index(close.record.id) < text.index(far.record.id)  # by score, not layer
    assert "(score 0.80)" in text
    assert allergy.record.id not in text
