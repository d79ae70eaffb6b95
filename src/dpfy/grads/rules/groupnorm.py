"""Layer rule for ``nn.GroupNorm`` on (B, C, *).

y = x̂ ⊙ γ_c + β_c with x̂ normalized per (sample, group), so per sample
∂ℓ_i/∂γ_c = Σ_s g_{c,s} x̂_{c,s} and ∂ℓ_i/∂β_c = Σ_s g_{c,s} over spatial positions s.
GroupNorm never mixes samples, which is why ``dpfy.validate(fix=True)`` puts it in place of
BatchNorm. Always materialized: (B, C) is small.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import nn

from dpfy.grads.rules.base import LayerRule, register_rule


@register_rule(nn.GroupNorm)
class GroupNormRule(LayerRule):
    def grad_sample(self, layer, a, g):
        b, c = a.shape[0], a.shape[1]
        out = {}
        if layer.weight is not None:
            xhat = F.group_norm(a, layer.num_groups, eps=layer.eps)  # (B, C, *)
            out["weight"] = (g * xhat).reshape(b, c, -1).sum(-1)  # (B, C) sensitive
        if layer.bias is not None:
            out["bias"] = g.reshape(b, c, -1).sum(-1)  # (B, C) sensitive
        return out
