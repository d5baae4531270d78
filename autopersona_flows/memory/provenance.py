"""Provenance: where a memory came from, and what changed it.

A record's `MemoryRecord.provenance` says where its current content came from;
a history entry's `MemoryChange.provenance` says what made that change (the run
or the command). The two differ when a change leaves the content as it was: a
person burying a learned answer changes the record's state, not where it was
learned, so the record keeps its clarification and the history entry says
"edit".

The memory layer never imports Prefect: a flow passes its run id in as text.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any, Literal, Self, get_args

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from autopersona_flows.memory.ids import MEMORY_ID_PATTERN

__all__ = ["PROVENANCE_KINDS", "Provenance", "ProvenanceKind"]

ProvenanceKind = Literal["clarification", "ingestion", "consolidation", "edit", "maintenance"]
"""How a memory, or a change of one, came about.

- ``clarification``: a person answered a question a flow asked;
- ``ingestion``: a completed task was read from a history (a file's line);
- ``consolidation``: other memories were drawn together (a repeated choice);
- ``edit``: a person corrected it (edit, forget, bury, unbury);
- ``maintenance``: the store's upkeep (expiry, deduplication).
"""

PROVENANCE_KINDS: tuple[ProvenanceKind, ...] = get_args(ProvenanceKind)

# The fields each kind may set, besides ``kind`` and ``flow_run_id`` (any change
# may be made in a flow run).
_FIELDS: dict[str, frozenset[str]] = {
    "clarification": frozenset({"node", "question"}),
    "ingestion": frozenset({"file", "line"}),
    "consolidation": frozenset({"memories"}),
    "edit": frozenset({"command", "reason"}),
    "maintenance": frozenset({"reason"}),
}


def _valid_text(value: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"text contains a lone surrogate at index {exc.start}") from None
    return value


def _memory_id(value: str) -> str:
    if not MEMORY_ID_PATTERN.match(value):
        raise ValueError(f"{value!r} is not a memory id (26 characters of Crockford base32)")
    return value


def _unset(value: Any) -> bool:
    return value is None or value in ("", [])


# Unset fields are left out of the stored form: an entry holds only what its kind says.
_Text = Annotated[
    str | None,
    AfterValidator(lambda v: v if v is None else _valid_text(v)),
    Field(exclude_if=_unset),
]


class Provenance(BaseModel):
    """Where a memory came from, or what changed it.

    Build one with the constructor of its kind (`clarification`, `ingestion`,
    `consolidation`, `edit`, `maintenance`); a field another kind owns is an
    error, so a stored provenance never mixes two sources.

    Attributes:
        kind: How it came about (see `ProvenanceKind`).
        flow_run_id: The Prefect flow run that made it, if one did.
        node: For a clarification, the id of the node that asked, if known.
        question: For a clarification, the question the person answered.
        file: For an ingestion, the file the task was read from, if any.
        line: For an ingestion, the line of ``file`` (1-based).
        memories: For a consolidation, the ids of the memories drawn together.
        command: For an edit, the command that made it (``"autopersona edit"``);
            ``None`` for a correction made in Python.
        reason: For an edit or maintenance, why, if given.
    """

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    kind: ProvenanceKind
    flow_run_id: _Text = None
    node: _Text = None
    question: _Text = None
    file: _Text = None
    line: Annotated[int | None, Field(ge=1, exclude_if=_unset)] = None
    memories: list[Annotated[str, AfterValidator(_memory_id)]] = Field(
        default_factory=list, exclude_if=_unset
    )
    command: _Text = None
    reason: Annotated[str, AfterValidator(_valid_text), Field(exclude_if=_unset)] = ""

    @classmethod
    def clarification(
        cls, question: str, *, node: str | None = None, flow_run_id: str | None = None
    ) -> Self:
        """A person's answer to ``question``, asked at ``node`` in flow run ``flow_run_id``."""
        return cls(kind="clarification", question=question, node=node, flow_run_id=flow_run_id)

    @classmethod
    def ingestion(
        cls, file: str | None = None, line: int | None = None, *, flow_run_id: str | None = None
    ) -> Self:
        """A task read from ``file`` at ``line`` (both unknown for tasks given in Python)."""
        return cls(kind="ingestion", file=file, line=line, flow_run_id=flow_run_id)

    @classmethod
    def consolidation(cls, memories: Iterable[str], *, flow_run_id: str | None = None) -> Self:
        """Drawn together from ``memories``, by id (kept sorted)."""
        return cls(kind="consolidation", memories=sorted(set(memories)), flow_run_id=flow_run_id)

    @classmethod
    def edit(cls, reason: str = "", *, command: str | None = None) -> Self:
        """A person's correction, with ``command`` if made from the CLI."""
        return cls(kind="edit", reason=reason, command=command)

    @classmethod
    def maintenance(cls, reason: str = "", *, flow_run_id: str | None = None) -> Self:
        """The store's upkeep (an expiry, a near duplicate removed)."""
        return cls(kind="maintenance", reason=reason, flow_run_id=flow_run_id)

    def describe(self) -> str:
        """One line for a person: ``clarification at node 'book' (run 1f…): 'Which seat?'``."""
        parts: list[str] = [self.kind]
        match self.kind:
            case "clarification":
                if self.node:
                    parts.append(f"at node {self.node!r}")
                if self.question:
                    parts.append(f"of {self.question!r}")
            case "ingestion":
                if self.file:
                    parts.append(f"of {self.file}" + (f":{self.line}" if self.line else ""))
            case "consolidation":
                parts.append(f"of {', '.join(self.memories)}")
            case _:
                if self.command:
                    parts.append(f"by `{self.command}`")
        if self.flow_run_id:
            parts.append(f"in flow run {self.flow_run_id}")
        if self.reason:
            parts.append(f"({self.reason})")
        return " ".join(parts)

    @model_validator(mode="after")
    def _fields_of_kind(self) -> Self:
        allowed = _FIELDS[self.kind]
        owned = set().union(*_FIELDS.values())
        foreign = sorted(name for name in owned - allowed if not _unset(getattr(self, name)))
        if foreign:
            raise ValueError(
                f"a {self.kind} provenance takes no {', '.join(foreign)}; "
                f"its fields are {', '.join(sorted(allowed | {'flow_run_id'}))}"
            )
        if self.kind == "clarification" and not (self.question or "").strip():
            raise ValueError("a clarification provenance needs the question that was answered")
        if self.kind == "consolidation" and not self.memories:
            raise ValueError("a consolidation provenance needs the memories it drew together")
        if self.line is not None and self.file is None:
            raise ValueError("an ingestion's line needs its file")
        return self
