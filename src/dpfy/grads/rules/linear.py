"""Layer rule for ``nn.Linear`` on (B, d_in) and sequences (B, T..., d_in).

Per-sample gradient of the weight: G_i = Σ_t g_{i,t} a_{i,t}^T  (d_out, d_in).
Ghost norm (Goodfellow 2015; Li et al. 2022): ‖G_i‖_F² = Σ_{t,t'} (a_t·a_t')(g_t·g_t'),
i.e. ⟨A_i A_iᵀ, G_i G_iᵀ⟩ with A_i (T, d_in), G_i (T, d_out); for T = 1 it is ‖a_i‖²‖g_i‖².
Bias: G_i = Σ_t g_{i,t}; its norm ‖Σ_t g_t‖² is computed from that sum directly (one pass over
g), never as the sum 1ᵀ(G_i G_iᵀ)1 of the output gradient's Gram matrix: with a mean loss the
g_t of one example can sum to about 0 while each is not, and the Gram sum then cancels to
rounding noise in float32 (measured 1.03e-4 relative where the true bias gradient is 0, on
Opacus's per-layer test case), while the direct sum does not cancel. For T = 1 it is ‖g_i‖².

Cost: ghost B·T²·(d_in + d_out), materialized B·T·d_in·d_out; we take ghost when
T² < d_in·d_out (fast-differential-privacy's hybrid rule; Ponomareva et al. 2023, §4.5). For T = 1
the ghost norm is a product of two vector norms. For T ≥ 2 on float32 CPU tensors both Gram
matrices are formed and multiplied tile by tile in one fused native pass that skips the tiles
below their diagonal (``dpfy/native/ghost_norm.c``), where the machine allows; otherwise by two
batched matmuls. (Tried: also counting that the materialized route saves the book-keeping
matmul, which would materialize the benchmark encoder's 64×64 ``proj`` layers: no measurable
gain in the real step and +2 MB peak memory.)
"""

from __future__ import annotations

import math

import torch
from torch import nn

from dpfy.grads.rules.base import LayerRule, device_path, register_rule
from dpfy.native.ghost_norm import fused_ghost_available, linear_ghost_sq_norms


