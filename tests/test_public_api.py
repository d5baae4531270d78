"""The exported surface is deliberate: adding or removing a name must be a visible change.

Two lists are pinned here, the top level and the memory package; everything else is
derived from the modules themselves, so a module added tomorrow is checked too: every
``__all__`` names what its module holds, and every lazy package ``__init__`` (see
``autopersona_flows/_lazy.py``) agrees with itself, resolves, and lists in ``dir()``
exactly what it exports.
"""

import ast
import importlib
import pkgutil
import subprocess
import sys
from functools import cache
from pathlib import Path
from types import ModuleType

import pytest

import autopersona_flows
import autopersona_flows.memory

PACKAGE = Path(autopersona_flows.__file__).parent
SCRIPTS = {"autopersona_flows.export_snapshot"}  # run with `python -m`: they export nothing


def test_top_level_surface() -> None:
    # What a user types: a bank and an agent, a graph or a persona task to run, the
    # answers to its questions, and the errors worth catching (the rest: errors).
    assert autopersona_flows.__all__ == [
        "AnswerRejectedError",
        "AutopersonaError",
        "ClarificationBudgetError",
        "ClarificationTimeoutError",
        "ClarifyDecision",
        "ConfigurationError",
        "Embedder",
        "EvidencePolicy",
        "FinalDecision",
        "GraphError",
        "HashingEmbedder",
        "InvalidUserIdError",
        "JsonlMemoryStore",
        "MemoryBank",
        "MemoryNotFoundError",
        "MemoryRecord",
        "MemoryStore",
        "MemoryStoreCorruptionError",
        "MemoryStoreError",
        "NodeContext",
        "NodeInfo",
        "PersonaAgent",
        "PersonaDecision",
        "PersonaMemory",
        "PersonaRequest",
        "PersonaRuntime",
        "Policy",
        "PolicyError",
        "PostgresMemoryStore",
        "RawTaskRecord",
        "Requirement",
        "RequirementValue",
        "SearchRequest",
        "StoreUnavailableError",
        "TaskGraph",
        "TaskNode",
        "TrajectoryMemory",
        "WorkspaceMemory",
        "__version__",
        "answer",
        "answer_clarification",
        "apersona_graph",
        "arun_persona_graph",
        "ask_first",
        "pending_clarifications",
        "persona_graph",
        "persona_runtime",
        "persona_task",
        "run_persona_graph",
    ]


def test_memory_surface() -> None:
    # What users of the memory layer call; the package's own plumbing is imported from
    # the module that defines it.
    assert autopersona_flows.memory.__all__ == [
        "ChatMessage",
        "Embedder",
        "ExtractedMemory",
        "Extractor",
        "FunctionEmbedder",
        "FunctionResolver",
        "HashingEmbedder",
        "HeuristicResolver",
        "JsonlMemoryStore",
        "MemoryBank",
        "MemoryBundle",
        "MemoryChange",
        "MemoryLayer",
        "MemoryRecord",
        "MemoryRetriever",
        "MemorySnapshot",
        "MemoryStore",
        "MemoryUpdater",
        "MiniLMEmbedder",
        "OpenAICompatibleExtractor",
        "PersonaMemory",
        "PostgresMemoryStore",
        "RawTaskRecord",
        "Resolver",
        "RuleExtractor",
        "ScoredMemory",
        "SearchRequest",
        "TrajectoryMemory",
        "UpdateDecision",
        "WorkspaceMemory",
        "chat_sessions",
        "erase_user",
        "ingest_task_history",
        "maintain_user",
        "open_store",
        "promote_choices",
        "retire_expired",
    ]


# --- every module's __all__ -----------------------------------------------------------------


@cache
def modules() -> tuple[ModuleType, ...]:
    """The package and every module under it, imported (as pydoc or Sphinx would)."""
    walked = pkgutil.walk_packages(autopersona_flows.__path__, "autopersona_flows.")
    return (autopersona_flows, *(importlib.import_module(info.name) for info in walked))


def is_private(name: str) -> bool:
    return any(part.startswith("_") for part in name.split(".")[1:])


def test_every_public_module_says_what_it_exports() -> None:
    # A private module may carry an __all__ (what the package takes from it, as httpx's
    # do) but need not; a public one must.
    silent = [
        m.__name__
        for m in modules()
        if not hasattr(m, "__all__") and not is_private(m.__name__) and m.__name__ not in SCRIPTS
    ]
    assert silent == []


def test_every_all_names_what_its_module_holds_once() -> None:
    wrong = []
    for module in modules():
        exported = getattr(module, "__all__", None)
        if exported is None:
            continue
        if not isinstance(exported, list) or not all(isinstance(n, str) for n in exported):
            wrong.append(f"{module.__name__}.__all__ is not a list of names")
            continue
        if len(set(exported)) != len(exported):
            wrong.append(f"{module.__name__}.__all__ repeats a name")
        wrong += [f"{module.__name__}.{n} is missing" for n in exported if not hasattr(module, n)]
        wrong += [
            f"{module.__name__}.{n} is private"
            for n in exported
            if n.startswith("_") and not (n.startswith("__") and n.endswith("__"))
        ]
    assert wrong == []


