"""dpfy: differentially private training for PyTorch, with accounting you can report.

The public names load on first use (PEP 562): ``import dpfy`` alone imports neither torch nor
the accountants, so the ``dpfy`` command (whose entry point imports this package first) starts
in well under a second; ``dpfy.make_private`` and the others import their modules when first
read, and are then ordinary attributes of the package.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "make_private",
    "validate",
    "Ledger",
    "Release",
    "Sampling",
    "epsilon",
    "delta",
    "calibrate_noise_multiplier",
    "__version__",
]

# Where each public name lives (the module is imported when the name is first read).
_LAZY = {
    "make_private": "dpfy.api",
    "validate": "dpfy.validation",
    "Ledger": "dpfy.privacy",
    "Release": "dpfy.privacy",
    "Sampling": "dpfy.privacy",
    "epsilon": "dpfy.privacy",
    "delta": "dpfy.privacy",
    "calibrate_noise_multiplier": "dpfy.privacy",
}

if TYPE_CHECKING:  # type checkers and IDEs see the names as if imported eagerly
    from dpfy.api import make_private
    from dpfy.privacy import (
        Ledger,
        Release,
        Sampling,
        calibrate_noise_multiplier,
        delta,
        epsilon,
    )
    from dpfy.validation import validate


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        # A subpackage read as an attribute (``import dpfy; dpfy.layers.DPLSTM``), as when the
        # root imported them eagerly: imported now (which also binds it on the package).
        if not name.startswith("_") and importlib.util.find_spec(f"dpfy.{name}") is not None:
            return importlib.import_module(f"dpfy.{name}")
        raise AttributeError(f"module 'dpfy' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later reads skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
