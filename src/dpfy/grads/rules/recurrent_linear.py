"""``RecurrentLinear``: the hidden-to-hidden Linear of ``dpfy.layers``' recurrent layers, and its
rule (the Linear rule: same math).

A recurrent layer's recurrence already computes z_t = h_{t−1} W_hhᵀ + b_hh at every step; the
layer then calls its hidden Linear once on the stacked states h_{0..T−1} so that the engine sees
one Linear call over the sequence (``dpfy/layers/scan.py``). ``RecurrentLinear(h, value=z)``
returns the stacked z the recurrence computed instead of multiplying again (the value is
h Wᵀ + b by construction); its backward is a Linear's (∂W = Σ gᵀh, ∂b = Σ g, ∂h = g W). Called
without ``value`` it is an ``nn.Linear``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from dpfy.grads.rules.base import register_rule
from dpfy.grads.rules.linear import LinearRule

__all__ = ["RecurrentLinear", "RecurrentLinearRule"]


class _KnownValue(torch.autograd.Function):
    """y = x Wᵀ + b whose value the caller already holds (see module docstring)."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        value: torch.Tensor,
    ) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return value

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor):
        x, weight = ctx.saved_tensors
        dx = g @ weight if ctx.needs_input_grad[0] else None
        dw = g.flatten(0, -2).T @ x.flatten(0, -2) if ctx.needs_input_grad[1] else None
        db = g.flatten(0, -2).sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return dx, dw, db, None


class RecurrentLinear(nn.Linear):
    """An ``nn.Linear`` that may be handed its output's value (``value=``, see module doc)."""

    def forward(self, input: torch.Tensor, value: torch.Tensor | None = None) -> torch.Tensor:
        if value is None:
            return super().forward(input)
        return _KnownValue.apply(input, self.weight, self.bias, value)


@register_rule(RecurrentLinear)
class RecurrentLinearRule(LinearRule):
    """The Linear rule: the per-example gradients depend only on the input and the output
    gradient, not on how the output's value was computed."""
