"""Benchmark: what persona nodes cost on Prefect, and what a replay after a pause repeats.

Run it as ``python benchmarks/flow_overhead.py`` (``--quick`` for 10-node chains,
a pause at node 5 and one repetition). It needs no server: unless ``PREFECT_API_URL``
is set, it runs on a private embedded Prefect whose home is a temporary folder.

What is measured
----------------
**Part 1, overhead.** A chain of ``--nodes`` nodes (50), each depending on the one
before, whose tool does the same small deterministic computation on its
predecessor's output. It runs two ways, alternately, ``--reps`` times each (5):

* *persona*: `run_persona_graph` on a `TaskGraph`. For each node the
  PersonaAgent decides (a retrieval over a bank seeded with a few persona
  memories and one workspace memory) and the node's tool runs with its
  `NodeContext`. Every 10th node has a requirement the memory satisfies, so it is
  decided in a step kept in the result store, in the flow body, where a question
  could suspend the run; the other nodes cannot be asked about (the default policy
  never asks without a required requirement) are decided in the flow body with
  no task of their own, all before the first node is submitted. Each run is a new
  episode, so nothing is a cache hit.
* *bare*: a plain ``@flow`` submitting the same chain of plain Prefect tasks (one
  per node) with equal persistence: ``persist_result=True``, the same result
  storage folder, the same JSON serializer, and `NodeCachePolicy` (so the cache
  key is computed the same way), on a new episode each run.

Each run is timed twice: end to end (from the call to the returned result) and in
the flow body (from its first line to its return). The verdict is the ratio of
the flow-body medians, persona / bare; the bar is <= 1.15x, or <= 1.05x with
``--tool-ms 20`` (each tool, on both sides, also sleeps that long: a realistic
tool, against which our glue should vanish). The end-to-end ratio
is printed too, but it is not a measure of cost: a sync Prefect flow joins its
heartbeat thread on exit, and that thread sleeps in whole seconds, so end-to-end
times come in steps of about one second after the run starts (PREFECT_NOTES §6;
``prefect.flow_engine._send_heartbeats``). The flow-body ratio is continuous and
the stricter of the two, since the per-run constant is left out of both sides.
The per-node overhead, (persona - bare) / nodes, is printed in milliseconds,
beside the time spent inside ``PersonaAgent.decide`` and inside the tools, and
split by the tools' span (the first tool's start to the last tool's end): what
the nodes themselves add, against what comes before the first tool (the
decisions made up front) and after the last (reading the results).

When the bar is missed (or with ``--profile``) the overhead is broken down:

* *variants* of the bare chain, run ``--reps`` times each: with one more trivial,
  persisted task per node called from the flow body the way the decide step is
  (what a second task per node costs in Prefect alone), and with the agent called
  inside the node's one task (what a single-task design would cost);
* *cProfile* of one persona run, in the main thread (the flow body, where the
  decide tasks run one after another) and in the task threads, split into
  Prefect's engine, our code and the agent.

**Part 2, replay after a pause.** A chain of the same length where node
``--pause-at`` (25) has a requirement nobody has answered, so the agent asks and
the run pauses. A thread of this script plays the person: it waits for the
paused flow run and answers through the API (``answer_clarification``), as the resume
dialog of the Prefect UI would. This first run has ``episode_id="bench-ep"``; the
script records which tools ran before the answer and which after. Then the graph
is *replayed*: run again as a new flow run with the same episode id, so every
completed step must come back from the result store. The tool executions of
nodes 1-24 in the replay must be 0 (exit code 1 otherwise) and, since every node
had completed, those of nodes 25-50 should be 0 as well (printed). The replay is
timed beside a fresh run of just the remaining nodes (25-50 as a 26-node chain, a
new episode, the answer now remembered); both are repeated ``--reps`` times,
alternately, and their medians and ratio printed.

How to read it
--------------
The embedded server keeps its state in SQLite. Lock contention there turns into
HTTP 503 answers that the client retries after 2 s, 4 s, ... (PREFECT_NOTES §6),
and the server may log ``database is locked`` tracebacks on stderr while it
retries; single runs therefore have outliers of a few seconds, so medians are
reported, with the number of repetitions and every run's time. The back-offs are
counted (from the client's debug log record of each retry) and printed per kind
of run; most fall outside the flow body, at the flow run's own state changes.
So are the garbage collector's full collections (a fifth of a second or more each,
in whichever run reaches the collector's threshold), with an informative ratio of
the runs none fell in; no run collects beforehand, since the objects a persona run
leaves for the collector are a cost it really causes. Absolute times depend on the
machine; only ratios are checked. The exit code is 1 if the overhead ratio misses
its bar or if the replay ran a tool of a node before the pause again.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

_WORKDIR = Path(tempfile.mkdtemp(prefix="flow-overhead-"))
# Registered before Prefect starts its server, so it runs after the server stops.
atexit.register(shutil.rmtree, _WORKDIR, ignore_errors=True)
if "PREFECT_API_URL" not in os.environ:
    # A private, embedded Prefect: nothing to start, nothing left behind elsewhere.
    os.environ.setdefault("PREFECT_HOME", str(_WORKDIR / "prefect"))
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")

import argparse  # noqa: E402 - after the settings above
import cProfile  # noqa: E402
import gc  # noqa: E402
import logging  # noqa: E402
import pstats  # noqa: E402
import re  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
from collections import Counter  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from typing import Any  # noqa: E402

from _common import progress, recorded  # noqa: E402
from prefect import Task, flow, task  # noqa: E402
from prefect.client.orchestration import get_client  # noqa: E402
from prefect.futures import wait  # noqa: E402

from autopersona_flows import (  # noqa: E402
    JsonlMemoryStore,
    PersonaAgent,
    PersonaMemory,
    RawTaskRecord,
    Requirement,
)
from autopersona_flows.flows import (  # noqa: E402
    NodeCachePolicy,
    NodeContext,
    OrjsonSerializer,
    TaskGraph,
    TaskNode,
    answer_clarification,
    pending_clarifications,
    run_persona_graph,
)
from autopersona_flows.memory import (  # noqa: E402
    MemoryRetriever,
    MemoryUpdater,
    ingest_task_history,
)

BARS = {False: 1.15, True: 1.05}  # by whether the tools take time (--tool-ms)
TOOL_SECONDS = [0.0]  # how long each tool sleeps besides computing, set by --tool-ms
QUERY = "Crunch the weekly numbers and send the report"
OVERHEAD_USER = "bench-overhead"
RESUME_USER = "bench-resume"
EPISODE = "bench-ep"
SATISFIED_EVERY = 10
SATISFIED = Requirement("citation style")
UNANSWERED = Requirement("deployment region", options=["eu-west", "us-east"])
ANSWER = "eu-west"
POLL_INTERVAL = 0.2
PAUSE_TIMEOUT = 300


class BackoffCounter(logging.Filter):
    """Counts the Prefect client's retries after a 503 (or a connection error).

    The client logs each one at debug level before it sleeps; this filter, on the
    ``prefect.client`` logger, counts those records and drops every debug record.
    """

    _SECONDS = re.compile(r"will be made in ([0-9.]+)s")

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()
        self.count = 0
        self.seconds = 0.0

    def install(self) -> None:
        client_logger = logging.getLogger("prefect.client")
        client_logger.addFilter(self)
        client_logger.setLevel(logging.DEBUG)

    def reset(self) -> None:
        with self.lock:
            self.count, self.seconds = 0, 0.0

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.INFO:
            return True
        found = self._SECONDS.search(record.getMessage())
        if found:
            with self.lock:
                self.count += 1
                self.seconds += float(found.group(1))
        return False


BACKOFFS = BackoffCounter()


class FullCollections:
    """Counts the garbage collector's full collections, and their seconds, during a run.

    A full collection of this process (Prefect and everything it imports: some
    300,000 tracked objects) takes a fifth of a second or more, and when one comes
    depends on how many objects earlier runs left in the older generations. It
    lands in the odd run, on either side: most of the noise of the bodies' times.
    """

    def __init__(self) -> None:
        self.count = 0
        self.seconds = 0.0
        self._started: float | None = None

    def install(self) -> None:
        gc.callbacks.append(self._callback)

    def reset(self) -> None:
        self.count, self.seconds = 0, 0.0

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            self.count += 1
            self.seconds += time.perf_counter() - self._started
            self._started = None


FULL_GCS = FullCollections()


# -- the tools -----------------------------------------------------------------------------


class Recorder:
    """Counts tool executions per node, and which ran after the person answered.

    It also notes when the first tool started and the last one ended: their span
    is the part of a run that only the nodes' own cost stretches.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.executions: Counter[str] = Counter()
        self.after_answer: Counter[str] = Counter()
        self.answered = threading.Event()
        self.tool_seconds = 0.0
        self.first_start = float("inf")
        self.last_end = float("-inf")

    def reset(self) -> None:
        with self.lock:
            self.executions.clear()
            self.after_answer.clear()
            self.answered.clear()
            self.tool_seconds = 0.0
            self.first_start, self.last_end = float("inf"), float("-inf")

    def record(self, node_id: str, started: float) -> None:
        """Note a tool execution of ``node_id`` that started at ``started`` and ends now."""
        ended = time.perf_counter()
        with self.lock:
            self.executions[node_id] += 1
            if self.answered.is_set():
                self.after_answer[node_id] += 1
            self.tool_seconds += ended - started
            self.first_start = min(self.first_start, started)
            self.last_end = max(self.last_end, ended)

    @property
    def span(self) -> float:
        """Seconds from the first tool's start to the last tool's end."""
        return max(0.0, self.last_end - self.first_start)


