"""One question, one answer: answering a run answers every run waiting on the same question.

Two runs for one person may reach the same unanswered requirement at once (two
schedules, a replay beside a new run): each asks it, and without this the person
would answer the same question twice. So a run notes, beside the form it waits on,
whose question it is and which requirement each field asks (`note_asking`); and a
run that receives a person's answers resumes every other run waiting on a form whose
questions those answers cover, for the same person (`share_answers`), the same way
the UI's dialog or ``autopersona answer`` would. A form the answers do not cover
whole, or whose options refuse them, keeps waiting for its own answer.

Both runs still show their question (each run's log, artifact and event say what it
waits for), so nobody is left waiting if the other run is cancelled; whichever is
answered first answers both.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from uuid import UUID

import httpx
from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterState,
    FlowRunFilterStateType,
)
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.exceptions import FlowPauseTimeout, NotPausedError, ObjectNotFound
from prefect.flow_runs import resume_flow_run
from prefect.logging import get_logger

from autopersona_flows import _json

__all__ = ["note_asking", "share_answers"]

_PREFIX = "autopersona-asking-"
_PAGE = 200


def _note_key(pause_key: str) -> str:
    return f"{_PREFIX}{pause_key}"


def note_asking(
    flow_run_id: UUID, pause_key: str, user_id: str, requirements: Mapping[str, str]
) -> None:
    """Note, beside the form of ``pause_key``, whose it is and what each field asks.

    Args:
        flow_run_id: The run about to wait.
        pause_key: Its form's pause key.
        user_id: The person asked.
        requirements: Each field of the form, to the name of the requirement it asks.
    """
    note = {"user_id": user_id, "requirements": {f: r.casefold() for f, r in requirements.items()}}
    with get_client(sync_client=True) as client:
        try:
            client.create_flow_run_input(
                flow_run_id, _note_key(pause_key), _json.dumps(note).decode()
            )
        except httpx.HTTPStatusError as exc:
            if exc.response.status_code != 409:  # noted by an earlier attempt of the run
                raise


def share_answers(user_id: str, answers: Mapping[str, str], answered_run: UUID) -> list[UUID]:
    """Resume the other runs waiting on ``user_id``'s questions that ``answers`` cover.

    Args:
        user_id: The person who answered.
        answers: Each requirement answered, by name, to its answer.
        answered_run: The run that received them (never resumed here).

    Returns:
        The runs resumed.
    """
    given = {name.casefold(): answer for name, answer in answers.items()}
    waiting = FlowRunFilter(
        state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.PAUSED]))
    )
    resumed = []
    with get_client(sync_client=True) as client:
        for run in _all_runs(client, waiting):
            if run.id == answered_run:
                continue
            run_input = _covered(client, run, user_id, given)
            if run_input is None:
                continue
            try:
                resume_flow_run(run.id, run_input=run_input)
            except (ObjectNotFound, NotPausedError, FlowPauseTimeout, RuntimeError) as exc:
                # Answered or gone meanwhile, or its form refuses these answers (other
                # options): it waits for its own.
                get_logger(__name__).debug("not shared with flow run %s: %s", run.id, exc)
                continue
            resumed.append(run.id)
    return resumed


def _all_runs(client: SyncPrefectClient, runs: FlowRunFilter) -> Iterator[FlowRun]:
    """Every run ``runs`` selects, a page at a time (the API returns 200 at most)."""
    offset = 0
    while page := client.read_flow_runs(flow_run_filter=runs, offset=offset, limit=_PAGE):
        yield from page
        offset += len(page)


def _covered(
    client: SyncPrefectClient, run: FlowRun, user_id: str, given: Mapping[str, str]
) -> dict[str, str] | None:
    """The answers to ``run``'s form if it asks ``user_id`` only what ``given`` answers."""
    pause_key = run.state.state_details.pause_key if run.state else None
    if not pause_key or not pause_key.startswith("clarify-"):
        return None
    try:
        note = _json.loads(client.read_flow_run_input(run.id, _note_key(pause_key)))
    except httpx.HTTPStatusError as exc:
        if exc.response.status_code == 404:  # not one of ours, or noted by an older version
            return None
        raise
    except ValueError:
        return None
    mine = isinstance(note, dict) and note.get("user_id") == user_id
    requirements = note.get("requirements") if mine else None
    if not requirements or not isinstance(requirements, dict):
        return None
    if any(name not in given for name in requirements.values()):
        return None
    return {field: given[name] for field, name in requirements.items()}
