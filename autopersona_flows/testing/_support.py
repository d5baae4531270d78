"""Sample data and a thread runner for the conformance suite."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from autopersona_flows.memory.protocol import MemoryStore
from autopersona_flows.memory.records import (
    LAYERS,
    Embedding,
    LayerContent,
    MemoryLayer,
    MemoryRecord,
    PersonaMemory,
    TrajectoryMemory,
    WorkspaceMemory,
)

USER, OTHER = "ada", "bob"
TIMEOUT = 60.0  # seconds; a lock or thread bug fails the test instead of hanging it
# Text every layer must store exactly: line and paragraph separators, NUL, emoji, RTL.
TRICKY = "tab\t LS\u2028 PS\u2029 NEL\u0085 CR\r LF\n NUL\x00 🧠👩🏽‍💻 RTL\u202e 日本語"


def persona(topic: str = "tone", preference: str = "formal") -> PersonaMemory:
    """Return a persona memory: the suite's default content."""
    return PersonaMemory(topic=topic, preference=preference)


def persona_of(record: MemoryRecord) -> PersonaMemory:
    """Return a persona record's content; a record of another layer fails the test."""
    assert isinstance(record.content, PersonaMemory), record
    return record.content


def sample(layer: MemoryLayer, text: str = TRICKY) -> LayerContent:
    """Return content of ``layer`` with ``text`` in each of its text fields."""
    if layer == "trajectory":
        return TrajectoryMemory(query=text, trace=[text, {"k": [1, 2.5, None]}], insight=text)
    if layer == "workspace":
        return WorkspaceMemory(task=text, interaction=[{"t": text}], state={"ok": True})
    return PersonaMemory(topic=text, preference=text, strategy=text)


def seed(store: MemoryStore, user_id: str = USER) -> list[str]:
    """Give ``user_id`` records in every layer; return the ids of one updated, one deleted."""
    for layer in LAYERS:
        store.add(user_id, sample(layer))
    kept, gone = store.add_many(user_id, "persona", [persona("a"), persona("b")])
    store.update(user_id, "persona", kept.id, persona("a", "casual"), embedding=embedding_of())
    store.delete(user_id, "persona", gone.id)
    return [kept.id, gone.id]


def embedding_of(*values: float) -> Embedding:
    return Embedding.of("test-embedder", values or (0.25, -1.0, 3.5))


class Job(threading.Thread):
    """A daemon thread keeping its function's result or error; a hung one is abandoned."""

    def __init__(self, function: Callable[[], object]) -> None:
        super().__init__(daemon=True)
        self.function = function
        self.result: object = None
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            self.result = self.function()
        except BaseException as exc:  # re-raised on the test's thread by `outcome`
            self.error = exc

    def outcome(self, deadline: float) -> object:
        self.join(max(0.0, deadline - time.monotonic()))
        if self.is_alive():
            raise AssertionError(f"a thread did not finish within {TIMEOUT:g} s: a lock is stuck")
        if self.error is not None:
            raise self.error
        return self.result


def run_threads(*functions: Callable[[], object]) -> list[object]:
    """Run each function on its own thread; return their results or raise the first error."""
    jobs = [Job(function) for function in functions]
    deadline = time.monotonic() + TIMEOUT
    return [job.outcome(deadline) for job in jobs]