RECORDER = Recorder()


def node_id(index: int) -> str:
    return f"n{index:02d}"


def compute(index: int, upstream: int) -> dict[str, int]:
    """The small deterministic computation each node does on its predecessor's value."""
    if TOOL_SECONDS[0]:
        time.sleep(TOOL_SECONDS[0])
    value = upstream
    for k in range(200):
        value = (value * 31 + index * k + 7) % 1_000_003
    return {"index": index, "value": value}


def chain_tool(context: NodeContext) -> dict[str, int]:
    """A persona node's tool: `compute` on the output of the node before it."""
    started = time.perf_counter()
    upstream = next(iter(context.inputs.values()), None)
    output = compute(int(context.node.id[1:]), upstream["value"] if upstream else 0)
    RECORDER.record(context.node.id, started)
    return output


def chain_graph(first: int, last: int, *, ask_at: int | None = None) -> TaskGraph:
    """Nodes ``first``..``last``, each depending on the one before."""
    nodes = []
    for index in range(first, last + 1):
        requires = []
        if index == ask_at:
            requires = [UNANSWERED]
        elif index % SATISFIED_EVERY == 0:
            requires = [SATISFIED]
        nodes.append(
            TaskNode(
                id=node_id(index),
                instruction=f"Step {index} of the weekly numbers",
                tool=chain_tool,
                depends_on=[node_id(index - 1)] if index > first else [],
                requires=requires,
            )
        )
    return TaskGraph(nodes)


