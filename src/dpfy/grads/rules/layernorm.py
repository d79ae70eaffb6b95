"""Layer rule for ``nn.LayerNorm`` on (B, ..., *normalized_shape).

y = x̂ ⊙ γ + β with x̂ the input normalized over ``normalized_shape``, so per sample
∂ℓ_i/∂γ = Σ_t g_t ⊙ x̂_t and ∂ℓ_i/∂β = Σ_t g_t, summed over the leading positions t. These are
as small as the parameters, so they are always materialized (no ghost route needed).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import nn

from dpfy.grads.rules.base import LayerRule, register_rule


@register_rule(nn.LayerNorm)
class LayerNormRule(LayerRule):
    def grad_sample(self, layer, a, g):
        b, shape = a.shape[0], layer.normalized_shape
        out = {}
        if layer.weight is not None:
            xhat = F.layer_norm(a, shape, eps=layer.eps)  # (B, ..., *shape)
            out["weight"] = (g * xhat).reshape(b, -1, *shape).sum(1)  # (B, *shape) sensitive
        if layer.bias is not None:
            out["bias"] = g.reshape(b, -1, *shape).sum(1)  # (B, *shape) sensitive
        return out
