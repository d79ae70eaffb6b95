"""Per-sample gradient norms and weighted sums for any model: ``GradEngine`` (the facade), the
layer-rule registry (ghost norms and book-keeping for registered layers) and torch.func for any
other module (``docs/engine.md``)."""

from dpfy.grads.engine import LOSS_REDUCTIONS, GradEngine
from dpfy.grads.rules import RULES, LayerRule, register_rule, rule_for
from dpfy.grads.units import ROUTES, Unit, build_units

__all__ = [
    "GradEngine",
    "LOSS_REDUCTIONS",
    "ROUTES",
    "Unit",
    "build_units",
    "LayerRule",
    "RULES",
    "register_rule",
    "rule_for",
]