# -- the bare chain and its variants -------------------------------------------------------

LIVE: dict[str, TimedAgent] = {}  # the agent of the agent-inside variant (not a parameter)


def bare_step(episode_id: str, node_id: str, inputs: dict[str, Any]) -> dict[str, int]:
    """A bare task's body: the same computation, with the same parameter shape."""
    started = time.perf_counter()
    upstream = inputs["upstream"]
    output = compute(inputs["index"], upstream["value"] if upstream else 0)
    RECORDER.record(node_id, started)
    return output


def agent_step(episode_id: str, node_id: str, inputs: dict[str, Any]) -> dict[str, int]:
    """The agent-inside variant's body: decide for the node, then compute."""
    LIVE["agent"].decide({"user_id": OVERHEAD_USER, "query": QUERY, "node": {"id": node_id}})
    return bare_step(episode_id, node_id, inputs)


def trivial_decide(episode_id: str, node_id: str, inputs: dict[str, Any]) -> dict[str, str]:
    """The extra-task variant's second task: no work, a small JSON result."""
    return {"action": "final"}


def persisted(fn: Callable[..., Any], name: str, kind: str, storage: Path) -> Task:
    """A task persisted like the persona tasks (same policy, serializer and storage)."""
    return task(
        fn,
        name=name,
        task_run_name=name,
        cache_policy=NodeCachePolicy(kind=kind),
        persist_result=True,
        result_serializer=OrjsonSerializer(),
        result_storage=storage,
    )


VARIANTS = ("bare", "extra-task", "agent-inside")


@flow(name="bare-chain", validate_parameters=False)
def bare_chain(first: int, last: int, storage: Path, variant: str = "bare") -> dict[str, Any]:
    """The same chain as plain Prefect tasks, persisted like the persona run tasks.

    ``variant`` ``extra-task`` also calls a trivial persisted task per node from
    the flow body, as the persona flow calls its decide task; ``agent-inside``
    calls the agent inside each node's task instead.
    """
    started = time.perf_counter()
    episode = str(uuid.uuid4())
    futures = []
    previous = None
    for index in range(first, last + 1):
        node = node_id(index)
        if variant == "extra-task":
            persisted(trivial_decide, f"decide-{node}", "decide", storage)(
                episode_id=episode, node_id=node, inputs={"index": index}
            )
        body = agent_step if variant == "agent-inside" else bare_step
        previous = persisted(body, node, "run", storage).submit(
            episode_id=episode, node_id=node, inputs={"index": index, "upstream": previous}
        )
        futures.append(previous)
    wait(futures)
    outputs = {node_id(first + i): future.result() for i, future in enumerate(futures)}
    return {"outputs": outputs, "seconds": time.perf_counter() - started}


# -- memory and agent ----------------------------------------------------------------------


class TimedAgent(PersonaAgent):
    """A PersonaAgent that adds up the time spent in ``decide``."""

    decide_seconds = 0.0
    decide_calls = 0

    def decide(self, request: Any) -> Any:
        started = time.perf_counter()
        try:
            return super().decide(request)
        finally:
            self.decide_seconds += time.perf_counter() - started
            self.decide_calls += 1


def make_agent(root: Path) -> TimedAgent:
    """An agent over a fresh store where both users have the same few memories."""
    store = JsonlMemoryStore(root / "memory")
    retriever = MemoryRetriever(store)
    updater = MemoryUpdater(store, retriever=retriever)
    for user in (OVERHEAD_USER, RESUME_USER):
        ingest_task_history(
            store,
            updater,
            RawTaskRecord(
                user_id=user,
                query="Crunch last week's numbers and send the report",
                trace=["load the data", "aggregate", "write the report", "send it"],
                insight="Keep the report to one page",
                state={"data": "warehouse/weekly.parquet"},
                persona=[
                    PersonaMemory(topic="citation style", preference="APA"),
                    PersonaMemory(topic="report length", preference="one page"),
                    PersonaMemory(topic="tone", preference="plain", strategy="no jargon"),
                    PersonaMemory(topic="number format", preference="two decimals"),
                ],
            ),
        )
    return TimedAgent(retriever, updater=updater)


