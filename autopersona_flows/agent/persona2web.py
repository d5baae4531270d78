"""Persona2Web cases as PersonaAgent requests: the agent's half of the adapter.

`autopersona_flows.memory.load_persona2web` reads the case files and
`history_to_raw_tasks` gives a case's history as task records to ingest; the new
query becomes a `PersonaRequest` here, in the layer that defines requests, since
the memory layer never imports the agent.
"""

from __future__ import annotations

from autopersona_flows.agent.decisions import NodeInfo, PersonaRequest
from autopersona_flows.memory.persona2web import Persona2WebCase
from autopersona_flows.memory.text import json_text

__all__ = ["query_to_persona_request"]


def query_to_persona_request(case: Persona2WebCase) -> PersonaRequest:
    """The case's new query as a request to the PersonaAgent (task details as its node)."""
    node = None if case.task is None else NodeInfo(id="task", instruction=json_text(case.task))
    return PersonaRequest(user_id=case.user_id, query=case.query, node=node)
