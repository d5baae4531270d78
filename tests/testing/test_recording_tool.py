"""`RecordingTool` records each call (in memory, or in a file every process appends to)."""

from __future__ import annotations

import os
import pickle
import threading
from pathlib import Path
from typing import Any

import pytest

from autopersona_flows.agent.decisions import NodeInfo
from autopersona_flows.flows.context import NodeContext, RequirementValue
from autopersona_flows.flows.graph import import_path, resolve_tool
from autopersona_flows.testing import RecordingTool, ToolCall, recording_tool


def context(node: str, **requirements: str) -> NodeContext:
    return NodeContext(
        node=NodeInfo(id=node),
        user_id="ada",
        query="Finish my paper",
        inputs={"fetch": {"sources": 3}} if node != "fetch" else {},
        requirements={
            name: RequirementValue(name=name, value=value, source="memory")
            for name, value in requirements.items()
        },
    )


@recording_tool
def summarise(ctx: NodeContext) -> dict[str, Any]:
    """A tool defined the way a task runner of other processes can import it."""
    return {"node": ctx.node.id}


def test_each_call_is_recorded_with_what_the_tool_was_given() -> None:
    tool = RecordingTool({"done": True})
    assert tool(context("fetch")) == {"done": True}
    assert tool(context("draft", style="APA")) == {"done": True}
    assert tool(context("draft", style="MLA")) == {"done": True}
    assert tool.calls == [
        ToolCall(node_id="fetch", user_id="ada", inputs={}, requirements={}, pid=os.getpid()),
        ToolCall(
            node_id="draft",
            user_id="ada",
            inputs={"fetch": {"sources": 3}},
            requirements={"style": "APA"},
            pid=os.getpid(),
        ),
        ToolCall(
            node_id="draft",
            user_id="ada",
            inputs={"fetch": {"sources": 3}},
            requirements={"style": "MLA"},
            pid=os.getpid(),
        ),
    ]
    assert (tool.count(), tool.count("draft"), tool.count("send")) == (3, 2, 0)
    assert tool.counts() == {"fetch": 1, "draft": 2}
    tool.reset()
    assert (tool.calls, tool.counts()) == ([], {})


def test_a_function_computes_what_it_returns_and_a_failing_call_still_counts() -> None:
    def style(ctx: NodeContext) -> str:
        value = ctx.requirement("style")
        if value is None:
            raise RuntimeError("no style")
        return f"cited in {value.value}"

    tool = RecordingTool(style)
    assert tool(context("draft", style="APA")) == "cited in APA"
    with pytest.raises(RuntimeError, match="no style"):
        tool(context("draft"))
    assert tool.count("draft") == 2  # the attempt that raised (a retry's first) counts


def test_calls_from_many_threads_and_objects_meet_in_the_log(tmp_path: Path) -> None:
    log = tmp_path / "calls.jsonl"
    ours, theirs = RecordingTool(log=log), RecordingTool(log=lambda: os.fspath(log))
    threads = [
        threading.Thread(target=lambda tool=tool, n=n: [tool(context(f"n{n}")) for _ in range(25)])
        for n, tool in enumerate([ours, theirs] * 4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    # Each object (as each process would) reads every call from the log, whole lines only.
    assert ours.counts() == theirs.counts() == {f"n{n}": 25 for n in range(8)}
    assert len(log.read_bytes().splitlines()) == 200
    theirs.reset()
    assert not log.exists()
    assert ours.calls == []


def test_a_log_named_by_the_environment_is_read_at_each_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tool = RecordingTool("ok", log=lambda: os.environ.get("RECORDING_TOOL_TEST_LOG"))
    tool(context("fetch"))  # no log yet: in memory only
    assert tool.count("fetch") == 1
    monkeypatch.setenv("RECORDING_TOOL_TEST_LOG", str(tmp_path / "log.jsonl"))
    tool(context("draft"))
    assert tool.counts() == {"draft": 1}  # with a log, the log's calls (every process's)


def test_a_decorated_tool_is_imported_by_its_path_as_itself() -> None:
    path = import_path(summarise, "summarise")
    assert path == f"{__name__}:summarise"
    assert resolve_tool(path) is summarise
    assert summarise(context("outline")) == {"node": "outline"}
    assert summarise.count("outline") == 1
    assert (
        summarise.__doc__
        == "A tool defined the way a task runner of other processes can import it."
    )


def test_a_tool_pickles_as_a_task_runner_of_other_processes_ships_it() -> None:
    # A graph holds its tools, and a process pool pickles the flow's parameters.
    # Our own bytes, just made (S301). By reference: the module's own object comes back.
    assert pickle.loads(pickle.dumps(summarise)) is summarise  # noqa: S301
    plain = RecordingTool({"done": True})
    plain(context("fetch"))
    copy = pickle.loads(pickle.dumps(plain))  # noqa: S301
    assert copy is not plain
    assert (copy.returns, copy.counts()) == ({"done": True}, {"fetch": 1})
    copy(context("draft"))  # with a lock of its own
    assert (copy.counts(), plain.counts()) == ({"fetch": 1, "draft": 1}, {"fetch": 1})


def test_an_async_function_is_refused() -> None:
    async def later(ctx: NodeContext) -> str:
        return "never"

    with pytest.raises(TypeError, match="records sync tools"):
        RecordingTool(later)
