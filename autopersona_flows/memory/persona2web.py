"""Adapter for Persona2Web-style cases: a user's task history and a new query.

A case is ``{"user_id", "history": [...], "query", "task"}``. A history item
holds ``query``, ``trace`` (or ``events``), ``outcome`` (or ``result``),
``insight``, ``task``, ``interaction`` (or ``events``), ``state`` and ``persona``
(a list of ``{topic, preference, strategy}``). Files are JSON (one case or a list
of cases) or JSONL (one case a line). Fields the adapter does not know are ignored.
The new query becomes a request to the PersonaAgent in the agent layer
(`autopersona_flows.agent.query_to_persona_request`): this layer never imports it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from autopersona_flows import _json
from autopersona_flows._validation import describe
from autopersona_flows.errors import IngestionError
from autopersona_flows.memory.records import JsonValue, RawTaskRecord, Text

__all__ = ["Persona2WebCase", "history_to_raw_tasks", "load_persona2web"]

# Where an item leaves a field out, the first fallback present stands in for it.
_FALLBACKS = {"trace": ("events",), "outcome": ("result",), "interaction": ("events",)}
_ITEM_FIELDS = ("query", "trace", "outcome", "insight", "task", "interaction", "state", "persona")
_PERSONA_FIELDS = ("topic", "preference", "strategy")


class Persona2WebCase(BaseModel):
    """One case: a user's history of completed tasks and the query to answer next.

    Attributes:
        user_id: The user.
        history: Their completed tasks, oldest first.
        query: The new request.
        task: The new task as the environment describes it.
    """

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    user_id: Text
    history: list[RawTaskRecord] = Field(default_factory=list)
    query: Text
    task: JsonValue = None


def _item(user_id: Any, raw: Any, index: int) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ValueError(f"history.{index} must be an object, got {type(raw).__name__}")
    item: dict[str, Any] = {"user_id": user_id}
    for name in _ITEM_FIELDS:
        for key in (name, *_FALLBACKS.get(name, ())):
            if key in raw:
                item[name] = raw[key]
                break
    persona = item.get("persona")
    if isinstance(persona, list):  # persona items too keep only the fields we know
        item["persona"] = [
            {k: v for k, v in p.items() if k in _PERSONA_FIELDS} if isinstance(p, dict) else p
            for p in persona
        ]
    return item


def _case(raw: Any) -> Persona2WebCase:
    if not isinstance(raw, dict):
        raise ValueError(f"a case must be an object, got {type(raw).__name__}")
    history = raw.get("history", [])
    if not isinstance(history, list):
        raise ValueError(f"history must be a list, got {type(history).__name__}")
    return Persona2WebCase.model_validate(
        {
            "user_id": raw.get("user_id"),
            "history": [_item(raw.get("user_id"), item, i) for i, item in enumerate(history)],
            "query": raw.get("query"),
            "task": raw.get("task"),
        }
    )


def _describe(exc: ValidationError | ValueError) -> str:
    return describe(exc) if isinstance(exc, ValidationError) else str(exc)


def load_persona2web(path: str | Path) -> list[Persona2WebCase]:
    """Read every case of a Persona2Web file (``.json`` or ``.jsonl``).

    Raises:
        IngestionError: If the file cannot be read or parsed, or a case is
            malformed; the message names the file, the case (or line) and the field.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise IngestionError(f"cannot read {path}: {exc.strerror}") from exc
    if path.suffix == ".jsonl":
        entries = [
            (f"line {n}", line) for n, line in enumerate(data.split(b"\n"), start=1) if line.strip()
        ]
    else:
        entries = [("file", data)]
    cases = []
    for where, raw_bytes in entries:
        try:
            raw = _json.loads(raw_bytes)
        except _json.JSONDecodeError as exc:
            raise IngestionError(f"{path} ({where}): not valid JSON ({exc})") from None
        items = raw if isinstance(raw, list) and where == "file" else [raw]
        for i, item in enumerate(items):
            label = f"case {i}" if where == "file" else where
            try:
                cases.append(_case(item))
            except (ValidationError, ValueError) as exc:
                raise IngestionError(f"{path} ({label}): {_describe(exc)}") from None
    return cases


def history_to_raw_tasks(case: Persona2WebCase) -> list[RawTaskRecord]:
    """The case's history as task records, ready for `ingest_task_history`."""
    return list(case.history)
