"""Memory updates: the resolver's decisions, the guards around them, and concurrency."""

import subprocess
import sys
from pathlib import Path

import pytest

from autopersona_flows import JsonlMemoryStore, PersonaMemory, TrajectoryMemory, WorkspaceMemory
from autopersona_flows.errors import ResolverError
from autopersona_flows.memory import (
    FunctionResolver,
    HashingEmbedder,
    HeuristicResolver,
    MemoryUpdater,
    UpdateDecision,
)


class Scripted:
    """A resolver that returns what a test tells it to, and records what it was shown."""

    def __init__(self, answer) -> None:
        self.answer = answer
        self.calls: list[tuple] = []

    def __call__(self, layer, new_content, candidates):
        self.calls.append((layer, new_content, candidates))
        return self.answer(candidates) if callable(self.answer) else self.answer


def tone(preference: str) -> PersonaMemory:
    return PersonaMemory(topic="tone", preference=preference)


def test_newest_preference_wins_and_the_old_one_is_history(store: JsonlMemoryStore) -> None:
    updater = MemoryUpdater(store)
    first = updater.update("ada", "persona", tone("formal"))
    assert first.operation == "add"
    assert first.record is not None
    assert first.record.embedding is not None
    second = updater.update("ada", "persona", PersonaMemory(topic="Tone ", preference="casual"))
    assert (second.operation, second.target_id) == ("update", first.record.id)
    (current,) = store.list("ada", "persona")
    assert current.content.preference == "casual"
    assert current.embedding is not None  # re-embedded for the new content
    (change,) = store.history("ada", "persona", current.id)
    assert change.before.content.preference == "formal"
    again = updater.update("ada", "persona", PersonaMemory(topic="tone", preference="Casual"))
    assert (again.operation, again.reason) == ("noop", "same preference")


def test_near_duplicates_are_noops_and_new_information_is_added(store: JsonlMemoryStore) -> None:
    updater = MemoryUpdater(store, resolver=HeuristicResolver(duplicate_threshold=0.9))
    updater.update(
        "ada", "trajectory", TrajectoryMemory(query="book a flight to Paris", insight="aisle")
    )
    near = updater.update(
        "ada", "trajectory", TrajectoryMemory(query="Book a flight to Paris!", insight="aisle")
    )
    assert near.operation == "noop"
    assert near.reason.startswith("near duplicate")
    new = updater.update("ada", "trajectory", TrajectoryMemory(query="rent a car in Lyon"))
    assert new.operation == "add"
    assert len(store.list("ada", "trajectory")) == 2


def test_an_exact_duplicate_never_reaches_the_resolver(store: JsonlMemoryStore) -> None:
    resolver = Scripted(UpdateDecision(operation="add"))
    updater = MemoryUpdater(store, resolver=resolver)
    added = updater.update("ada", "workspace", WorkspaceMemory(state={"open": "a.md"}))
    duplicate = updater.update("ada", "workspace", {"state": {"open": "a.md"}})
    assert len(resolver.calls) == 1
    assert (duplicate.operation, duplicate.reason) == ("noop", "exact duplicate")
    assert duplicate.record == added.record
    assert len(store.list("ada", "workspace")) == 1


def test_the_resolver_sees_the_similar_candidates(store: JsonlMemoryStore) -> None:
    updater = MemoryUpdater(store)
    updater.update("ada", "persona", tone("formal"))
    updater.update("ada", "persona", PersonaMemory(topic="citation style", preference="APA"))
    resolver = Scripted(UpdateDecision(operation="add"))
    MemoryUpdater(store, resolver=resolver, retriever=updater.retriever).update(
        "ada", "persona", PersonaMemory(topic="citation format", preference="MLA")
    )
    ((layer, content, candidates),) = resolver.calls
    assert (layer, content.preference) == ("persona", "MLA")
    assert candidates[0].record.content.topic == "citation style"