def as_seq(a: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Flatten all middle dims into one sequence dim: (B, T, d) (no op when already 3-D: on a
    device each reshape is a dispatched op, and the rule asks twice per layer). Shared with the
    tied-weight rule (:mod:`dpfy.grads.tied`), whose linear use reads its inputs the same way."""
    return _seq(a), _seq(g)


def _seq(x: torch.Tensor) -> torch.Tensor:
    return x if x.dim() == 3 else x.reshape(x.shape[0], -1, x.shape[-1])


def _last_dim_dense(x: torch.Tensor) -> torch.Tensor:
    """``x`` if its last dimension is contiguous (all the kernel needs), else a contiguous copy."""
    return x if x.stride(-1) == 1 else x.contiguous()


def _features(x: torch.Tensor) -> tuple[int, ...]:
    """Every dim of ``x`` but the batch's (dim 0)."""
    return tuple(range(1, x.dim()))


def _sum_sq(g: torch.Tensor) -> torch.Tensor:
    """‖Σ_t g_t‖² (B,) of g (B, T, d), summed in g's dtype and squared from the sum."""
    return torch.linalg.vector_norm(g.sum(1), dim=1).square()


@register_rule(nn.Linear)
class LinearRule(LayerRule):
    has_ghost = True
    position_tails = (1, 1)  # G_i = Σ_t g_t a_tᵀ: the features are the last dim of a and g

    def batch_dims(self, layer, a):
        return tuple(range(a.dim() - 1))  # every dimension but the features

    def grad_sample(self, layer, a, g):
        a, g = as_seq(a, g)  # (B, T, d_in), (B, T, d_out)
        # the batched matmul is faster with the longer of d_in, d_out as its last dimension;
        # a transposed result is a permuted view, which the engine reads without a copy
        if g.shape[-1] >= a.shape[-1]:
            w = torch.bmm(a.transpose(1, 2), g).transpose(1, 2)  # (B, d_out, d_in) sensitive
        else:
            w = torch.bmm(g.transpose(1, 2), a)  # (B, d_out, d_in) sensitive
        out = {"weight": w}
        if layer.bias is not None:
            out["bias"] = g.sum(1)  # (B, d_out) sensitive
        return out

    def prefers_ghost(self, layer, a, g):
        t = math.prod(a.shape[1:-1]) if a.shape[0] else 1  # positions (no op dispatched)
        return t * t < layer.in_features * layer.out_features

    def sq_norm(self, layer, a, g):
        if math.prod(a.shape[1:-1]) == 1:  # one position, (B, d) included: ‖g aᵀ‖ = ‖g‖·‖a‖
            # over every dim but the batch's: no reshape (a dispatched op each), and
            # vector_norm reduces without a (B, d) temporary: memory matters for wide inputs
            # both norms squared in one foreach launch (the same pow(·, 2) as ``square``)
            a_sq, g_sq = torch._foreach_pow(
                [
                    torch.linalg.vector_norm(a, dim=_features(a)),
                    torch.linalg.vector_norm(g, dim=_features(g)),
                ],
                2,
            )  # (B,) each; g_sq is the bias's
            out = {"weight": a_sq.mul_(g_sq)}
            if layer.bias is not None:
                out["bias"] = g_sq
            return out
        a, g = as_seq(a, g)  # (B, T, d_in), (B, T, d_out)
        if not device_path(a) and fused_ghost_available(a, g):  # one fused pass (native/)
            out_w, _ = linear_ghost_sq_norms(_last_dim_dense(a), _last_dim_dense(g))
            out = {"weight": out_w}  # (B,)
        else:
            aa = torch.bmm(a, a.transpose(1, 2))  # (B, T, T) sensitive
            gg = torch.bmm(g, g.transpose(1, 2))  # (B, T, T) sensitive
            out = {"weight": aa.mul_(gg).sum((1, 2))}  # (B,); aa is ours to overwrite
        if layer.bias is not None:
            # ‖Σ_t g_t‖² from the sum itself (module docstring), not the Gram's sum
            out["bias"] = _sum_sq(g)
        return out

    def weighted_sum(self, layer, a, g, w):
        if a.dim() == 2 and g.dim() == 2:
            return _weighted_sum_2d(layer, a, g, w)
        a, g = as_seq(a, g)  # (B, T, d_in), (B, T, d_out)
        ww = w["weight"].to(g.dtype).view(-1, 1, 1)  # (B, 1, 1) sensitive, one view
        # Σ_i w_i G_iᵀ A_i: scale g (also the bias's sum when it shares the weights), then one
        # (d_out, d_in) matmul. A narrower input is scaled instead, on every device: scaling g
        # would allocate a second B·T·d_out tensor (an untied LM head's: about twice the largest
        # capture at the peak), and B·T·(d_out - d_in) multiplications are saved (256 -> 1024 at
        # B·T = 1024 on CPU: 8.6 instead of 9.1 ms), for 2 more ops (the bias's product)
        if a.shape[-1] < g.shape[-1]:
            out = {"weight": torch.mm(_rows_t(g), (a * ww).flatten(0, 1))}
            gw = None
        else:
            gw = g * ww  # (B, T, d_out) sensitive
            out = {"weight": torch.mm(_rows_t(gw), a.flatten(0, 1))}
        if layer.bias is not None:
            if gw is not None and w["bias"] is w["weight"]:
                out["bias"] = gw.sum((0, 1))  # (d_out,)
            else:  # Σ_i w_i Σ_t g_it: each example's sum (B, d_out), one matrix-vector product
                out["bias"] = torch.mv(g.sum(1).t(), w["bias"].to(g.dtype))
        return out


def _weighted_sum_2d(
    layer: nn.Linear, a: torch.Tensor, g: torch.Tensor, w: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """:meth:`LinearRule.weighted_sum` for a (B, d_in) input and (B, d_out) output gradient:
    the same products as the sequence path with T = 1, without its reshapes and views (each a
    dispatched op). The weights scale gᵀ (d_out, B) along its last dimension, which needs no
    unsqueezed view of them: 4 ops per layer with a bias."""
    gt = g.T  # (d_out, B) view
    gwt = gt * w["weight"].to(g.dtype)  # (d_out, B) sensitive
    out = {"weight": torch.mm(gwt, a)}  # Σ_i w_i g_i a_iᵀ
    if layer.bias is not None:
        if w["bias"] is w["weight"]:
            out["bias"] = gwt.sum(1)  # (d_out,)
        else:  # Σ_i w_i g_i as one matrix-vector product
            out["bias"] = torch.mv(gt, w["bias"].to(g.dtype))
    return out


def _rows_t(x: torch.Tensor) -> torch.Tensor:
    """(B, T, d) as its (d, B·T) transpose: one strided view when ``x`` is contiguous (a
    reshape and a transpose are two dispatched ops), else a copy's transpose."""
    d = x.shape[-1]
    if d and x.is_contiguous():
        return x.as_strided((d, x.numel() // d), (1, d))
    return x.reshape(-1, x.shape[-1]).T
