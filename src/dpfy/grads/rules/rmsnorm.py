"""Layer rule for ``nn.RMSNorm`` on (B, ..., *normalized_shape).

y = x ⊙ r ⊙ γ with r = 1/√(mean(x²) + eps), the mean over ``normalized_shape`` (eps=None means
the machine epsilon of the input's dtype, as torch), so per sample ∂ℓ_i/∂γ = Σ_t r_t (g_t ⊙ x_t)
summed over the leading positions t. As small as γ: always materialized.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from dpfy.grads.rules.base import LayerRule, register_rule


@register_rule(nn.RMSNorm)
class RMSNormRule(LayerRule):
    def grad_sample(self, layer, a, g):
        b, shape = a.shape[0], tuple(layer.normalized_shape)
        n = math.prod(shape)
        x = a.reshape(b, -1, n)
        x = x.to(torch.promote_types(x.dtype, torch.float32))  # (B, M, N) sensitive
        eps = layer.eps if layer.eps is not None else torch.finfo(a.dtype).eps
        rstd = x.square().mean(-1, keepdim=True).add_(eps).rsqrt_()  # (B, M, 1) sensitive
        prod = x * g.reshape(b, -1, n)  # (B, M, N) sensitive
        gamma = torch.bmm(rstd.transpose(1, 2), prod)  # (B, 1, N): Σ_t r_t g_t ⊙ x_t
        return {"weight": gamma.reshape(b, *shape).to(g.dtype)}  # sensitive