# -- part 1: overhead ----------------------------------------------------------------------


@dataclass
class Sample:
    wall: float
    body: float
    decide: float = 0.0
    tools: float = 0.0
    backoffs: int = 0
    backoff_seconds: float = 0.0
    span: float = 0.0  # the first tool's start to the last tool's end
    full_gcs: int = 0  # full garbage collections during the run
    gc_seconds: float = 0.0


def median(samples: list[Sample], what: str) -> float:
    return statistics.median(getattr(sample, what) for sample in samples)


@dataclass
class Overhead:
    nodes: int
    persona: list[Sample] = field(default_factory=list)
    bare: list[Sample] = field(default_factory=list)
    variants: dict[str, list[Sample]] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        return median(self.persona, "body") / median(self.bare, "body")


def _reset() -> None:
    """Reset what a run records: its tools, the client's back-offs, full collections."""
    RECORDER.reset()
    BACKOFFS.reset()
    FULL_GCS.reset()


def _sample(wall: float, body: float, decide: float) -> Sample:
    """A run's sample: its times, and what the recorders noted since `_reset`."""
    return Sample(
        wall,
        body,
        decide,
        RECORDER.tool_seconds,
        BACKOFFS.count,
        BACKOFFS.seconds,
        RECORDER.span,
        FULL_GCS.count,
        FULL_GCS.seconds,
    )


def persona_run(agent: TimedAgent, graph: TaskGraph, storage: Path) -> Sample:
    """One persona run of ``graph`` on a new episode; checks every tool ran once."""
    _reset()
    agent.decide_seconds, agent.decide_calls = 0.0, 0
    started = time.perf_counter()
    result = run_persona_graph(
        graph,
        OVERHEAD_USER,
        QUERY,
        agent=agent,
        poll_interval=POLL_INTERVAL,
        pause_timeout=PAUSE_TIMEOUT,
        result_storage=storage,
    )
    wall = time.perf_counter() - started
    metrics = result["metrics"]
    expected = dict.fromkeys(graph.order, 1)
    if dict(RECORDER.executions) != expected or metrics["tool_executions"] != len(graph):
        raise RuntimeError(f"persona run: unexpected executions {dict(RECORDER.executions)}")
    if metrics["clarifications"]:
        raise RuntimeError("persona run: the agent asked a question; the memory seed is off")
    return _sample(wall, metrics["seconds"], agent.decide_seconds)


def bare_run(nodes: int, storage: Path, variant: str = "bare") -> Sample:
    """One run of the bare chain (or a variant); checks every node ran once."""
    _reset()
    agent = LIVE.get("agent")
    decide_before = agent.decide_seconds if agent else 0.0
    started = time.perf_counter()
    result = bare_chain(first=1, last=nodes, storage=storage, variant=variant)
    wall = time.perf_counter() - started
    if sum(RECORDER.executions.values()) != nodes or len(result["outputs"]) != nodes:
        raise RuntimeError(f"{variant} run: unexpected executions {dict(RECORDER.executions)}")
    decide = (agent.decide_seconds if agent else 0.0) - decide_before
    return _sample(wall, result["seconds"], decide)


def measure_overhead(agent: TimedAgent, nodes: int, reps: int, storage: Path) -> Overhead:
    graph = chain_graph(1, nodes)
    overhead = Overhead(nodes)
    progress("warm-up: one 3-node run of each kind ...")
    persona_run(agent, chain_graph(1, 3), storage)
    bare_run(3, storage)
    for rep in range(reps):
        for kind in ("persona", "bare") if rep % 2 == 0 else ("bare", "persona"):
            progress(f"part 1, rep {rep + 1}/{reps}: {kind} chain of {nodes} ...")
            if kind == "persona":
                sample = persona_run(agent, graph, storage)
                overhead.persona.append(sample)
            else:
                sample = bare_run(nodes, storage)
                overhead.bare.append(sample)
            progress(f"  {sample.wall:.2f} s end to end, {sample.body:.2f} s in the flow body")
    return overhead


def measure_variants(overhead: Overhead, reps: int, storage: Path) -> None:
    """Run the extra-task and agent-inside variants of the bare chain, alternately."""
    bare_run(3, storage, "extra-task")
    bare_run(3, storage, "agent-inside")
    for rep in range(reps):
        for variant in VARIANTS[1:] if rep % 2 == 0 else VARIANTS[:0:-1]:
            progress(f"variants, rep {rep + 1}/{reps}: {variant} chain of {overhead.nodes} ...")
            sample = bare_run(overhead.nodes, storage, variant)
            overhead.variants.setdefault(variant, []).append(sample)
            progress(f"  {sample.wall:.2f} s end to end, {sample.body:.2f} s in the flow body")


def _runs(samples: list[Sample], what: str) -> str:
    return ", ".join(f"{getattr(s, what):.2f}" for s in samples)


def _backoffs(samples: list[Sample]) -> str:
    """The client's 503 back-offs over ``samples``: how many, and their sleep."""
    count = sum(s.backoffs for s in samples)
    return f"{count:>2} ({sum(s.backoff_seconds for s in samples):4.1f} s)"


