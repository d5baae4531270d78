"""The reading-group assistant: the example graph, its tools and Ada's past tasks.

Used by ``examples/quickstart.py`` (in Python) and by the ``reading-group``
deployment in ``prefect.yaml`` (the graph as data, its tools as import paths such as
``examples.reading_group:draft``, importable wherever the package is installed with
``pip install -e .`` from this repository).

Every tool appends one JSON line (tool, flow run, process id) to the file named by
``AUTOPERSONA_EXAMPLES_WORKLOG`` when it is set, so anyone can check that no tool
ran twice, even across the processes of a suspended and resumed run.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson

from autopersona_flows import NodeContext, PersonaMemory, RawTaskRecord
from autopersona_flows.flows import GraphSpec

__all__ = [
    "GRAPH",
    "HISTORY",
    "QUERY",
    "draft",
    "format_references",
    "gather_sources",
    "share",
    "worklog",
]

WORKLOG_ENV = "AUTOPERSONA_EXAMPLES_WORKLOG"
QUERY = "Summarise the retrieval papers and share them"

HISTORY = [
    RawTaskRecord(
        user_id="ada",
        query="Summarise three papers on retrieval for my reading group",
        trace=["search library", "read abstracts", "summarise"],
        insight="Ada wants short summaries",
        state={"notes": "reading-group/notes.md"},
        persona=[
            PersonaMemory(topic="summary length", preference="under 300 words"),
            PersonaMemory(topic="tone", preference="plain and friendly", strategy="no jargon"),
        ],
    ),
    RawTaskRecord(
        user_id="ada",
        query="Share the notes with the group",
        trace=["export to PDF", "email the group"],
        state={"mailing list": "reading-group@lists.example"},
        persona=[PersonaMemory(topic="sharing channel", preference="email the reading group")],
    ),
]


def _did(context: NodeContext) -> None:
    path = os.environ.get(WORKLOG_ENV)
    if not path:
        return
    line = {"tool": context.node.id, "user": context.user_id, "pid": os.getpid()}
    with Path(path).open("ab") as log:  # one short append per call: whole lines
        log.write(orjson.dumps(line) + b"\n")


def worklog(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The lines the tools wrote to ``path`` (empty if none ran)."""
    try:
        return [orjson.loads(line) for line in Path(path).read_bytes().splitlines()]
    except FileNotFoundError:
        return []


def gather_sources(context: NodeContext) -> dict[str, Any]:
    """Find the papers to write about."""
    _did(context)
    return {"papers": ["Robertson 2009 (BM25)", "Reimers 2019 (Sentence-BERT)"]}


def draft(context: NodeContext) -> dict[str, Any]:
    """Draft the summary in the person's tone and length."""
    _did(context)
    papers = context.inputs["gather_sources"]["papers"]
    return {"summary": f"{len(papers)} papers summarised", "applied": context.guidance}


def format_references(context: NodeContext) -> dict[str, Any]:
    """Format the references in the person's citation style."""
    _did(context)
    known = context.requirement("citation style")
    style = known.value if known else "unknown"
    papers = context.inputs["gather_sources"]["papers"]
    return {"style": style, "references": [f"[{style}] {paper}" for paper in papers]}


def share(context: NodeContext) -> dict[str, Any]:
    """Share the summary the way the person prefers."""
    _did(context)
    return {"shared": True, "how": [c.text for c in context.constraints]}


GRAPH = GraphSpec.model_validate(
    {
        "nodes": [
            {
                "id": "gather_sources",
                "instruction": "Find the papers",
                "tool": "examples.reading_group:gather_sources",
            },
            {
                "id": "draft",
                "instruction": "Draft the summary",
                "tool": "examples.reading_group:draft",
                "depends_on": ["gather_sources"],
            },
            {
                "id": "format_references",
                "instruction": "Format the references",
                "tool": "examples.reading_group:format_references",
                "depends_on": ["gather_sources"],
                "requires": [{"name": "citation style", "options": ["APA", "MLA", "Chicago"]}],
            },
            {
                "id": "share",
                "instruction": "Share the summary with the group",
                "tool": "examples.reading_group:share",
                "depends_on": ["draft", "format_references"],
                "requires": [{"name": "sharing channel"}],
            },
        ]
    }
)
"""The graph as data: what the deployment's run form holds (see ``prefect.yaml``)."""
