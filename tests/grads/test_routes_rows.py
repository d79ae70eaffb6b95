"""``Routes.sq_norms`` on materialized per-sample rows: a rule that returns no per-sample
gradient for a layer with trainable parameters (a user's incomplete rule) still reaches the
engine's refusal naming the layer rule and the fix, not a crash inside the row norms."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dpfy.grads import GradEngine, RULES, LayerRule, register_rule


class Scale(nn.Module):
    """y = a·x with a trainable scalar vector: one parameter, a user's own layer type."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.ones(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.a


def test_rule_without_rows_is_refused_not_crashed():
    @register_rule(Scale)
    class IncompleteRule(LayerRule):  # forgets its parameter: no row to square
        def grad_sample(self, layer, a, g):
            return {}

    try:
        model = Scale()
        eng = GradEngine(model, loss_reduction="sum")
        try:
            model(torch.randn(4, 3)).sum().backward()
            with pytest.raises(ValueError, match="covering every trainable parameter"):
                eng.per_sample_sq_norms()
        finally:
            eng.detach()
    finally:
        del RULES[Scale]
