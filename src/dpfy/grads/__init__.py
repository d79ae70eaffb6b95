"""Per-sample gradient norms and weighted sums for any model: ``GradEngine`` (the facade), the
layer-rule registry (ghost norms and book-keeping for registered layers) and torch.func for any
other module (``docs/engine.md``).

The model is split into *layers* (``grads/layers.py``: :class:`Layer`, :func:`build_layers`),
each one route to its per-sample gradients; a *unit* in dpfy is only the unit of privacy
(``dpfy/sampling/units.py``). ``Unit`` and ``build_units``, the layers' former names, still
resolve here with a ``DeprecationWarning``.
"""

import warnings
from typing import Any

from dpfy.grads.engine import LOSS_REDUCTIONS, GradEngine
from dpfy.grads.layers import ROUTES, Layer, build_layers
from dpfy.grads.rules import RULES, LayerRule, register_rule, rule_for

__all__ = [
    "GradEngine",
    "LOSS_REDUCTIONS",
    "ROUTES",
    "Layer",
    "build_layers",
    "LayerRule",
    "RULES",
    "register_rule",
    "rule_for",
]

_RENAMED = {"Unit": "Layer", "build_units": "build_layers"}  # deprecated name -> current one


def __getattr__(name: str) -> Any:
    """The deprecated names of :data:`_RENAMED`, with a warning naming the current one."""
    if name in _RENAMED:
        new = _RENAMED[name]
        warnings.warn(
            f"dpfy.grads.{name} is deprecated, got a use of the old name; use "
            f"dpfy.grads.{new} (a unit in dpfy is the unit of privacy, a layer is what the "
            f"gradient engine splits the model into)",
            DeprecationWarning,
            stacklevel=2,
        )
        return globals()[new]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
