"""What users need to test their own flows, agents and stores.

* `InMemoryMemoryStore`: a `MemoryStore` in process memory, passing the conformance suite.
* `ScriptedPolicy`: decisions scripted per node (`Clarify` asks, `Proceed` or a mapping
  of requirement values goes ahead), recording the requests it was given.
* `RecordingTool` (and the `recording_tool` decorator): a node's tool that records each
  call, in memory or in a file that every process of a task runner appends to.
* `answering`: a person in a background thread, answering the questions runs ask.
* `MemoryStoreConformance`: the `MemoryStore` contract as tests any backend runs
  (needs pytest: subclass it in a module named ``test_*`` and override its ``store``
  and ``reopen`` fixtures); `assert_same_memories` compares two stores.

Each name is imported on first use (see ``autopersona_flows/_lazy.py``): the store,
the policy and the tool load neither Prefect nor pytest; `answering` loads Prefect.
For detailed assertion messages, call
``pytest.register_assert_rewrite("autopersona_flows.testing")`` in your ``conftest.py``.

`autopersona_flows.testing.llama.llama_server` serves SmolLM2 through llama.cpp on
loopback, for testing an LLM judge against a real OpenAI-compatible server.
"""

from typing import TYPE_CHECKING

from autopersona_flows._lazy import exports

if TYPE_CHECKING:
    from autopersona_flows.testing.answers import (
        Answering,
        Question,
        UnansweredQuestionError,
        answering,
    )
    from autopersona_flows.testing.comparisons import assert_same_memories
    from autopersona_flows.testing.conformance import MemoryStoreConformance
    from autopersona_flows.testing.policies import (
        Clarify,
        Proceed,
        ScriptedPolicy,
        UnscriptedNodeError,
    )
    from autopersona_flows.testing.stores import InMemoryMemoryStore
    from autopersona_flows.testing.tools import RecordingTool, ToolCall, recording_tool
else:
    __getattr__, __dir__ = exports(
        __name__,
        {
            "autopersona_flows.testing.answers": (
                "Answering",
                "Question",
                "UnansweredQuestionError",
                "answering",
            ),
            "autopersona_flows.testing.comparisons": ("assert_same_memories",),
            "autopersona_flows.testing.conformance": ("MemoryStoreConformance",),
            "autopersona_flows.testing.policies": (
                "Clarify",
                "Proceed",
                "ScriptedPolicy",
                "UnscriptedNodeError",
            ),
            "autopersona_flows.testing.stores": ("InMemoryMemoryStore",),
            "autopersona_flows.testing.tools": ("RecordingTool", "ToolCall", "recording_tool"),
        },
    )

__all__ = [
    "Answering",
    "Clarify",
    "InMemoryMemoryStore",
    "MemoryStoreConformance",
    "Proceed",
    "Question",
    "RecordingTool",
    "ScriptedPolicy",
    "ToolCall",
    "UnansweredQuestionError",
    "UnscriptedNodeError",
    "answering",
    "assert_same_memories",
    "recording_tool",
]
