"""What an episode keeps for its replays: the answers to its questions, and who asked them."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple
from uuid import UUID, uuid4

from prefect.filesystems import LocalFileSystem, WritableFileSystem
from prefect.results import ResultStore, get_default_result_storage
from pydantic import BaseModel, ConfigDict, TypeAdapter

from autopersona_flows.agent.decisions import ClarifyDecision
from autopersona_flows.flows._sync import blocking
from autopersona_flows.flows.cache_policies import node_cache_key
from autopersona_flows.flows.clarification import answer_given
from autopersona_flows.flows.locks import step_locks
from autopersona_flows.flows.serializers import OrjsonSerializer

__all__ = ["Asking", "EpisodeAnswers", "Given", "read_kept", "result_store"]


class Asking(BaseModel):
    """A run that asked a question, and the flow-run input its answer arrives in.

    Attributes:
        flow_run_id: The run that paused or suspended for the answer.
        response_key: Where the Prefect server stores that run's answer.
        field: The question's field in the form (see `field_names`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    flow_run_id: UUID
    response_key: str
    field: str = "answer"


_ASKINGS = TypeAdapter(list[Asking])


class Given(NamedTuple):
    """An answer a run has: the person's, or a requirement's default nobody answered.

    Attributes:
        answer: The answer.
        default: Whether it is the requirement's declared default, not the person's.
        heard: Whether it was read just now from the input of a run that asked (a
            suspended run, resumed with its answer, runs again from the top): its
            answered trail (log, event, artifact) is still to be written.
    """

    answer: str
    default: bool = False
    heard: bool = False


class EpisodeAnswers:
    """The answers given in one episode, kept in the result store for its replays.

    A replay of an episode (a new run with the same ``episode_id``, a retried run,
    a resumed suspended one) rebuilds exactly the inputs its nodes ran with from
    these answers, instead of asking again. A run keeps an answer only once it has
    it, which leaves a window: the server has stored the answer and resumed the
    run, but the run dies before keeping it. So a run notes itself first
    (`asking`), before it waits, and `recall` reads an answer kept or, failing
    that, the answer any run that asked received in its flow-run input.

    Answers and askings are keyed by episode, node, user and question, like the
    node's cached steps.
    """

    def __init__(self, storage: Path | WritableFileSystem | None, episode_id: str) -> None:
        self._locks = step_locks(storage)
        self._store = result_store(storage)
        self.episode_id = episode_id

    def _key(self, kind: str, node_id: str, user_id: str, decision: ClarifyDecision) -> str:
        question = {"user_id": user_id, "question": decision.question}
        return node_cache_key(kind, self.episode_id, node_id, question)

    def _read(self, key: str) -> Any:
        return read_kept(self._store, key)

    def recall(self, node_id: str, user_id: str, decision: ClarifyDecision) -> Given | None:
        """The answer already given to this question in this episode, if any.

        An answer found only in an asking run's input is kept on the way, so later
        replays need not ask the server.
        """
        kept = self._read(self._key("answer", node_id, user_id, decision))
        if isinstance(kept, dict):
            return Given(str(kept["default"]), default=True)
        if kept is not None:
            return Given(str(kept))
        askings = _ASKINGS.validate_python(
            self._read(self._key("asking", node_id, user_id, decision)) or []
        )
        for asking in reversed(askings):  # the latest run is the likeliest answered
            answer = answer_given(asking.flow_run_id, asking.response_key, decision, asking.field)
            if answer is not None:
                self.keep(node_id, user_id, decision, Given(answer))
                return Given(answer, heard=True)
        return None

    def asking(self, node_id: str, user_id: str, decision: ClarifyDecision, asking: Asking) -> None:
        """Note, before it waits, that a run asks this question (see the class docstring)."""
        key = self._key("asking", node_id, user_id, decision)
        holder = uuid4().hex  # a run's threads asking at once must exclude each other too
        # Two runs of the episode asking at once must not each write the list without
        # the other: a run missing from it could never have its answer read back.
        self._locks.acquire_lock(key, holder)
        try:
            askings = _ASKINGS.validate_python(self._read(key) or [])
            if asking not in askings:  # a resumed run asks again under the same id
                self._store.write(_ASKINGS.dump_python([*askings, asking], mode="json"), key=key)
        finally:
            self._locks.release_lock(key, holder)

    def keep(self, node_id: str, user_id: str, decision: ClarifyDecision, given: Given) -> None:
        """Keep the answer to this question (or the default run with) for the episode's replays."""
        value: Any = {"default": given.answer} if given.default else given.answer
        self._store.write(value, key=self._key("answer", node_id, user_id, decision))


def read_kept(store: ResultStore, key: str) -> Any:
    """The value kept under ``key`` in ``store``; ``None`` if nothing is.

    One read when something is kept. Storage blocks say "missing" each in their own
    way, so a failed read asks `ResultStore.exists` whether anything is there: a
    record that is there but could not be read raises, rather than pass for nothing
    kept (which would ask a person again or decide again).
    """
    try:
        return store.read(key).result
    except Exception:
        if store.exists(key):
            raise
        return None


def result_store(storage: Path | WritableFileSystem | None) -> ResultStore:
    """The result store of persona steps kept in ``storage`` (Prefect's default if None).

    It keeps nothing in memory: a run reads back none of what it writes (a replay is
    a run of its own), and every record held until the run ends would be one more
    object for the garbage collector to traverse.
    """
    if isinstance(storage, Path):
        storage = LocalFileSystem(basepath=str(storage))
    return ResultStore(
        result_storage=storage or blocking(get_default_result_storage)(),
        serializer=OrjsonSerializer(),
        cache_result_in_memory=False,
    )
