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


def _saved_stats(output: torch.Tensor, name: str) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(μ, r) that torch's ``name`` kernel saved on ``output``'s autograd node, if it did.

    The output of a LayerNorm whose input requires grad comes from ``native_layer_norm``, which
    returns (y, mean, rstd) and saves the last two for its backward; reading them spares two
    passes over the input. Anything unexpected (no grad_fn, another node) gives None.
    """
    fn = output.grad_fn
    if fn is None or type(fn).__name__ != name:
        return None
    mean, rstd = getattr(fn, "_saved_result1", None), getattr(fn, "_saved_result2", None)
    if not (torch.is_tensor(mean) and torch.is_tensor(rstd) and mean.shape == rstd.shape):
        return None
    return mean.detach(), rstd.detach()  # sensitive (per-example statistics)


@register_rule(nn.LayerNorm)
class LayerNormRule(LayerRule):
    def capture(self, layer, output):
        return (
            _saved_stats(output, "NativeLayerNormBackward0") if layer.weight is not None else None
        )

    def grad_sample(self, layer, a, g, saved=None):
        b, shape = a.shape[0], tuple(layer.normalized_shape)
        n = math.prod(shape)
        g = g.reshape(b, -1, n)  # (B, M, N) sensitive, M the leading positions
        out = {}
        if layer.weight is not None:
            x = a.reshape(b, -1, n)
            if saved is not None and saved[0].numel() == x.shape[0] * x.shape[1]:
                mean, rstd = (t.reshape(b, -1, 1) for t in saved)  # (B, M, 1) from the forward
                c = x.to(torch.promote_types(x.dtype, torch.float32)) - mean  # (B, M, N)
            else:
                c, rstd = centered_rstd(x, layer.eps)  # (B, M, N), (B, M, 1)
            c.mul_(g)  # g ⊙ (x − μ), sensitive
            gamma = torch.bmm(rstd.transpose(1, 2), c)  # (B, 1, N): Σ_t r_t g_t ⊙ (x_t − μ_t)
            out["weight"] = gamma.reshape(b, *shape).to(g.dtype)  # sensitive
        if layer.bias is not None:
            out["bias"] = g.sum(1).reshape(b, *shape)  # (B, *shape) sensitive
        return out