def _collections(samples: list[Sample]) -> str:
    """How many full garbage collections ``samples`` had, and their seconds."""
    return f"{sum(s.full_gcs for s in samples)} ({sum(s.gc_seconds for s in samples):.2f} s)"


def _without_collections(overhead: Overhead) -> str:
    """The flow-body ratio of the runs no full collection fell in (informative)."""
    persona = [s for s in overhead.persona if not s.full_gcs]
    bare = [s for s in overhead.bare if not s.full_gcs]
    if not persona or not bare:
        return "too few runs without one to compare"
    return (
        f"the runs without one, {len(persona)} persona and {len(bare)} bare: flow-body ratio "
        f"{median(persona, 'body') / median(bare, 'body'):.3f}x (informative: persona runs "
        f"leave more objects for the collector, so they bring the next full collection sooner)"
    )


def report_overhead(overhead: Overhead, reps: int) -> bool:
    """Print part 1; return whether the bar is met."""
    n = overhead.nodes
    print(f"== part 1: overhead of a {n}-node chain (medians of {reps} runs each, interleaved)")
    print(
        f"{'':18} | {'flow body s':>11} | {'end to end s':>12} | {'503 back-offs':>13} | "
        "all runs: body s; end to end s"
    )
    for name, samples in (
        ("persona nodes", overhead.persona),
        ("bare Prefect tasks", overhead.bare),
    ):
        print(
            f"{name:18} | {median(samples, 'body'):>11.2f} | {median(samples, 'wall'):>12.2f} | "
            f"{_backoffs(samples):>13} | {_runs(samples, 'body')}; {_runs(samples, 'wall')}"
        )
    p_body, b_body = median(overhead.persona, "body"), median(overhead.bare, "body")
    p_wall, b_wall = median(overhead.persona, "wall"), median(overhead.bare, "wall")
    print(
        f"per-node overhead: {(p_body - b_body) / n * 1000:.1f} ms in the flow body, "
        f"{(p_wall - b_wall) / n * 1000:.1f} ms end to end; of it PersonaAgent.decide "
        f"{median(overhead.persona, 'decide') / n * 1000:.2f} ms/node (the tool itself: "
        f"{median(overhead.persona, 'tools') / n * 1000:.3f} ms/node)"
    )
    p_span, b_span = median(overhead.persona, "span"), median(overhead.bare, "span")
    print(
        f"where in the body: the tools' span (first tool's start to last tool's end) "
        f"{p_span:.2f} s against {b_span:.2f} s ({(p_span - b_span) / n * 1000:+.1f} ms/node); "
        f"before the first tool and after the last {(p_body - p_span) * 1000:.0f} ms against "
        f"{(b_body - b_span) * 1000:.0f} ms"
    )
    print(
        f"full garbage collections during the runs: persona {_collections(overhead.persona)}, "
        f"bare {_collections(overhead.bare)}; {_without_collections(overhead)}"
    )
    print(
        f"end-to-end ratio (informative: sync flows end on whole-second heartbeat steps, and "
        f"503 back-offs land mostly outside the body): {p_wall / b_wall:.2f}x"
    )
    bar = BARS[bool(TOOL_SECONDS[0])]
    ok = overhead.ratio <= bar
    verdict = "ok" if ok else "MISSED"
    print(f"overhead ratio, flow body: {overhead.ratio:.3f}x (bar: <= {bar:.2f}x) {verdict}")
    return ok


def report_variants(overhead: Overhead, reps: int) -> None:
    """Print the decomposition of the per-node overhead by the variants."""
    n = overhead.nodes
    bare = median(overhead.bare, "body")
    print()
    print(f"== where the per-node overhead goes: variants of the bare chain ({reps} runs each)")
    print(f"{'':46} | {'body s':>6} | {'vs bare':>7} | {'+ms/node':>8} | all runs body s")
    rows = [
        ("bare chain (part 1)", overhead.bare),
        ("+ a trivial persisted sync task per node", overhead.variants["extra-task"]),
        ("persona nodes (part 1)", overhead.persona),
        ("one task per node, agent called inside it", overhead.variants["agent-inside"]),
    ]
    for label, samples in rows:
        body = median(samples, "body")
        print(
            f"{label:46} | {body:>6.2f} | {body / bare:>6.2f}x | "
            f"{(body - bare) / n * 1000:>8.1f} | {_runs(samples, 'body')}"
        )
    total = (median(overhead.persona, "body") - bare) / n * 1000
    agent_ms = median(overhead.persona, "decide") / n * 1000
    print(
        f"of the persona overhead of {total:.1f} ms/node: the agent's decide {agent_ms:.1f} ms "
        f"(in the flow body, before the first node is submitted), the rest "
        f"{total - agent_ms:.1f} ms (our glue: kept steps, larger inputs and results)"
    )


# -- profile -------------------------------------------------------------------------------


