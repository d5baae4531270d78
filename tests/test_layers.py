"""Imports flow one way: memory <- agent <- flows, and no module of the package imports itself back.

Read from the source, so an import moved into a function body (the usual way to dodge a
circle) or under ``if TYPE_CHECKING:`` counts as much as one at the top of a module.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import autopersona_flows

PACKAGE = Path(autopersona_flows.__file__).parent


@dataclass(frozen=True)
class Import:
    source: str
    target: str
    line: int
    typing_only: bool  # under `if TYPE_CHECKING:`: never runs


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(name: str) -> list[Import]:
    """Every import statement of module ``name``, wherever it stands in the module."""
    found: list[Import] = []

    def visit(node: ast.AST, typing_only: bool) -> None:
        if isinstance(node, ast.If) and is_type_checking(node):
            for child in node.body:
                visit(child, True)
            for child in node.orelse:
                visit(child, typing_only)
            return
        if isinstance(node, ast.Import):
            found.extend(Import(name, a.name, node.lineno, typing_only) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:  # `from package import module` depends on the module
                target = f"{node.module}.{alias.name}"
                target = target if target in MODULES else node.module
                found.append(Import(name, target, node.lineno, typing_only))
        for child in ast.iter_child_nodes(node):
            visit(child, typing_only)

    visit(ast.parse(MODULES[name].read_text(encoding="utf-8")), False)
    return found


IMPORTS = [imp for name in MODULES for imp in imports_of(name)]


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(f"{package}.")


def test_no_relative_imports_hide_from_this_check() -> None:
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        relative = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level]
        assert not relative, f"{name}: relative imports at lines {relative}"


def test_lower_layers_never_import_higher_ones() -> None:
    forbidden = {
        "autopersona_flows.memory": (
            "autopersona_flows.agent",
            "autopersona_flows.flows",
            "prefect",
        ),
        "autopersona_flows.agent": ("autopersona_flows.flows", "prefect"),
    }
    upward = [
        f"{imp.source}:{imp.line} imports {imp.target}"
        for imp in IMPORTS
        for layer, above in forbidden.items()
        if within(imp.source, layer) and any(within(imp.target, a) for a in above)
    ]
    assert upward == []


def test_no_module_imports_itself_back_through_others() -> None:
    # Runtime imports only: an import under TYPE_CHECKING never runs. The import of a
    # module's parent package that Python adds is left out: a package __init__ that
    # imports its own modules is how a package is read, not a circle.
    edges: dict[str, set[str]] = {name: set() for name in MODULES}
    for imp in IMPORTS:
        if imp.typing_only or imp.target not in MODULES or imp.target == imp.source:
            continue
        edges[imp.source].add(imp.target)

    def path_back(start: str) -> list[str] | None:
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in sorted(edges[node]):
                if nxt == start:
                    return [*path, start]
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*path, nxt]))
        return None

    circles = [" -> ".join(p) for name in MODULES if (p := path_back(name))]
    assert circles == []


def test_the_memory_and_agent_layers_run_without_prefect() -> None:
    # What the source says, checked once at run time too: no dependency pulls Prefect in.
    code = (
        "import importlib, pkgutil, sys\n"
        "import autopersona_flows.agent as a, autopersona_flows.memory as m\n"
        "for p in (m, a):\n"
        "    for info in pkgutil.walk_packages(p.__path__, p.__name__ + '.'):\n"
        "        importlib.import_module(info.name)\n"
        "print(sorted(n for n in sys.modules if n == 'prefect' or n.startswith('prefect.')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "[]"
