"""Deferred imports of heavy optional dependencies, for start-up time only.

``import dpfy`` and ``dpfy --help`` should not pay for SciPy and dp_accounting (about a second
on a loaded 2-core machine: dp_accounting's package imports ``scipy.signal``, ``scipy.stats``
and ``scipy.optimize``) before anything is accounted. A module that needs them at call time
binds a :class:`LazyModule` instead of importing at module level; the real import happens on
the first attribute read, and is then an ordinary module.

This is not a way around an import cycle (STYLE: dpfy's own layers import each other
eagerly, downwards): it is used only for third-party packages that are slow to import, and
type checkers see the ordinary import (``if TYPE_CHECKING: import dp_accounting``).

:func:`lazy_attributes` is the package-level counterpart (PEP 562): a package's public names
resolved from their modules on first read, so that importing the package imports none of them;
:func:`by_module` lets a package list them under their modules, each module named once.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType
from typing import Any, Callable

__all__ = ["LazyModule", "lazy_attributes", "by_module"]


class LazyModule:
    """The module ``name``, imported on the first attribute read (``optimize.brentq``).

    ``isinstance`` checks, ``from x import y`` and annotations are unaffected: the code that
    holds a ``LazyModule`` only reads attributes from it.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._module: ModuleType | None = None

    def __getattr__(self, attr: str) -> Any:
        # Only called for attributes not found on the proxy itself (_name, _module are).
        if self._module is None:
            self._module = importlib.import_module(self._name)
        return getattr(self._module, attr)

    def __repr__(self) -> str:
        state = "loaded" if self._module is not None else "not loaded yet"
        return f"<LazyModule {self._name!r} ({state})>"


def by_module(modules: dict[str, tuple[str, ...]]) -> dict[str, str]:
    """``{module: (name, ...)}`` -> ``{name: module}``, the ``names`` of :func:`lazy_attributes`."""
    return {name: module for module, names in modules.items() for name in names}


def lazy_attributes(
    package: str, names: dict[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package`` whose public ``names`` map to the modules
    that define them (PEP 562).

    A name is imported from its module on first read and bound in ``namespace`` (the package's
    ``globals()``), so later reads do not come back here. Any other public attribute that is a
    subpackage or submodule (``dpfy.layers``) is imported on first read, as when the package
    imported it eagerly.
    """

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            if not name.startswith("_") and importlib.util.find_spec(f"{package}.{name}"):
                return importlib.import_module(f"{package}.{name}")
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(names) | set(namespace.get("__all__", ())))

    return __getattr__, __dir__