def test_a_contradiction_deletes_the_old_memory_without_losing_the_new_one(
    store: JsonlMemoryStore,
) -> None:
    # mem0 issue 4536: "I love X" then "I hate X" must not leave no memory at all.
    updater = MemoryUpdater(store)
    love = updater.update("ada", "persona", PersonaMemory(topic="X", preference="I love X")).record
    contradict = Scripted(
        lambda candidates: UpdateDecision(operation="delete", target_id=candidates[0].record.id)
    )
    decision = MemoryUpdater(store, resolver=contradict, retriever=updater.retriever).update(
        "ada", "persona", PersonaMemory(topic="X", preference="I hate X")
    )
    assert decision.operation == "delete"
    assert [m.content.preference for m in store.list("ada", "persona")] == ["I hate X"]
    assert decision.record is not None
    assert decision.record.content.preference == "I hate X"
    (change,) = store.history("ada", "persona", love.id)
    assert (change.operation, change.before.content.preference) == ("delete", "I love X")


def test_dict_decisions_are_accepted(store: JsonlMemoryStore) -> None:
    updater = MemoryUpdater(store)
    first = updater.update("ada", "persona", tone("formal")).record
    llm_like = FunctionResolver(
        lambda layer, content, candidates: {
            "operation": "update",
            "target_id": candidates[0].record.id,
            "content": {"topic": "tone", "preference": "formal but warm"},
            "reason": "merged",
        }
    )
    decision = MemoryUpdater(store, resolver=llm_like, retriever=updater.retriever).update(
        "ada", "persona", tone("warm")
    )
    assert decision.operation == "update"
    assert store.get("ada", "persona", first.id).content.preference == "formal but warm"


INVALID = {
    "an invented target": (
        lambda c: UpdateDecision(
            operation="update", target_id="01M8Q7GME2V8F9V56S05QS05N8", content=tone("x")
        ),
        "is not one of the candidates shown",
    ),
    "an unknown operation": (lambda c: {"operation": "merge"}, "operation"),
    "a capitalised operation": (
        lambda c: {"operation": "Update", "target_id": c[0].record.id},
        "operation",
    ),
    "an update without content": (
        lambda c: UpdateDecision(operation="update", target_id=c[0].record.id),
        "must carry the resulting content",
    ),
    "a delete without target": (lambda c: UpdateDecision(operation="delete"), "needs a target_id"),
    "an add with a target": (
        lambda c: UpdateDecision(operation="add", target_id=c[0].record.id),
        "takes no target_id",
    ),
    "content of another layer": (
        lambda c: UpdateDecision(
            operation="update", target_id=c[0].record.id, content=TrajectoryMemory(query="q")
        ),
        "is a trajectory memory, not persona",
    ),
    "not a decision": (lambda c: "update it", "must return an UpdateDecision"),
    "extra fields": (lambda c: {"operation": "noop", "confidence": 0.9}, "confidence"),
}


@pytest.mark.parametrize("case", INVALID)
def test_invalid_decisions_are_errors_and_write_nothing(store: JsonlMemoryStore, case: str) -> None:
    answer, message = INVALID[case]
    MemoryUpdater(store).update("ada", "persona", tone("formal"))
    before = store.snapshot_fingerprint("ada")
    with pytest.raises(ResolverError, match=message):
        MemoryUpdater(store, resolver=Scripted(answer)).update("ada", "persona", tone("warm"))
    assert store.snapshot_fingerprint("ada") == before


def test_updater_arguments_are_checked(store: JsonlMemoryStore) -> None:
    with pytest.raises(ValueError, match="top_k"):
        MemoryUpdater(store, top_k=0)
    with pytest.raises(TypeError, match="must be a PersonaMemory"):
        MemoryUpdater(store).update("ada", "persona", TrajectoryMemory(query="q"))
    with pytest.raises(ValueError, match="duplicate_threshold"):
        HeuristicResolver(duplicate_threshold=0)


WORKER = """
import sys
from autopersona_flows import JsonlMemoryStore, PersonaMemory
from autopersona_flows.memory import MemoryUpdater
root, n = sys.argv[1], int(sys.argv[2])
updater = MemoryUpdater(JsonlMemoryStore(root))
trips = ["rome", "oslo", "lima", "kyiv"]
items = "hotel flight train taxi tour museum dinner ferry bike show".split()
sys.stdin.readline()  # start together
for i in range(10):
    updater.update("ada", "persona", PersonaMemory(topic="tone", preference=f"p{n}-{i}"))
    topic = f"{trips[n]} {items[i]} budget"  # 40 different slots
    updater.update("ada", "persona", PersonaMemory(topic=topic, preference="yes"))
"""


