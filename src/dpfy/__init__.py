"""dpfy: differentially private training for PyTorch, with accounting you can report.

The public names load on first use (PEP 562): ``import dpfy`` alone imports neither torch nor
the accountants, so the ``dpfy`` command (whose entry point imports this package first) starts
in well under a second; ``dpfy.make_private`` and the others import their modules when first
read, and are then ordinary attributes of the package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dpfy._lazy import lazy_attributes

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


__getattr__, __dir__ = lazy_attributes("dpfy", _LAZY, globals())
