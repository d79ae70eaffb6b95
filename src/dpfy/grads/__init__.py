"""Per-sample gradient norms and weighted sums: a vmap engine for any module, a ghost /
book-keeping engine for registered layers, and the layer-rule registry."""

from dpfy.grads.engine import LOSS_REDUCTIONS, GradEngine
from dpfy.grads.rules import RULES, LayerRule, register_rule, rule_for
from dpfy.grads.units import ENGINES, Unit, build_units

__all__ = ["GradEngine", "LOSS_REDUCTIONS", "ENGINES", "Unit", "build_units", "LayerRule",
           "RULES", "register_rule", "rule_for"]
