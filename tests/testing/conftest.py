"""Fixtures for the tests of `autopersona_flows.testing`: a Prefect test server, a fast agent.

``prefect_harness`` is the session's one, in ``tests/conftest.py``.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from autopersona_flows.agent.agent import PersonaAgent
from autopersona_flows.agent.policies import Policy
from autopersona_flows.memory.bank import MemoryBank
from autopersona_flows.memory.embedders import HashingEmbedder
from autopersona_flows.memory.protocol import MemoryStore


@pytest.fixture
def agent_over() -> Callable[..., PersonaAgent]:
    """Make an agent on a store that needs no model: hashed embeddings, and the policy given."""

    def make(store: MemoryStore, policy: Policy | None = None) -> PersonaAgent:
        return PersonaAgent(MemoryBank(store, HashingEmbedder()), policy)

    return make
