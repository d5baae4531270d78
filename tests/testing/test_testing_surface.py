"""``autopersona_flows.testing`` loads only what a name needs; the in-memory store stays home."""

from __future__ import annotations

import ast
import copy
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from autopersona_flows import testing
from autopersona_flows.memory.records import PersonaMemory
from autopersona_flows.testing import InMemoryMemoryStore

LOADED = (
    "import sys\n"
    "def loaded():\n"
    "    return sorted({n.partition('.')[0] for n in sys.modules} & {'prefect', 'pytest'})\n"
)


def test_the_store_the_policy_and_the_tool_load_neither_prefect_nor_pytest() -> None:
    code = LOADED + (
        "from autopersona_flows.testing import InMemoryMemoryStore, RecordingTool\n"
        "from autopersona_flows.testing import ScriptedPolicy, Clarify, Proceed\n"
        "print(loaded())\n"
        "from autopersona_flows.testing import MemoryStoreConformance\n"
        "print(loaded())\n"
        "from autopersona_flows.testing import answering\n"
        "print(loaded())\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.splitlines() == ["[]", "['pytest']", "['prefect', 'pytest']"]


def test_what_type_checkers_see_is_what_the_package_imports() -> None:
    # The three lists of autopersona_flows/_lazy.py: __all__, TYPE_CHECKING, exports().
    tree = ast.parse(Path(testing.__file__).read_text(encoding="utf-8"))
    (block,) = [n for n in tree.body if isinstance(n, ast.If)]
    for_checkers = {
        n.module: tuple(alias.name for alias in n.names)
        for n in block.body
        if isinstance(n, ast.ImportFrom)
    }
    (bind,) = block.orelse
    assert isinstance(bind, ast.Assign)
    assert isinstance(bind.value, ast.Call)
    assert ast.literal_eval(bind.value.args[1]) == for_checkers
    names = sorted(name for names in for_checkers.values() for name in names)
    assert sorted(testing.__all__) == names
    for name in names:
        assert getattr(testing, name).__module__.startswith("autopersona_flows.testing.")


def test_the_in_memory_store_refuses_to_be_copied_out_of_its_process() -> None:
    store = InMemoryMemoryStore()
    store.add("ada", PersonaMemory(topic="tone", preference="formal"))
    for copying in (pickle.dumps, copy.deepcopy):
        with pytest.raises(TypeError, match="use a JsonlMemoryStore"):
            copying(store)
    assert repr(store) == "InMemoryMemoryStore(users=1)"
