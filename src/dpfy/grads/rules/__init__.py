"""Layer rules, one file per layer type; importing this package registers them all."""

from dpfy.grads.rules import (
    conv,
    embedding,
    groupnorm,
    instancenorm,
    layernorm,  # noqa: F401
    linear,
    recurrent_linear,
    rmsnorm,
)
from dpfy.grads.rules import hf_conv1d  # noqa: F401  (registers on transformers' import)
from dpfy.grads.rules.base import RULES, LayerRule, register_rule, rule_for

__all__ = ["LayerRule", "RULES", "register_rule", "rule_for"]