# --- the lazy package __init__s -------------------------------------------------------------


def lazy_packages() -> list[str]:
    """Every package whose ``__init__`` binds its attributes with `exports`."""
    found = []
    for init in sorted(PACKAGE.rglob("__init__.py")):
        if "= exports(" in init.read_text(encoding="utf-8"):
            parts = init.parent.relative_to(PACKAGE.parent).parts
            found.append(".".join(parts))
    return found


LAZY = lazy_packages()


def test_the_lazy_packages_are_found() -> None:
    names = ("autopersona_flows", "autopersona_flows.agent", "autopersona_flows.flows")
    assert {*names, "autopersona_flows.memory"} <= set(LAZY)


def _names(node: ast.stmt) -> list[str]:
    """The names a top-level statement binds."""
    if isinstance(node, ast.ImportFrom):
        return [alias.asname or alias.name for alias in node.names]
    if isinstance(node, ast.Assign):
        return [ast.unparse(target) for target in node.targets]
    return []


def read_init(package: str) -> tuple[ast.Module, dict[str, tuple[str, ...]], dict[str, str]]:
    """A lazy ``__init__``'s tree, its `exports` mapping and its moved names (to their module)."""
    init = PACKAGE.parent.joinpath(*package.split("."), "__init__.py")
    tree = ast.parse(init.read_text(encoding="utf-8"))
    (block,) = [
        n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"
    ]
    (bind,) = block.orelse
    assert ast.unparse(bind).startswith("__getattr__, __dir__ = exports(__name__, {")
    assert isinstance(bind, ast.Assign)
    assert isinstance(bind.value, ast.Call)
    keywords = {k.arg: ast.literal_eval(k.value) for k in bind.value.keywords}
    assert set(keywords) <= {"moved"}
    moved = {name: m for m, names in keywords.get("moved", {}).items() for name in names}
    return tree, ast.literal_eval(bind.value.args[1]), moved


@pytest.mark.parametrize("package", LAZY)
def test_what_type_checkers_see_is_what_the_package_imports(package: str) -> None:
    # __all__, the TYPE_CHECKING imports and the mapping given to exports() (see
    # autopersona_flows/_lazy.py) must name the same things, the last two module by module.
    tree, for_the_interpreter, moved = read_init(package)
    (block,) = [
        n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"
    ]
    assert all(isinstance(n, ast.ImportFrom) for n in block.body)
    for_checkers = {n.module: tuple(_names(n)) for n in block.body}
    assert for_the_interpreter == for_checkers

    lazy = [name for names in for_checkers.values() for name in names]
    on_load = {name for n in tree.body for name in _names(n)}  # defined or imported on load
    (exported,) = [ast.literal_eval(n.value) for n in tree.body if _names(n) == ["__all__"]]
    assert len(set(lazy)) == len(lazy), "a name re-exported from two modules"
    assert not set(lazy) & on_load, "a name imported both on load and on first use"
    assert sorted(exported) == sorted(set(lazy) | (on_load & set(exported)))
    assert not set(moved) & (set(exported) | on_load), "a moved name is still exported"


@pytest.mark.parametrize("package", LAZY)
def test_every_lazy_name_resolves_to_its_module_s_public_object(package: str) -> None:
    _, mapping, _ = read_init(package)
    module = importlib.import_module(package)
    for source, names in mapping.items():
        origin = importlib.import_module(source)
        for name in names:
            assert name in origin.__all__, f"{package}.{name}: not public in {source}"
            assert getattr(module, name) is getattr(origin, name), f"{package}.{name}"


@pytest.mark.parametrize("package", LAZY)
def test_a_moved_name_still_resolves_with_a_warning_saying_where_it_went(package: str) -> None:
    _, _, moved = read_init(package)
    module = importlib.import_module(package)
    for name, source in moved.items():
        origin = importlib.import_module(source)
        assert name in origin.__all__, f"{package}.{name}: not public in {source}"
        advice = f"use `from {source} import {name}`"
        with pytest.warns(DeprecationWarning, match=f"^importing {name} from {package} .*{advice}"):
            value = getattr(module, name)
        assert value is getattr(origin, name)
        assert name not in vars(module), f"{package}.{name} was kept: it would stop warning"


@pytest.mark.parametrize("package", LAZY)
def test_dir_lists_what_all_exports(package: str) -> None:
    module = importlib.import_module(package)
    exported = set(module.__all__)
    helpers = {"TYPE_CHECKING", "exports"}  # what an __init__ imports to do its work
    listed = {
        name
        for name in dir(module)
        if (not name.startswith("_") or name in exported)
        and name not in helpers
        and not isinstance(getattr(module, name), ModuleType)  # subpackages, once imported
    }
    assert listed == exported


def ruff_order(name: str) -> tuple[int, str]:
    """The order of ruff's RUF022: CONSTANTS, then Classes, then everything else."""
    if name.isupper():
        return 0, name
    return (1 if name[:1].isupper() else 2), name


