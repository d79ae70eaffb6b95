"""Layer rule for ``nn.Conv1d`` and ``nn.Conv2d`` (any stride, padding, dilation, groups,
padding mode), by unfolding the input into patches.

With the input unfolded into patches U_i (D, L) (D = C_in/G·k_h·k_w per group, L output
positions) and the output gradient G_i (C_out, L), a convolution is a Linear layer applied at L
positions, so per group: ∂ℓ_i/∂W = G_i U_iᵀ (C_out/G, D) and the ghost norm is
Σ_{l,l'} (u_l·u_l')(g_l·g_l'). Ghost costs L²·(D + C_out/G) per group, materializing
L·D·C_out/G; we take the cheaper (fast-differential-privacy's hybrid rule).
Conv1d is handled as a Conv2d of height 1. Bias: ∂ℓ_i/∂b = Σ_l G_i[:, l].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dpfy.grads.rules.base import LayerRule, register_rule


def _unfold(layer: nn.Module, a: torch.Tensor, g: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Patches (B, G, D, L) and output grads (B, G, C_out/G, L)."""
    mode = "constant" if layer.padding_mode == "zeros" else layer.padding_mode
    a = F.pad(a, layer._reversed_padding_repeated_twice, mode=mode)
    k, s, d = layer.kernel_size, layer.stride, layer.dilation
    if isinstance(layer, nn.Conv1d):
        a, k, s, d = a.unsqueeze(2), (1, k[0]), (1, s[0]), (1, d[0])  # (B, C_in, 1, L_in)
    b, grp = a.shape[0], layer.groups
    u = F.unfold(a, k, dilation=d, stride=s)  # (B, C_in·k_h·k_w, L)
    u = u.reshape(b, grp, -1, u.shape[-1])  # (B, G, D, L)
    g = g.reshape(b, grp, layer.out_channels // grp, -1)  # (B, G, C_out/G, L)
    return u, g


@register_rule(nn.Conv1d, nn.Conv2d)
class ConvRule(LayerRule):
    has_ghost = True

    def grad_sample(self, layer, a, g):
        u, g = _unfold(layer, a, g)
        w = torch.einsum("bgol,bgdl->bgod", g, u)  # (B, G, C_out/G, D) sensitive
        out = {"weight": w.reshape(a.shape[0], *layer.weight.shape)}
        if layer.bias is not None:
            out["bias"] = g.sum(-1).reshape(a.shape[0], -1)  # (B, C_out) sensitive
        return out

    def prefers_ghost(self, layer, a, g):
        positions = g[0, 0].numel() if a.shape[0] else 1  # L
        d = layer.weight[0].numel()  # D = C_in/G · k_h · k_w
        o = layer.out_channels // layer.groups
        return positions * (d + o) < d * o

    def sq_norm(self, layer, a, g):
        u, g = _unfold(layer, a, g)
        b = u.shape[0]
        uu = torch.einsum("bgdl,bgdm->bglm", u, u)  # (B, G, L, L) sensitive
        gg = torch.einsum("bgol,bgom->bglm", g, g)  # (B, G, L, L) sensitive
        out = {"weight": (uu * gg).reshape(b, -1).sum(1)}  # (B,)
        if layer.bias is not None:
            out["bias"] = g.sum(-1).reshape(b, -1).square().sum(1)  # (B,)
        return out

    def weighted_sum(self, layer, a, g, w):
        u, gu = _unfold(layer, a, g)
        gw = gu * w["weight"].to(gu.dtype)[:, None, None, None]  # (B, G, C_out/G, L)
        out = {"weight": torch.einsum("bgol,bgdl->god", gw, u).reshape(layer.weight.shape)}
        if layer.bias is not None:
            gb = gw if w["bias"] is w["weight"] else gu * w["bias"].to(gu.dtype)[:, None, None, None]
            out["bias"] = gb.sum((0, 3)).reshape(-1)  # (C_out,)
        return out
