"""Input validation and optional dependencies, so every such error reads the same way.

Format of an input error: ``"<name> must be <constraint>, got <name> = <value>. <fix>."``
(CONTRIBUTING.md, "Errors"). A feature that needs an optional package (plots, scikit-learn's
datasets, YAML configs) imports it through :func:`require_extra`, whose one-line error names the
``pip install "dpfy[<extra>]"`` that provides it.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

__all__ = ["require", "require_resumed", "require_extra", "MissingExtra", "EXTRAS"]

# top-level module -> (the distribution that provides it, the dpfy extra that installs it)
EXTRAS = {
    "matplotlib": ("matplotlib", "plots"),
    "sklearn": ("scikit-learn", "datasets"),
    "yaml": ("pyyaml", "yaml"),
    "triton": ("triton", "gpu"),
}


class MissingExtra(ImportError):
    """An optional package a feature needs is not installed; the message names the extra."""


def require(
    ok: bool,
    name: str,
    value: Any,
    constraint: str,
    fix: str = "",
    error: type[ValueError] = ValueError,
) -> None:
    """Raise ``error`` (``ValueError``, or a subclass such as
    :class:`dpfy.errors.PrivacyRefusal`) naming the parameter, the constraint, the value and the
    fix."""
    if not ok:
        msg = f"{name} must be {constraint}, got {name} = {value!r}."
        if fix:
            msg += f" {fix.rstrip('.')}."
        raise error(msg)


def require_resumed(what: str, saved: Any, current: Any, fix: str) -> None:
    """Refuse a checkpoint whose ``what`` (``saved``) is not the resuming run's (``current``),
    in :func:`require`'s words: "the checkpoint's <what> must be <current>, the run being
    resumed, got ..." and the fix."""
    require(
        saved == current,
        f"the checkpoint's {what}",
        saved,
        f"{current}, the run being resumed",
        fix,
    )


def require_extra(module: str, *, feature: str) -> ModuleType:
    """Import ``module`` (one of :data:`EXTRAS`' packages, or a submodule of one) for ``feature``.

    Raises :class:`MissingExtra` (an ``ImportError``) with one line naming the extra to install
    when the package is missing; any other import failure propagates unchanged.
    """
    top = module.split(".")[0]
    dist, extra = EXTRAS[top]
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name is None or e.name.split(".")[0] != top:
            raise
        raise MissingExtra(
            f"{feature} needs {dist}, which is not installed: "
            f'pip install "dpfy[{extra}]" (or "dpfy[all]")'
        ) from None
