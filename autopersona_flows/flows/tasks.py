"""The Prefect tasks of a persona node: decide, learn the answer, run the tool.

Each is its own task, visible in the UI and cached under `NodeCachePolicy`, so a
resumed or replayed run gets every completed step back from the result store
instead of running it again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prefect import Task, task
from prefect.context import FlowRunContext
from prefect.filesystems import LocalFileSystem
from prefect.futures import wait
from prefect.results import ResultStore, get_default_result_storage

from autopersona_flows import _json
from autopersona_flows.agent.decisions import (
    ClarifyDecision,
    FinalDecision,
    NodeInfo,
    PersonaRequest,
    Requirement,
    parse_decision,
)
from autopersona_flows.errors import AutopersonaError, FlowConfigurationError, NodeOutputError
from autopersona_flows.flows.cache_policies import NodeCachePolicy, node_cache_key
from autopersona_flows.flows.clarification import ask
from autopersona_flows.flows.context import NodeContext, PersonaRuntime
from autopersona_flows.flows.serializers import OrjsonSerializer
from autopersona_flows.memory.records import LAYERS, JsonValue, check_json

__all__ = ["NodeSteps", "StepCounter", "episode_of", "json_inputs"]

_EMBEDDINGS = {"memories": {layer: {"__all__": {"record": {"embedding"}}} for layer in LAYERS}}


class StepCounter:
    """Counts, per flow run, what actually executed (cache hits do not count)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.tool_executions = 0
        self.decisions = 0
        self.clarifications = 0

    def add(self, name: str) -> None:
        """Count one more ``name``."""
        with self._lock:
            setattr(self, name, getattr(self, name) + 1)


def _retry_unless_ours(task: Any, task_run: Any, state: Any) -> bool:
    """Retry a tool's own failures, never the library's.

    Ours (a non-JSON output, a bad configuration) would fail again the same way,
    and each attempt would repeat the tool's side effects.
    """
    try:
        state.result()
    except AutopersonaError:
        return False
    except Exception:  # any other failure is the tool's: retry it
        return True
    return True


def episode_of(runtime: PersonaRuntime, episode_id: str | None) -> str:
    """The episode a run's cache keys belong to: given, configured, or the flow run's id."""
    if episode_id:
        return episode_id
    if runtime.episode_id:
        return runtime.episode_id
    context = FlowRunContext.get()
    if context is None or context.flow_run is None:
        raise FlowConfigurationError("persona tasks must be called inside a Prefect flow")
    return str(context.flow_run.id)


def json_inputs(value: Any, what: str) -> JsonValue:
    """Return ``value`` if it is a JSON value (it becomes part of a cache key)."""
    try:
        return check_json(value)
    except ValueError as exc:
        raise NodeOutputError(f"{what} must be JSON values: {exc}") from None


class NodeSteps:
    """Builds and calls the three tasks of one node for one flow run."""

    def __init__(self, runtime: PersonaRuntime, episode_id: str, counter: StepCounter) -> None:
        self.runtime = runtime
        self.episode_id = episode_id
        self.counter = counter

    def _task(self, fn: Callable[..., Any], kind: str, name: str, retries: int = 0) -> Task:
        return task(
            fn,
            retry_condition_fn=_retry_unless_ours,
            name=name,
            task_run_name=name,
            cache_policy=NodeCachePolicy(kind=kind),
            persist_result=True,
            result_serializer=OrjsonSerializer(),
            result_storage=self.runtime.result_storage,
            retries=retries,
        )

    def prepare(
        self,
        node: NodeInfo,
        *,
        requirements: list[Requirement],
        user_id: str,
        query: str,
        tools: list[str],
        in_flight: list[Any],
    ) -> tuple[FinalDecision | ClarifyDecision, str | None]:
        """The pre-hook: decide (cached), and ask and learn when a clarification is due.

        Returns:
            The decision the node runs with, and the person's answer if one was asked.
        """
        request = PersonaRequest(
            user_id=user_id,
            query=query,
            node=node,
            requirements=requirements,
            additional_tools=tools,
        )
        agent = self.runtime.agent
        counter = self.counter

        def decide(episode_id: str, node_id: str, inputs: dict[str, Any]) -> Any:
            counter.add("decisions")
            decision = agent.decide(PersonaRequest.model_validate_json(_json.dumps(inputs)))
            # Embeddings would only weigh down every stored result and cache key.
            return _json.loads(decision.model_dump_json(exclude=_EMBEDDINGS))

        raw = self._task(decide, "decide", f"decide-{node.id}")(
            episode_id=self.episode_id,
            node_id=node.id,
            inputs=_json.loads(request.model_dump_json()),
        )
        decision = parse_decision(_json.dumps(raw))
        if isinstance(decision, FinalDecision):
            return decision, None
        # The answer is kept per episode, node and question: a replay of the episode
        # (a new run, a retry) then rebuilds exactly the inputs the node ran with,
        # instead of asking again or deciding afresh and missing the cache.
        answers = self._answer_store()
        key = node_cache_key(
            "answer", self.episode_id, node.id, {"user_id": user_id, "question": decision.question}
        )
        if answers.exists(key):
            answer = str(answers.read(key).result)
        else:
            counter.add("clarifications")
            wait(in_flight)  # nothing runs while we wait, so a suspend loses no work
            answer = ask(node.id, decision, self.runtime)
            answers.write(answer, key=key)

        def learn(episode_id: str, node_id: str, inputs: dict[str, Any]) -> Any:
            result = agent.learn(user_id, decision, inputs["answer"])
            return {
                "operation": result.operation,
                "memory_id": result.record.id if result.record else None,
            }

        self._task(learn, "learn", f"learn-{node.id}")(
            episode_id=self.episode_id,
            node_id=node.id,
            inputs={"question": decision.question, "answer": answer, "user_id": user_id},
        )
        return decision, answer

    def _answer_store(self) -> ResultStore:
        storage = self.runtime.result_storage
        if isinstance(storage, Path):
            storage = LocalFileSystem(basepath=str(storage))
        return ResultStore(
            result_storage=storage or get_default_result_storage(),
            serializer=OrjsonSerializer(),
        )

    def run_task(self, node_id: str, tool: Callable[..., Any], retries: int = 0) -> Task:
        """The task that runs the node's tool with its `NodeContext`."""
        counter = self.counter

        def run(episode_id: str, node_id: str, inputs: dict[str, Any]) -> Any:
            counter.add("tool_executions")
            decision = parse_decision(_json.dumps(inputs["decision"]))
            context = NodeContext.build(
                node=NodeInfo.model_validate(inputs["node"]),
                user_id=inputs["user_id"],
                query=inputs["query"],
                decision=decision,
                answer=inputs["answer"],
                inputs=inputs["inputs"],
                tools=inputs["tools"],
            )
            output = tool(context, *inputs.get("args", ()), **inputs.get("kwargs", {}))
            return json_inputs(output, f"the output of {node_id!r}")

        return self._task(run, "run", node_id, retries=retries)

    @staticmethod
    def run_inputs(
        node: NodeInfo,
        *,
        user_id: str,
        query: str,
        decision: FinalDecision | ClarifyDecision,
        answer: str | None,
        inputs: dict[str, Any],
        tools: list[str],
        **extra: Any,
    ) -> dict[str, Any]:
        """The run task's inputs: everything its result depends on, as JSON."""
        return {
            "node": _json.loads(node.model_dump_json()),
            "user_id": user_id,
            "query": query,
            "decision": _json.loads(decision.model_dump_json()),
            "answer": answer,
            "inputs": inputs,
            "tools": tools,
            **extra,
        }
