"""Layer rule for ``nn.InstanceNorm1d/2d/3d`` with ``affine=True`` and no running statistics.

y = x̂ ⊙ γ_c + β_c with x̂ = (x − μ_{i,c})·r_{i,c}, each (sample, channel) normalized over its own
positions s, so per sample ∂ℓ_i/∂γ_c = r_{i,c} Σ_s g_{c,s} (x_{c,s} − μ_{i,c}) and
∂ℓ_i/∂β_c = Σ_s g_{c,s}. Like GroupNorm with one channel per group, it never mixes samples.
The per-sample gradients are (B, C), as small as their norms: always materialized.

``track_running_stats=True`` is refused before this rule is reached (``grads.layers.check_model``):
the running statistics would learn from the raw data. An unbatched input (C, L) has no batch
dimension for the engine to read and is not covered.
"""

from __future__ import annotations

from torch import nn

from dpfy.grads.rules.base import LayerRule, register_rule
from dpfy.grads.rules.layernorm import centered_rstd


@register_rule(nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d)
class InstanceNormRule(LayerRule):
    def grad_sample(self, layer, a, g):
        b, c = a.shape[0], a.shape[1]
        g = g.reshape(b, c, -1)  # (B, C, S) sensitive
        out = {}
        if layer.weight is not None:
            centred, rstd = centered_rstd(a.reshape(b, c, -1), layer.eps)  # (B, C, S), (B, C, 1)
            gamma = centred.mul_(g).sum(-1, keepdim=True).mul_(rstd)  # (B, C, 1) sensitive
            out["weight"] = gamma.reshape(b, c).to(g.dtype)
        if layer.bias is not None:
            out["bias"] = g.sum(-1)  # (B, C) sensitive
        return out
