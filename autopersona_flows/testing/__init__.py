"""The memory-store conformance suite: the `MemoryStore` contract as tests any backend runs.

Needs pytest, which is in the ``dev`` extra; nothing else in the package imports this
module. Subclass `MemoryStoreConformance` in a test module (the name must start with
``Test``) and override its ``store`` and ``reopen`` fixtures; each guarantee is one
small test named for it. For detailed assertion messages, call
``pytest.register_assert_rewrite("autopersona_flows.testing")`` in your ``conftest.py``.

`autopersona_flows.testing.llama.llama_server` serves SmolLM2 through llama.cpp on
loopback, for testing an LLM judge against a real OpenAI-compatible server.
"""

from autopersona_flows.testing.comparisons import assert_same_memories
from autopersona_flows.testing.conformance import MemoryStoreConformance

__all__ = ["MemoryStoreConformance", "assert_same_memories"]
