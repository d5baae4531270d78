"""Deployable entrypoint: run a persona-aware task graph given as data.

Deployed by ``prefect.yaml`` as ``persona-graph-runner/reading-group``. The run form
in the Prefect UI is typed by `GraphSpec`: nodes with tool import paths (importable
where the worker runs), dependencies and requirements; ``user_id``; ``query``; an
optional ``episode_id``. The agent, store and pause behaviour come from the
``PREFECT_INTEGRATIONS_AUTOPERSONA_*`` settings of the worker's environment; a
clarification suspends the run until someone answers in the resume dialog (or with
``autopersona answer``).

A malformed graph never reaches a tool: the run form (and the server) refuse what the
schema can say, the tools from other modules included if ``prefect deploy`` ran with
the worker's ``TOOL_MODULES``; a cycle, an unknown dependency or a repeated id fails
Prefect's parameter check when the run starts, with the reason in the state message.
"""

from autopersona_flows.flows import graph_runner

__all__ = ["graph_runner"]
