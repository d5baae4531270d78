"""A run waiting for an answer, as those who answer see it: whom it asks, and if anything waits.

A run *paused* in-process is resumed by its own process, which polls the server
until the answer comes: if that process died, the run stays Paused for ever and an
answer would resume it into a run that nobody runs. A run *suspended* has no process
by design: a worker runs it again from its deployment once it is answered.

So while a run waits, its process keeps a heartbeat the API can read: a flow-run
input ``autopersona-waiting-<pause key>-<ms>``, written again every
`HEARTBEAT_SECONDS` (the newest written before the one before it is deleted, so one
is always there), holding a `WaitingNote` (whom it asks, the steps asked for, the
process's id and host). Its ``created`` time, set by the server, is when the process
was last seen; `liveness` calls the process gone once `MISSED_BEATS` beats are
missing. A suspended run writes the note once, without a process.

Prefect's own ``prefect.flow-run.heartbeat`` events are no substitute: they come
every 180 s by default (30 s at the least, and only if the flow's process was
started with that setting), and reading them back needs the events API, whose
events are stored asynchronously.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import shlex
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Literal, NamedTuple
from uuid import UUID

import httpx
import prefect.settings as ps
from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.client.schemas.objects import State
from prefect.logging import get_logger
from prefect.settings.profiles import load_current_profile
from pydantic import BaseModel, ConfigDict, ValidationError

from autopersona_flows import _json

__all__ = [
    "HEARTBEAT_SECONDS",
    "MISSED_BEATS",
    "Liveness",
    "Seen",
    "WaitingNote",
    "answer_command",
    "api_url",
    "last_seen",
    "liveness",
    "span_words",
    "waiting_for_answer",
]

HEARTBEAT_SECONDS = 10.0
"""Seconds between two heartbeats of a process waiting for an answer."""

MISSED_BEATS = 4
"""A paused run's process is gone once this many heartbeats in a row are missing.

Not one: a beat is an HTTP request, and a busy SQLite server makes the client retry
for seconds (PREFECT_NOTES §10).
"""

Liveness = Literal["alive", "gone", "suspended", "unknown"]
"""Whether anything will run a waiting run once it is answered.

``alive``: its process waits (a recent heartbeat); ``gone``: it was paused in a
process that is gone (no heartbeat for `MISSED_BEATS` beats, or its pause timed
out); ``suspended``: a worker runs it from its deployment once answered; ``unknown``:
paused without a heartbeat to tell (by an older version).
"""

_PREFIX = "autopersona-waiting-"


class WaitingNote(BaseModel):
    """What a waiting run notes beside its form for those who answer it.

    Attributes:
        user_id: The person asked, if the run knows.
        nodes: The node of each question of the form, in its order.
        steps: Each node in plain words (its instruction, or its id made readable).
        pid: The process waiting for the answer (``None``: suspended, none waits).
        host: That process's host.
        every: Seconds between its heartbeats (``None``: it keeps none).
    """

    model_config = ConfigDict(frozen=True)

    user_id: str | None = None
    nodes: list[str] = []
    steps: list[str] = []
    pid: int | None = None
    host: str | None = None
    every: float | None = None


class Seen(NamedTuple):
    """The latest heartbeat (or note) of a waiting run: what it said, and when."""

    note: WaitingNote
    at: datetime


def _prefix(pause_key: str) -> str:
    return f"{_PREFIX}{pause_key}-"


def _write(client: SyncPrefectClient, flow_run_id: UUID, key: str, note: WaitingNote) -> None:
    try:
        client.create_flow_run_input(flow_run_id, key, _json.dumps(note.model_dump()).decode())
    except httpx.HTTPStatusError as exc:
        if exc.response.status_code != 409:  # written already: a suspended run run again
            raise


def _delete(client: SyncPrefectClient, flow_run_id: UUID, key: str) -> None:
    try:
        client.delete_flow_run_input(flow_run_id, key)
    except httpx.HTTPStatusError as exc:
        if exc.response.status_code != 404:
            raise


@contextlib.contextmanager
def waiting_for_answer(
    flow_run_id: UUID | None, pause_key: str, note: WaitingNote, *, paused: bool
) -> Iterator[None]:
    """Note, while the block runs, that ``flow_run_id`` waits on the form of ``pause_key``.

    A paused run's process writes the note now, then again every `HEARTBEAT_SECONDS`
    from a thread, and deletes it when the block ends; a suspended run's process
    writes it once and leaves it (the process exits while the run waits). A failure
    to write is logged, never raised: the question matters more than its heartbeat.

    Args:
        flow_run_id: The waiting run (``None``: not in a flow run, nothing noted).
        pause_key: The pause key of the form it waits on.
        note: Whom it asks, and for which steps.
        paused: Whether this process waits (a pause) or leaves (a suspension).
    """
    if flow_run_id is None:
        yield
        return
    logger = get_logger(__name__)
    if not paused:
        try:
            with get_client(sync_client=True) as client:
                _write(client, flow_run_id, f"{_prefix(pause_key)}0", note)
        except Exception as exc:  # a courtesy to those who answer: the run asks anyway
            logger.warning("Could not note whom flow run %s asks: %s", flow_run_id, exc)
        yield
        return
    beating = note.model_copy(
        update={"pid": os.getpid(), "host": socket.gethostname(), "every": HEARTBEAT_SECONDS}
    )
    stop = threading.Event()
    written: list[str] = []  # the keys not deleted yet, oldest first

    def beat(client: SyncPrefectClient) -> None:
        key = f"{_prefix(pause_key)}{time.time_ns() // 1_000_000}"
        try:
            _write(client, flow_run_id, key, beating)
            written.append(key)
            while len(written) > 1:  # the new one first: there is always one to read
                _delete(client, flow_run_id, written[0])
                written.pop(0)
        except Exception as exc:  # retried at the next beat
            logger.debug("heartbeat of flow run %s failed: %s", flow_run_id, exc)

    def keep_beating() -> None:
        with get_client(sync_client=True) as client:
            while not stop.wait(HEARTBEAT_SECONDS):
                beat(client)
            for key in written:
                with contextlib.suppress(Exception):  # tidiness only: a stale beat is harmless
                    _delete(client, flow_run_id, key)

    with get_client(sync_client=True) as client:
        beat(client)  # before the pause: a run listed as waiting has a heartbeat already
    # The thread needs this thread's settings (a test server's PREFECT_API_URL, say),
    # which are context variables: a new thread would start without them.
    thread = threading.Thread(
        target=contextvars.copy_context().run, args=(keep_beating,), daemon=True
    )
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)


def last_seen(client: SyncPrefectClient, flow_run_id: UUID, pause_key: str) -> Seen | None:
    """The newest note of run ``flow_run_id`` waiting on ``pause_key``'s form, if any."""
    inputs = client.filter_flow_run_input(
        flow_run_id, key_prefix=_prefix(pause_key), limit=50, exclude_keys=set()
    )
    seen: Seen | None = None
    for stored in inputs:
        if stored.created is None or (seen is not None and stored.created <= seen.at):
            continue
        try:
            seen = Seen(WaitingNote.model_validate_json(stored.value), stored.created)
        except ValidationError:
            continue  # not a note of ours
    return seen


