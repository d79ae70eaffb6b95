"""Layer rule for ``nn.LayerNorm`` on (B, ..., *normalized_shape).

y = x̂ ⊙ γ + β with x̂ = (x − μ)·r the input normalized over ``normalized_shape`` (μ its mean,
r = 1/√(var + eps)), so per sample ∂ℓ_i/∂γ = Σ_t r_t (g_t ⊙ (x_t − μ_t)) and
∂ℓ_i/∂β = Σ_t g_t, summed over the leading positions t. These are as small as the parameters,
so they are always materialized (no ghost route needed).

x̂ is not recomputed with ``F.layer_norm``: on CPU that kernel costs several times the few
memory-bound passes used here (mean, centred squares, one product with g, one batched matmul
that applies r and sums over t). Nothing is divided by γ (it may contain zeros).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from dpfy.grads.rules.base import LayerRule, register_rule

__all__ = ["centered_rstd", "LayerNormRule"]


def centered_rstd(x: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(x − μ, 1/√(var + eps)) over the last dim of ``x`` (..., N), var biased (as the norms).

    Two passes (mean, then the squared norm of the centred values) rather than E[x²] − μ², so
    that a large mean does not cancel the variance away. float16/bfloat16 inputs are computed in
    float32. The centred tensor is a fresh (..., N) tensor the caller may overwrite in place;
    the second result has shape (..., 1).
    """
    x = x.to(torch.promote_types(x.dtype, torch.float32))
    c = x - x.mean(-1, keepdim=True)  # (..., N) sensitive
    sq = torch.linalg.vector_norm(c, dim=-1, keepdim=True).square_()  # (..., 1) Σ (x − μ)²
    return c, sq.div_(x.shape[-1]).add_(eps).rsqrt_()


@register_rule(nn.LayerNorm)
class LayerNormRule(LayerRule):
    def grad_sample(self, layer, a, g):
        b, shape = a.shape[0], tuple(layer.normalized_shape)
        n = math.prod(shape)
        g = g.reshape(b, -1, n)  # (B, M, N) sensitive, M the leading positions
        out = {}
        if layer.weight is not None:
            c, rstd = centered_rstd(a.reshape(b, -1, n), layer.eps)  # (B, M, N), (B, M, 1)
            c.mul_(g)  # g ⊙ (x − μ), sensitive
            gamma = torch.bmm(rstd.transpose(1, 2), c)  # (B, 1, N): Σ_t r_t g_t ⊙ (x_t − μ_t)
            out["weight"] = gamma.reshape(b, *shape).to(g.dtype)  # sensitive
        if layer.bias is not None:
            out["bias"] = g.sum(1).reshape(b, *shape)  # (B, *shape) sensitive
        return out