def profile(run: Callable[[], Any]) -> tuple[float, pstats.Stats, pstats.Stats]:
    """Run ``run`` under cProfile in this thread and in every thread it starts.

    Returns the wall time, the main thread's stats and the stats of the other threads.
    """
    profilers: list[cProfile.Profile] = []
    lock = threading.Lock()

    def start_in_thread(frame: Any, event: str, arg: Any) -> None:
        # Called on a new thread's first event; enable() replaces this hook there.
        profiler = cProfile.Profile()
        with lock:
            profilers.append(profiler)
        profiler.enable()

    main = cProfile.Profile()
    threading.setprofile(start_in_thread)
    started = time.perf_counter()
    main.enable()
    try:
        run()
    finally:
        main.disable()
        threading.setprofile(None)
    wall = time.perf_counter() - started
    main_stats = pstats.Stats(main)
    with lock:
        others = pstats.Stats(*profilers) if profilers else pstats.Stats(cProfile.Profile())
    return wall, main_stats, others


def cumulative(stats: pstats.Stats, file_part: str, name: str) -> tuple[float, int]:
    """Cumulative seconds and calls of the functions ``name`` in files containing ``file_part``."""
    seconds, calls = 0.0, 0
    for key, (_, nc, _, ct, _) in stats.stats.items():  # type: ignore[attr-defined]
        if key[2] == name and file_part in key[0].replace("\\", "/"):
            seconds += ct
            calls += nc
    return seconds, calls


_WAITS = ("acquire", "sleep", "join", "'get' of '_queue", "poll", "select", "'wait'")


