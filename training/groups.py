"""Answerhood groups: one requirement, the memories a person might have, and which answer it.

The training data of the judge's model (see ``training/data/README.md``). Run
``python training/groups.py FILE...`` to check files: every line must be a valid
`Group`, ids unique; a line that is not says which and why.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any, Literal, Self

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from autopersona_flows.agent.decisions import NodeInfo, Requirement
from autopersona_flows.memory.records import MemoryRecord, UtcDatetime

Label = Literal[
    "answers", "stale", "near_miss", "related", "unrelated", "other_situation", "ceased"
]


class _Model(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class GroupMemory(_Model):
    """One memory of the person, labelled for the group's requirement."""

    layer: Literal["persona", "trajectory", "workspace"]
    content: dict[str, Any]
    at: UtcDatetime
    label: Label
    value: str | None = None
    ruled_out: list[str] = Field(default_factory=list)
    note: str = ""

    @model_validator(mode="after")
    def _content(self) -> Self:
        MemoryRecord.model_validate({"layer": self.layer, "content": self.content})
        return self


class Group(_Model):
    """A requirement in one request's situation, and labelled memories."""

    id: Annotated[str, Field(min_length=1)]
    domain: str
    query: Annotated[str, Field(min_length=1)]
    node: NodeInfo
    requirement: Requirement
    names: list[str] = Field(default_factory=list)
    memories: Annotated[list[GroupMemory], Field(min_length=2)]

    @model_validator(mode="after")
    def _labels(self) -> Self:
        options = {option.casefold() for option in self.requirement.options}
        for i, memory in enumerate(self.memories):
            where = f"memories[{i}]"
            if memory.label in ("answers", "stale", "other_situation"):
                if not memory.value:
                    raise ValueError(f"{where}: a {memory.label!r} memory needs its value")
                if options and not self.requirement.allow_other:
                    if memory.value.casefold() not in options:
                        raise ValueError(f"{where}: value {memory.value!r} is none of the options")
                elif memory.value.casefold() not in _text(memory.content).casefold():
                    raise ValueError(f"{where}: value {memory.value!r} is not in the memory's text")
            unknown = {o.casefold() for o in memory.ruled_out} - options
            if unknown:
                raise ValueError(f"{where}: ruled_out names no option: {sorted(unknown)}")
        return self


def _text(value: Any) -> str:
    if isinstance(value, dict):
        return " ".join(_text(item) for item in value.values())
    if isinstance(value, list):
        return " ".join(_text(item) for item in value)
    return "" if value is None else str(value)


def read_groups(path: str | Path) -> list[Group]:
    """Read a groups file; raise ``ValueError`` naming the first bad line."""
    groups = []
    for number, line in enumerate(Path(path).read_bytes().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            groups.append(Group.model_validate(orjson.loads(line)))
        except (ValidationError, orjson.JSONDecodeError) as exc:
            raise ValueError(f"{path}:{number}: {exc}") from None
    return groups


def main(paths: list[str]) -> int:
    seen: dict[str, str] = {}
    bad = 0
    for path in paths:
        try:
            groups = read_groups(path)
        except ValueError as exc:
            print(exc)
            bad += 1
            continue
        for group in groups:
            if group.id in seen:
                print(f"{path}: id {group.id!r} also in {seen[group.id]}")
                bad += 1
            seen[group.id] = path
        labels: dict[str, int] = {}
        for group in groups:
            for memory in group.memories:
                labels[memory.label] = labels.get(memory.label, 0) + 1
        print(f"{path}: {len(groups)} groups, labels {dict(sorted(labels.items()))}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
