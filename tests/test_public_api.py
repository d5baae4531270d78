"""The exported surface is deliberate: adding or removing a name must be a visible change."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import autopersona_flows
import autopersona_flows.agent
import autopersona_flows.errors
import autopersona_flows.memory


def test_top_level_surface() -> None:
    assert autopersona_flows.__all__ == [
        "LAYERS",
        "AutopersonaError",
        "ClarifyDecision",
        "ConfigurationError",
        "Constraint",
        "DuplicateMemoryError",
        "Embedder",
        "EmbedderError",
        "Embedding",
        "EmbeddingMismatchError",
        "EvaluationError",
        "EvidencePolicy",
        "ExtractionError",
        "FinalDecision",
        "HashingEmbedder",
        "IngestionError",
        "InvalidUserIdError",
        "JsonlMemoryStore",
        "MemoryBank",
        "MemoryBundle",
        "MemoryChange",
        "MemoryLayer",
        "MemoryNotFoundError",
        "MemoryRecord",
        "MemoryRetriever",
        "MemorySnapshot",
        "MemoryStore",
        "MemoryStoreCorruptionError",
        "MemoryStoreError",
        "MemoryUpdater",
        "NodeInfo",
        "PersonaAgent",
        "PersonaDecision",
        "PersonaMemory",
        "PersonaRequest",
        "Policy",
        "PolicyError",
        "RawTaskRecord",
        "Requirement",
        "Resolver",
        "ResolverError",
        "RetrievalError",
        "RuntimeMetrics",
        "ScoredMemory",
        "SearchRequest",
        "SnapshotError",
        "StoreUnavailableError",
        "TrajectoryMemory",
        "UnsafeLinkError",
        "UpdateDecision",
        "WorkspaceMemory",
        "__version__",
        "ingest_task_history",
    ]


modules = (
    autopersona_flows,
    autopersona_flows.memory,
    autopersona_flows.agent,
    autopersona_flows.errors,
)


def test_every_exported_name_exists_once() -> None:
    # The order itself is kept by ruff (RUF022: constants, classes, then functions).
    for module in modules:
        assert len(set(module.__all__)) == len(module.__all__)
        for name in module.__all__:
            assert hasattr(module, name), f"{module.__name__}.{name}"


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
        "from autopersona_flows.memory import MemoryBank\n"
        "from autopersona_flows import PersonaMemory, RawTaskRecord, ingest_task_history\n"
        "print(loaded())\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.splitlines() == ["[]", "[]"]


# --- the lazy __init__s ---------------------------------------------------------------------

LAZY_PACKAGES = ("autopersona_flows", "memory", "agent", "flows")


def _names(node: ast.stmt) -> list[str]:
    """The names a top-level statement binds."""
    if isinstance(node, ast.ImportFrom):
        return [alias.asname or alias.name for alias in node.names]
    if isinstance(node, ast.Assign):
        return [ast.unparse(target) for target in node.targets]
    return []


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_what_type_checkers_see_is_what_the_package_imports(package: str) -> None:
    # __all__, the TYPE_CHECKING imports and the mapping given to exports() (see
    # autopersona_flows/_lazy.py) must name the same things, the last two module by module.
    folder = Path(autopersona_flows.__file__).parent
    init = folder / ("" if package == "autopersona_flows" else package) / "__init__.py"
    tree = ast.parse(init.read_text(encoding="utf-8"))
    (block,) = [
        n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"
    ]
    assert all(isinstance(n, ast.ImportFrom) for n in block.body)
    for_checkers = {n.module: tuple(_names(n)) for n in block.body}
    (bind,) = block.orelse
    assert ast.unparse(bind).startswith("__getattr__, __dir__ = exports(__name__, {")
    for_the_interpreter = ast.literal_eval(bind.value.args[1])
    assert for_the_interpreter == for_checkers

    lazy = [name for names in for_checkers.values() for name in names]
    on_load = {name for n in tree.body for name in _names(n)}  # defined or imported on load
    (exported,) = [ast.literal_eval(n.value) for n in tree.body if _names(n) == ["__all__"]]
    assert len(set(lazy)) == len(lazy), "a name re-exported from two modules"
    assert not set(lazy) & on_load, "a name imported both on load and on first use"
    assert sorted(exported) == sorted(set(lazy) | (on_load & set(exported)))


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
    marker = Path(autopersona_flows.__file__).parent / "py.typed"
    assert marker.is_file()
    assert marker.read_bytes() == b""