def top_own_time(stats: pstats.Stats, count: int) -> list[tuple[float, int, str]]:
    """The functions with the most own time, waiting primitives left out."""
    rows = []
    for key, (_, nc, tt, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        if key[0] == "~" and any(word in key[2] for word in _WAITS):
            continue
        path = key[0].replace("\\", "/")
        for marker in ("site-packages/", "autopersona_flows/", "lib/python3"):
            if marker in path:
                path = path.split(marker, 1)[1]
                break
        where = key[2] if key[0] == "~" else f"{path}:{key[1]}({key[2]})"
        rows.append((tt, nc, where))
    return sorted(rows, reverse=True)[:count]


def report_profile(agent: TimedAgent, overhead: Overhead, storage: Path) -> None:
    """Profile one persona run and print where its time goes."""
    n = overhead.nodes
    graph = chain_graph(1, n)
    progress("profiling one persona run (cProfile, all threads) ...")
    wall, main, others = profile(lambda: persona_run(agent, graph, storage))
    print()
    print(
        f"== cProfile of one {n}-node persona run: {wall:.2f} s under the profiler "
        f"(unprofiled median end to end {median(overhead.persona, 'wall'):.2f} s); "
        f"times are inflated by the profiler, compare them with each other"
    )

    cum = cumulative
    flows, prefect = "autopersona_flows/flows/", "prefect/"
    body, _ = cum(main, flows + "flow.py", "persona_graph")
    settle, _ = cum(main, flows + "settle.py", "settle")
    settle_all, _ = cum(main, flows + "settle.py", "settle_all")
    kept, calls = cum(main, flows + "settle.py", "kept")
    agent_decide, _ = cum(main, "autopersona_flows/agent/agent.py", "decide")
    parameters, _ = cum(main, flows + "calls.py", "parameters")
    run_task, _ = cum(main, flows + "calls.py", "run_task")
    submit, submits = cum(main, prefect + "tasks.py", "submit")
    waited, _ = cum(main, prefect + "futures.py", "wait")
    results, _ = cum(main, prefect + "futures.py", "result")
    artifact, _ = cum(main, flows + "reports.py", "write_tables")
    runs, n_runs = cum(others, prefect + "task_engine.py", "run_task_sync")
    our_run, _ = cum(others, flows + "calls.py", "_run")
    tool, _ = cum(others, "flow_overhead.py", "chain_tool")

    def row(label: str, seconds: float, note: str = "") -> None:
        print(f"  {label:64} {seconds:6.2f} s {seconds / n * 1000:7.1f} ms/node {note}")

    print("flow body, main thread (every node is settled here):")
    row("persona_graph body", body)
    row("  Settler.settle (nodes with a requirement)", settle)
    row("  Settler.settle_all (the early check, the nodes nobody asks about)", settle_all)
    row(f"    kept steps ({calls} calls, the result store around deciding)", kept)
    row("  of these, PersonaAgent.decide (retrieval and policy)", agent_decide)
    row("  run_task and NodeCall.parameters (our code)", run_task + parameters)
    row(f"  Task.submit of the run tasks ({submits} calls)", submit)
    row("  waiting for the run chain, reading its results", waited + results)
    row("  tables artifacts (in a thread of their own)", artifact)
    print("task threads:")
    row(f"run tasks, run_task_sync ({n_runs} calls, incl. waiting for upstream)", runs)
    row("  our run function (NodeCall, NodeContext, JSON check)", our_run - tool)
    row("  the tool", tool)
    print(f"client 503 back-offs: {BACKOFFS.count} ({BACKOFFS.seconds:.1f} s of sleep)")
    print("most own time in the main thread (waits left out; a system call's time includes")
    print("re-acquiring the GIL from the task threads):")
    for seconds, ncalls, where in top_own_time(main, 6):
        print(f"  {seconds:6.2f} s {ncalls:8} calls  {where}")


# -- part 2: replay after a pause ----------------------------------------------------------


class Person:
    """Answers every paused persona-graph run whose pause key belongs to ``node``."""

    def __init__(self, node: str, answer: str) -> None:
        self.prefix = f"clarify-{node}-"
        self.answer = answer
        self.stop = threading.Event()
        self.answered: list[str] = []
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> Person:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        if self.error is not None:
            raise RuntimeError(f"the answering thread failed: {self.error!r}")

    def _serve(self) -> None:
        try:
            while not self.stop.is_set():
                for waiting in pending_clarifications():
                    run_id = str(waiting.flow_run_id)
                    if waiting.key.startswith(self.prefix) and run_id not in self.answered:
                        RECORDER.answered.set()
                        answer_clarification(run_id, self.answer)
                        self.answered.append(run_id)
                self.stop.wait(0.25)
        except BaseException as exc:  # reported by __exit__
            self.error = exc


@dataclass
class Replay:
    nodes: int
    pause_at: int
    first_before: Counter[str] = field(default_factory=Counter)
    first_after: Counter[str] = field(default_factory=Counter)
    first: Sample | None = None
    replays: list[Sample] = field(default_factory=list)
    replay_executions: list[Counter[str]] = field(default_factory=list)
    replay_metrics: list[dict[str, Any]] = field(default_factory=list)
    asked_again: int = 0
    fresh: list[Sample] = field(default_factory=list)


def resume_user_run(agent: TimedAgent, graph: TaskGraph, storage: Path, **kw: Any) -> Any:
    """Run ``graph`` for the resume user; returns the time, the result and who answered."""
    RECORDER.reset()
    BACKOFFS.reset()
    with Person(node_id(graph_pause_at(graph)), ANSWER) as person:
        started = time.perf_counter()
        result = run_persona_graph(
            graph,
            RESUME_USER,
            QUERY,
            agent=agent,
            poll_interval=POLL_INTERVAL,
            pause_timeout=PAUSE_TIMEOUT,
            result_storage=storage,
            **kw,
        )
        wall = time.perf_counter() - started
    sample = Sample(
        wall,
        result["metrics"]["seconds"],
        backoffs=BACKOFFS.count,
        backoff_seconds=BACKOFFS.seconds,
    )
    return sample, result, person.answered


def graph_pause_at(graph: TaskGraph) -> int:
    """The index of the node that has the unanswered requirement."""
    return next(int(n.id[1:]) for n in graph.nodes.values() if UNANSWERED in n.requires)


def measure_replay(
    agent: TimedAgent, nodes: int, pause_at: int, reps: int, storage: Path
) -> Replay:
    graph = chain_graph(1, nodes, ask_at=pause_at)
    rest = chain_graph(pause_at, nodes, ask_at=pause_at)
    replay = Replay(nodes, pause_at)
    progress(f"part 2: first run of {nodes} nodes, pausing at node {pause_at} ...")
    replay.first, first, answered = resume_user_run(agent, graph, storage, episode_id=EPISODE)
    if len(answered) != 1 or first["metrics"]["clarifications"] != 1:
        raise RuntimeError(f"the first run did not pause exactly once: {first['metrics']}")
    replay.first_after = Counter(RECORDER.after_answer)
    replay.first_before = RECORDER.executions - RECORDER.after_answer
    for rep in range(reps):
        for kind in ("replay", "fresh") if rep % 2 == 0 else ("fresh", "replay"):
            if kind == "replay":
                progress(f"part 2, rep {rep + 1}/{reps}: replay of episode {EPISODE!r} ...")
                sample, result, answered = resume_user_run(
                    agent, graph, storage, episode_id=EPISODE
                )
                replay.replays.append(sample)
                replay.replay_executions.append(Counter(RECORDER.executions))
                replay.replay_metrics.append(result["metrics"])
            else:
                progress(f"part 2, rep {rep + 1}/{reps}: fresh run of nodes {pause_at}-{nodes} ...")
                sample, result, answered = resume_user_run(agent, rest, storage)
                replay.fresh.append(sample)
            replay.asked_again += len(answered)
            progress(f"  {sample.wall:.2f} s end to end, {sample.body:.2f} s in the flow body")
    return replay


def report_replay(replay: Replay, reps: int) -> bool:
    """Print part 2; return whether no node before the pause ran again."""
    n, at = replay.nodes, replay.pause_at
    before_ids = [node_id(i) for i in range(1, at)]
    after_ids = [node_id(i) for i in range(at, n + 1)]

    def counts(counter: Counter[str], ids: list[str]) -> str:
        return f"{sum(counter[i] for i in ids)} (per node {sorted({counter[i] for i in ids})})"

    assert replay.first is not None
    print()
    print(f"== part 2: a {n}-node chain that pauses at node {at}, then a replay of its episode")
    print(
        f"first run, episode {EPISODE!r} ({replay.first.wall:.2f} s end to end, answered by "
        "this script's thread); tool executions:"
    )
    for label, counter in (
        ("before the answer", replay.first_before),
        ("after", replay.first_after),
    ):
        print(
            f"  {label:17}  nodes 1-{at - 1}: {counts(counter, before_ids)}; "
            f"nodes {at}-{n}: {counts(counter, after_ids)}"
        )
    print(f"replays as new flow runs with the same episode id ({len(replay.replays)}):")
    for i, (executions, metrics) in enumerate(
        zip(replay.replay_executions, replay.replay_metrics, strict=True)
    ):
        ran = sorted(node for node, count in executions.items() if count)
        print(
            f"  replay {i + 1}: tool executions nodes 1-{at - 1}: "
            f"{sum(executions[x] for x in before_ids)}, nodes {at}-{n}: "
            f"{sum(executions[x] for x in after_ids)} {ran or ''}; run tasks cached "
            f"{metrics['cache_hits']}/{n}; decisions made {metrics['decisions']}"
        )
    if replay.asked_again:
        print(f"  the person was asked again {replay.asked_again} times")
    print(
        f"{'':34} | {'body s':>6} | {'end to end s':>12} | {'503 back-offs':>13} | "
        "all runs: body s; end to end s"
    )
    for label, samples in (
        (f"replay of all {n} nodes", replay.replays),
        (f"fresh run of nodes {at}-{n} ({n - at + 1})", replay.fresh),
    ):
        print(
            f"{label:34} | {median(samples, 'body'):>6.2f} | {median(samples, 'wall'):>12.2f} | "
            f"{_backoffs(samples):>13} | {_runs(samples, 'body')}; {_runs(samples, 'wall')}"
        )
    print(
        f"replay / fresh run of the remaining nodes: "
        f"{median(replay.replays, 'body') / median(replay.fresh, 'body'):.2f}x in the flow "
        f"body, {median(replay.replays, 'wall') / median(replay.fresh, 'wall'):.2f}x end to end "
        f"(medians of {reps} runs each, interleaved)"
    )
    again = sum(sum(e[x] for x in before_ids) for e in replay.replay_executions)
    rest = sum(sum(e[x] for x in after_ids) for e in replay.replay_executions)
    ok = again == 0
    verdict = "ok" if ok else "FAIL"
    print(f"nodes 1-{at - 1} executed again in the replays: {again} (must be 0) {verdict}")
    note = "ok" if rest == 0 else "NOT 0: completed nodes ran again"
    print(f"nodes {at}-{n} executed again in the replays: {rest} (expected 0) {note}")
    return ok


# -- main ----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Overhead of persona nodes on Prefect, and what a replay after a pause repeats."
    )
    parser.add_argument("--nodes", type=int, default=None, help="chain length (50)")
    parser.add_argument("--pause-at", type=int, default=None, help="node that asks (25)")
    parser.add_argument("--reps", type=int, default=None, help="timed runs of each kind (5)")
    parser.add_argument(
        "--profile", action="store_true", help="break the overhead down even when the bar is met"
    )
    parser.add_argument(
        "--quick", action="store_true", help="smoke test: 10-node chains, pause at 5, 1 rep"
    )
    parser.add_argument(
        "--tool-ms", type=float, default=0.0, help="each tool also sleeps this long (0)"
    )
    args = parser.parse_args(argv)
    TOOL_SECONDS[0] = args.tool_ms / 1000
    nodes = args.nodes or (10 if args.quick else 50)
    pause_at = args.pause_at or (5 if args.quick else 25)
    reps = args.reps or (1 if args.quick else 5)
    if nodes < 2 or not 1 < pause_at <= nodes or reps < 1 or args.tool_ms < 0:
        parser.error("need --nodes >= 2, 1 < --pause-at <= --nodes, --reps >= 1 and --tool-ms >= 0")

    started = time.perf_counter()
    with get_client(sync_client=True) as client:
        client.hello()  # start the embedded server once, before any thread needs it
    progress(f"Prefect API ready in {time.perf_counter() - started:.1f} s")
    BACKOFFS.install()
    FULL_GCS.install()
    storage = _WORKDIR / "results"
    agent = LIVE["agent"] = make_agent(_WORKDIR)
    print(f"cpus: {os.cpu_count()}, load average: {os.getloadavg()[0]:.2f}")

    overhead = measure_overhead(agent, nodes, reps, storage)
    replay = measure_replay(agent, nodes, pause_at, reps, storage)
    met = overhead.ratio <= BARS[bool(TOOL_SECONDS[0])]
    explain = not met or args.profile
    if explain:
        measure_variants(overhead, reps, storage)
    print()
    report_overhead(overhead, reps)
    if explain:
        report_variants(overhead, reps)
        report_profile(agent, overhead, storage)
    replayed_ok = report_replay(replay, reps)
    print(f"\ntotal benchmark time: {time.perf_counter() - started:.0f} s")
    return 0 if met and replayed_ok else 1


if __name__ == "__main__":
    sys.exit(recorded("flow_overhead", main, keyed_by=["--tool-ms"]))