def liveness(state: State, seen: Seen | None, now: datetime | None = None) -> Liveness:
    """Whether anything will run the waiting run in ``state`` once it is answered.

    Args:
        state: The run's state (Paused or Suspended).
        seen: Its latest heartbeat (`last_seen`).
        now: The time to judge at (default: now).
    """
    if state.name == "Suspended" or state.state_details.pause_reschedule:
        return "suspended"
    now = now or datetime.now(UTC)
    ends = state.state_details.pause_timeout
    if ends is not None and now > ends + timedelta(seconds=HEARTBEAT_SECONDS):
        return "gone"  # its process gave up waiting (or died): Prefect would fail it
    if seen is None or seen.note.every is None:
        return "unknown"
    late = (now - seen.at).total_seconds() > MISSED_BEATS * seen.note.every
    return "gone" if late else "alive"


def span_words(span: timedelta) -> str:
    """``span`` as a person says it, roughly: ``"40 s"``, ``"3 min"``, ``"2 h"``, ``"5 days"``."""
    seconds = max(0, int(span.total_seconds()))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 2 * 3600:
        return f"{seconds // 60} min"
    if seconds < 2 * 86400:
        return f"{seconds // 3600} h"
    return f"{seconds // 86400} days"


def api_url() -> str:
    """The address of the Prefect API this process uses (an ephemeral server's too)."""
    url = ps.PREFECT_API_URL.value()
    if not url:
        with get_client(sync_client=True) as client:
            url = str(client.api_url)
    return str(url).rstrip("/")


def answer_command(flow_run_id: UUID | str, fields: Sequence[tuple[str, Sequence[str]]]) -> str:
    """The shell command that answers run ``flow_run_id``, its answers left to fill in.

    ``PREFECT_API_URL=...`` leads it when this process's API is not the one the
    active Prefect profile names (an ephemeral server on a random port, a test
    server, a URL from the environment): a shell elsewhere would not find the run.

    Args:
        flow_run_id: The waiting run.
        fields: Each field of its form with its options (none: free text).
    """

    def blank(options: Sequence[str]) -> str:
        return f"<{'|'.join(options)}>" if options else "<your answer>"

    if len(fields) == 1:
        answers = [shlex.quote(blank(fields[0][1]))]
    else:
        answers = [shlex.quote(f"{name}={blank(options)}") for name, options in fields]
    command = f"autopersona answer {flow_run_id} {' '.join(answers)}"
    url = api_url()
    try:
        profiled = load_current_profile().settings.get(ps.PREFECT_API_URL)
    except Exception:  # an unreadable profiles file: say the address, then
        profiled = None
    if profiled is not None and str(profiled).rstrip("/") == url:
        return command
    return f"PREFECT_API_URL={shlex.quote(url)} {command}"