def test_concurrent_updaters_in_several_processes_stay_correct(tmp_path: Path) -> None:
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(tmp_path), str(n)], stdin=subprocess.PIPE, text=True
        )
        for n in range(4)
    ]
    for process in processes:
        process.stdin.write("go\n")
        process.stdin.close()
    assert [process.wait(timeout=120) for process in processes] == [0] * 4
    store = JsonlMemoryStore(tmp_path)
    memories = store.list("ada", "persona")
    tones = [m for m in memories if m.content.topic == "tone"]
    assert len(tones) == 1  # every writer saw the others' tone: one memory, 39 superseded versions
    assert len(store.history("ada", "persona", tones[0].id)) == 39
    assert len(memories) == 1 + 40


def test_a_delete_whose_embedding_fails_changes_nothing(store: JsonlMemoryStore) -> None:
    from autopersona_flows.memory import FunctionEmbedder, MemoryRetriever

    calls = []

    def flaky(texts):
        calls.append(texts)
        if len(calls) >= 2:  # the first call embeds the queries; the second, the write
            raise RuntimeError("embedding service down")
        return HashingEmbedder().embed(texts)

    embedder = FunctionEmbedder(flaky, name=HashingEmbedder().name, dim=256)
    MemoryUpdater(store, HashingEmbedder()).update("ada", "persona", tone("formal"))
    before = store.snapshot_fingerprint("ada")
    contradict = Scripted(lambda c: UpdateDecision(operation="delete", target_id=c[0].record.id))
    updater = MemoryUpdater(store, embedder, contradict, retriever=MemoryRetriever(store, embedder))
    with pytest.raises(RuntimeError, match="embedding service down"):
        updater.update("ada", "persona", tone("casual"))
    assert store.snapshot_fingerprint("ada") == before


def test_a_decision_altered_after_validation_is_still_checked(store: JsonlMemoryStore) -> None:
    MemoryUpdater(store).update("ada", "persona", tone("formal"))
    before = store.snapshot_fingerprint("ada")
    sneaky = Scripted(UpdateDecision(operation="add").model_copy(update={"operation": "merge"}))
    with pytest.raises(ResolverError, match="operation"):
        MemoryUpdater(store, resolver=sneaky).update("ada", "persona", tone("warm"))
    assert store.snapshot_fingerprint("ada") == before


def test_an_add_of_content_already_stored_is_a_noop(store: JsonlMemoryStore) -> None:
    existing = MemoryUpdater(store).update("ada", "persona", tone("formal")).record
    rewrite = Scripted(UpdateDecision(operation="add", content=tone("formal")))
    decision = MemoryUpdater(store, resolver=rewrite).update("ada", "persona", tone("Formal!"))
    assert (decision.operation, decision.record) == ("noop", existing)
    assert len(store.list("ada", "persona")) == 1


def test_the_updater_and_its_retriever_must_share_the_store(store: JsonlMemoryStore) -> None:
    from autopersona_flows.memory import MemoryRetriever

    with pytest.raises(ValueError, match="store object"):
        MemoryUpdater(store, retriever=MemoryRetriever(JsonlMemoryStore(store.root)))
    with pytest.raises(Exception, match="must be the same"):
        MemoryUpdater(store, HashingEmbedder(dim=64), retriever=MemoryRetriever(store))


def test_an_end_said_in_other_words_ends_what_it_names(store: JsonlMemoryStore) -> None:
    """ "I quit caffeine" under another topic ends "coffee order: flat white"; nothing else."""
    updater = MemoryUpdater(store)
    coffee = updater.update(
        "ada", "persona", PersonaMemory(topic="coffee order", preference="large flat white")
    )
    shoes = updater.update("ada", "persona", PersonaMemory(topic="shoes", preference="size 39"))
    ended = updater.update(
        "ada", "persona", PersonaMemory(topic="health", preference="I quit caffeine in May")
    )
    assert (ended.operation, ended.target_id) == ("update", coffee.record.id)
    assert "no longer holds" in ended.reason
    assert store.get("ada", "persona", shoes.record.id).content.preference == "size 39"
    unrelated = updater.update(
        "ada", "persona", PersonaMemory(topic="music", preference="stopped going to gigs")
    )
    assert unrelated.operation == "add"  # an end of nothing the bank holds ends nothing
