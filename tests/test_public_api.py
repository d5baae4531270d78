"""The exported surface is deliberate: adding or removing a name must be a visible change."""

import subprocess
import sys
from pathlib import Path

import autopersona_flows
import autopersona_flows.agent
import autopersona_flows.errors
import autopersona_flows.memory


def test_top_level_surface() -> None:
    assert autopersona_flows.__all__ == [
        "LAYERS",
        "AutopersonaError",
        "ClarifyDecision",
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
        "TrajectoryMemory",
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


def test_the_memory_layer_does_not_import_prefect() -> None:
    code = (
        "import sys, autopersona_flows.memory, autopersona_flows; print('prefect' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"


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