@pytest.mark.parametrize("package", LAZY)
def test_the_lazy_all_is_unique_and_in_ruff_s_order(package: str) -> None:
    exported = importlib.import_module(package).__all__
    assert exported == sorted(set(exported), key=ruff_order)


def test_every_top_level_name_resolves_and_errors_come_from_errors() -> None:
    from autopersona_flows import errors

    for name in autopersona_flows.__all__:
        value = getattr(autopersona_flows, name)
        if name.endswith("Error"):
            assert value is getattr(errors, name)


# --- errors ---------------------------------------------------------------------------------


def test_errors_form_one_tree_and_refine_builtins() -> None:
    from autopersona_flows import errors

    for name in errors.__all__:
        assert issubclass(getattr(errors, name), errors.AutopersonaError)
    assert issubclass(errors.MemoryNotFoundError, KeyError)
    assert issubclass(errors.InvalidUserIdError, ValueError)
    assert issubclass(errors.SnapshotError, ValueError)
    assert issubclass(errors.EmbeddingMismatchError, errors.EmbedderError)
    assert issubclass(errors.ResolverError, ValueError)
    assert issubclass(errors.ExtractionError, errors.IngestionError)
    for mistake in (errors.GraphError, errors.FlowConfigurationError, errors.NodeOutputError):
        assert issubclass(mistake, errors.ConfigurationError)  # never retried
    assert issubclass(errors.NodeOutputError, TypeError)
    assert issubclass(errors.StoreUnavailableError, errors.MemoryStoreError)
    assert issubclass(errors.StoreUnavailableError, ConnectionError)


# --- what an import costs -------------------------------------------------------------------

LOADED = (  # what a memory user must not pay for: Prefect, the HTTP client, the agent
    "import sys\n"
    "def loaded():\n"
    "    names = {n.partition('.')[0] for n in sys.modules} & {'httpx', 'prefect'}\n"
    "    agent = {n for n in sys.modules if n.startswith('autopersona_flows.agent')}\n"
    "    return sorted(names | agent)\n"
)


def test_the_memory_layer_loads_neither_prefect_nor_httpx_nor_the_agent() -> None:
    # The package __init__s import a name's module on first use (autopersona_flows/_lazy.py):
    # the bare import loads none of this, and neither does what a memory user reaches for.
    code = LOADED + (
        "import autopersona_flows.memory\n"
        "print(loaded())\n"
        "from autopersona_flows.memory import JsonlMemoryStore, MemoryRetriever, MemoryUpdater\n"
        "from autopersona_flows.memory import MemoryBank, ingest_task_history\n"
        "from autopersona_flows import PersonaMemory, RawTaskRecord\n"
        "print(loaded())\n"
    )
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.splitlines() == ["[]", "[]"]


def test_the_top_level_loads_prefect_with_the_first_name_of_the_flows() -> None:
    code = (
        "import sys\n"
        "import autopersona_flows\n"
        "print(sorted(n for n in sys.modules if n.startswith('autopersona_flows')))\n"
        "from autopersona_flows import MemoryBank, PersonaAgent, Requirement\n"
        "print('prefect' in sys.modules)\n"
        "from autopersona_flows import TaskGraph, run_persona_graph\n"
        "print('prefect' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.splitlines() == [
        "['autopersona_flows', 'autopersona_flows._lazy']",
        "False",
        "True",
    ]


def test_a_lazy_name_is_its_module_s_object_and_is_kept_in_the_package() -> None:
    code = (
        "import sys, autopersona_flows.memory as memory\n"
        "from autopersona_flows.memory.jsonl import JsonlMemoryStore\n"
        "print(memory.JsonlMemoryStore is JsonlMemoryStore, 'JsonlMemoryStore' in vars(memory))\n"
        "print('JsonlMemoryStore' in dir(memory), 'psycopg' in sys.modules)\n"
        "try:\n"
        "    memory.JsonlMemoryStor\n"
        "except AttributeError as exc:\n"
        "    print(exc)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.splitlines() == [
        "True True",
        "True False",
        "module 'autopersona_flows.memory' has no attribute 'JsonlMemoryStor'",
    ]


def test_walking_the_package_imports_every_module_without_running_the_cli() -> None:
    # pydoc, Sphinx and test collectors import every module: none may start the CLI.
    walk = (
        "import importlib, pkgutil, autopersona_flows as p\n"
        "for m in pkgutil.walk_packages(p.__path__, 'autopersona_flows.'):\n"
        "    importlib.import_module(m.name)\n"
        "print('walked')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", walk], capture_output=True, text=True, timeout=120, check=False
    )
    assert (done.returncode, done.stdout.strip()) == (0, "walked"), done.stderr[-2000:]


def test_the_package_ships_its_type_hints() -> None:
    # PEP 561: without the marker a type checker treats the installed package as untyped.
    marker = PACKAGE / "py.typed"
    assert marker.is_file()
    assert marker.read_bytes() == b""
