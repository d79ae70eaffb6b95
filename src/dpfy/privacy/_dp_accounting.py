"""``dp_accounting``, imported on its first use, for the privacy modules that read it.

dp_accounting's package imports SciPy, which ``import dpfy`` should not pay for before anything
is accounted (:mod:`dpfy._lazy`). The privacy modules write
``from dpfy.privacy._dp_accounting import dp_accounting`` and read its attributes at call
time; type checkers see the module itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dpfy._lazy import LazyModule

__all__ = ["dp_accounting"]

if TYPE_CHECKING:
    import dp_accounting
else:  # imported on first read, for start-up time only (dpfy._lazy)
    dp_accounting = LazyModule("dp_accounting")
