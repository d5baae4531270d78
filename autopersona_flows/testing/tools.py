"""`RecordingTool`: a graph node's tool that records each call, to count what really ran."""

from __future__ import annotations

import functools
import inspect
import os
import sys
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, SupportsIndex, TypeAlias, overload

from pydantic import BaseModel, ConfigDict

from autopersona_flows.memory.records import JsonValue

if TYPE_CHECKING:  # the flows package imports Prefect; a tool only reads what it is given
    from autopersona_flows.flows.context import NodeContext

__all__ = ["RecordingTool", "ToolCall", "recording_tool"]

LogPath: TypeAlias = str | os.PathLike[str]
Log: TypeAlias = LogPath | Callable[[], LogPath | None] | None


class ToolCall(BaseModel):
    """One call of a `RecordingTool`: what the tool was given, and where it ran.

    Attributes:
        node_id: The node whose tool it was.
        user_id: The person the graph ran for.
        inputs: The outputs of the nodes it depends on, by node id.
        requirements: The value of each requirement the node ran with, by name.
        pid: The process the tool ran in.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    node_id: str
    user_id: str
    inputs: dict[str, JsonValue]
    requirements: dict[str, str | None]
    pid: int


class RecordingTool:
    """A tool that records each call, then returns a value you choose.

    Each call is kept in memory and, with a ``log``, appended to a JSON-lines file
    as one write (whole lines, whichever processes append at once). Read what ran
    with `calls`, `count` and `counts`::

        tool = RecordingTool({"draft": "done"})
        graph = TaskGraph([TaskNode(id="draft", tool=tool)])
        run_persona_graph(graph, "ada", "Finish my paper", agent=agent)
        assert tool.counts() == {"draft": 1}

    On a task runner of other processes (a process pool, Dask) each worker imports
    the tool by its path, getting its own object: define it with `recording_tool`
    at the top level of a module, and give it a ``log`` that every process finds,
    e.g. ``log=lambda: os.environ["MY_TOOL_LOG"]`` (read at each call; workers
    inherit the environment). `calls` then reads the file: every process's calls.

    Args:
        returns: What each call returns (a JSON value), or a function
            ``(context) -> value`` computing it; the call is recorded before it runs,
            so a call that raises (and its retries) counts too.
        log: A JSON-lines file to append each call to, or a function returning it
            (``None``: in memory only).

    Raises:
        TypeError: If ``returns`` is an ``async def`` function: a recording tool is sync.
    """

    def __init__(self, returns: Any = None, *, log: Log = None) -> None:
        if inspect.iscoroutinefunction(returns):
            raise TypeError(
                f"{returns!r} is async; RecordingTool records sync tools: return the value "
                "from a plain function"
            )
        self.returns = returns
        self.log = log
        self._calls: list[ToolCall] = []
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        name = getattr(self, "__qualname__", None)
        return f"RecordingTool({name or repr(self.returns)})"

    def __call__(self, context: NodeContext) -> Any:
        """Record the call, then return ``returns`` (or what it computes from ``context``)."""
        call = ToolCall(
            node_id=context.node.id,
            user_id=context.user_id,
            inputs=dict(context.inputs),
            requirements={name: value.value for name, value in context.requirements.items()},
            pid=os.getpid(),
        )
        with self._lock:
            self._calls.append(call)
        path = self._log_path()
        if path is not None:
            line = call.model_dump_json().encode() + b"\n"
            descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(descriptor, line)  # one append: lines never interleave
            finally:
                os.close(descriptor)
        return self.returns(context) if callable(self.returns) else self.returns

    @property
    def calls(self) -> list[ToolCall]:
        """Every call, in order: the log file's (all processes') if there is one, else ours."""
        path = self._log_path()
        if path is None:
            with self._lock:
                return list(self._calls)
        try:
            lines = path.read_bytes().splitlines()
        except FileNotFoundError:
            return []
        return [ToolCall.model_validate_json(line) for line in lines]

    def count(self, node_id: str | None = None) -> int:
        """How many calls ran for ``node_id`` (for any node if ``None``)."""
        calls = self.calls
        return len(calls) if node_id is None else sum(c.node_id == node_id for c in calls)

    def counts(self) -> dict[str, int]:
        """How many calls ran for each node that ran, by node id."""
        return dict(Counter(call.node_id for call in self.calls))

    def reset(self) -> None:
        """Forget every call: this object's, and the log file's (which is removed)."""
        with self._lock:
            self._calls.clear()
        path = self._log_path()
        if path is not None:
            path.unlink(missing_ok=True)

    # Pickled with a flow's parameters (a graph holds its tools) when a task runner of
    # other processes ships the run's context: a tool made by `recording_tool` by
    # reference, as functions are (the process imports the module's own object);
    # any other as a copy, with a fresh lock.
    def __reduce_ex__(self, protocol: SupportsIndex) -> str | tuple[Any, ...]:
        name, module = self.__dict__.get("__qualname__"), self.__dict__.get("__module__")
        if isinstance(name, str) and getattr(sys.modules.get(str(module)), name, None) is self:
            return name
        return super().__reduce_ex__(protocol)

    def __getstate__(self) -> dict[str, Any]:
        with self._lock:
            return {**self.__dict__, "_calls": list(self._calls), "_lock": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _lock=threading.Lock())

    def _log_path(self) -> Path | None:
        found = self.log() if callable(self.log) else self.log
        return Path(found) if found is not None else None


@overload
def recording_tool(function: Callable[[NodeContext], Any], /) -> RecordingTool: ...
@overload
def recording_tool(
    function: None = None, /, *, log: Log = None
) -> Callable[[Callable[[NodeContext], Any]], RecordingTool]: ...
def recording_tool(
    function: Callable[[NodeContext], Any] | None = None, /, *, log: Log = None
) -> RecordingTool | Callable[[Callable[[NodeContext], Any]], RecordingTool]:
    """Make a function a `RecordingTool` that returns what the function returns.

    The tool takes the function's name and module, so at the top level of a module
    it can be imported by its path, as a task runner of other processes does::

        @recording_tool(log=lambda: os.environ["MY_TOOL_LOG"])
        def draft(context: NodeContext) -> dict[str, str]:
            return {"citation style": context.requirement("citation style").value}

    Args:
        function: The tool's body, ``(context) -> JSON value``.
        log: See `RecordingTool`.
    """

    def wrap(body: Callable[[NodeContext], Any]) -> RecordingTool:
        tool = RecordingTool(body, log=log)
        functools.update_wrapper(tool, body)
        return tool

    return wrap(function) if function is not None else wrap
