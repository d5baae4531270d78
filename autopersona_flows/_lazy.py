"""Lazy re-exports for the package ``__init__`` modules (PEP 562).

``import autopersona_flows.memory`` should not cost the agent, its HTTP client or
modules the caller never touches, so a package imports a re-exported name's
module the first time the name is looked up. Each package names what it
re-exports three times, once for each reader, the way pydantic and Prefect do:

* ``__all__``, the public surface (``tests/test_public_api.py`` guards it);
* an ``if TYPE_CHECKING:`` block of plain imports, for type checkers and IDEs;
* in its ``else:`` branch, the mapping given to `exports`, for the interpreter.

The mapping is not read out of the ``TYPE_CHECKING`` block at run time: that
needs the package's source, which bytecode-only installs (zip apps, frozen
bundles) do not ship. ``tests/test_public_api.py`` checks that the three agree.

A name a package no longer re-exports goes to the ``moved`` mapping of `exports`:
it still resolves, with a `DeprecationWarning` that says where to import it from,
but it is in neither ``__all__`` nor ``dir()``, and type checkers do not see it.
"""

from __future__ import annotations

import sys
import warnings
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

__all__ = ["exports"]


def exports(
    package: str,
    modules: Mapping[str, tuple[str, ...]],
    moved: Mapping[str, tuple[str, ...]] | None = None,
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of a package whose re-exports load on use.

    Args:
        package: The package's ``__name__``.
        modules: For each module (its full name), the names the package re-exports
            from it, in the order of the package's ``TYPE_CHECKING`` imports.
        moved: For each module (its full name), names the package re-exported once
            and now leaves to that module: each still resolves, warning on every
            lookup, and is never stored in the package.

    Returns:
        ``(__getattr__, __dir__)`` for the package to bind at module level. A name,
        once imported, is stored in the package, so later lookups never reach
        ``__getattr__``; importing it twice at once (two threads) is harmless,
        since both get the module's one object.
    """
    where = {name: module for module, names in modules.items() for name in names}
    gone = {name: module for module, names in (moved or {}).items() for name in names}

    def __getattr__(name: str) -> object:  # noqa: N807 - PEP 562 names it
        if name in where:
            # What `from module import name` runs, not importlib.import_module: only
            # imports through it are reported by ``python -X importtime``.
            value = getattr(__import__(where[name], fromlist=(name,)), name)
            setattr(sys.modules[package], name, value)
            return value
        if name in gone:
            # Never stored in the package, so every lookup warns. stacklevel 2 is the
            # caller's line: `from package import name` and `package.name` both call
            # this hook straight from the caller's frame.
            warnings.warn(
                f"importing {name} from {package} is deprecated; "
                f"use `from {gone[name]} import {name}`",
                DeprecationWarning,
                stacklevel=2,
            )
            return getattr(__import__(gone[name], fromlist=(name,)), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:  # noqa: N807 - PEP 562 names it
        return sorted(vars(sys.modules[package]).keys() | where.keys())

    return __getattr__, __dir__
