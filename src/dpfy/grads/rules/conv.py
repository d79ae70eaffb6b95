"""Layer rule for ``nn.Conv1d`` and ``nn.Conv2d`` (any stride, padding, dilation, groups,
padding mode).

With the input cut into patches U_i (L, D) (L output positions, D = C_in/G·k_h·k_w per group)
and the output gradient G_i (C_out/G, L), a convolution is a Linear layer applied at L
positions, so per group ∂ℓ_i/∂W = G_i U_i and the ghost norm is Σ_{l,l'} (u_l·u_l')(g_l·g_l').
Ghost costs L²·(D + C_out/G) per example, materializing L·D·C_out/G: we take the cheaper.
The weighted sum Σ_i w_i ∂ℓ_i/∂W is the ordinary weight gradient of the rescaled output
gradients w_i·G_i, so it is one call to torch's own convolution backward (no patches needed).
Conv1d is handled as a Conv2d of height 1. Bias: ∂ℓ_i/∂b = Σ_l G_i[:, l].

Patches are an ``as_strided`` view of the padded, channels-last input, copied once into
(B, L, k_h·k_w·C_in): on CPU this is several times faster than ``F.unfold``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dpfy.grads.rules.base import LayerRule, register_rule


def _as_2d(layer: nn.Module, a: torch.Tensor, g: torch.Tensor):
    """(a, g, kernel, stride, dilation) with Conv1d lifted to height 1."""
    k, s, d = layer.kernel_size, layer.stride, layer.dilation
    if isinstance(layer, nn.Conv1d):
        return a.unsqueeze(2), g.unsqueeze(2), (1, k[0]), (1, s[0]), (1, d[0])
    return a, g, k, s, d


def _padded(layer: nn.Module, a: torch.Tensor) -> torch.Tensor:
    mode = "constant" if layer.padding_mode == "zeros" else layer.padding_mode
    pad = layer._reversed_padding_repeated_twice
    return F.pad(a, pad, mode=mode) if any(pad) else a


def _patches(layer: nn.Module, a: torch.Tensor, g: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Patches (B, G, L, k_h·k_w·C_in/G) and output grads (B, G, C_out/G, L)."""
    a, g, (kh, kw), (sh, sw), (dh, dw) = _as_2d(layer, _padded(layer, a), g)
    b, c, grp = a.shape[0], a.shape[1], layer.groups
    ho, wo = g.shape[-2], g.shape[-1]
    x = a.permute(0, 2, 3, 1).contiguous()  # (B, H, W, C) channels-last
    bs, hs, ws, cs = x.stride()
    u = x.as_strided((b, ho, wo, kh, kw, grp, c // grp),
                     (bs, hs * sh, ws * sw, hs * dh, ws * dw, (c // grp) * cs, cs))
    u = u.permute(0, 5, 1, 2, 3, 4, 6).reshape(b, grp, ho * wo, kh * kw * (c // grp))
    g = g.reshape(b, grp, layer.out_channels // grp, ho * wo)
    return u, g  # (B, G, L, D) sensitive, (B, G, C_out/G, L) sensitive


@register_rule(nn.Conv1d, nn.Conv2d)
class ConvRule(LayerRule):
    has_ghost = True

    def grad_sample(self, layer, a, g):
        if layer.in_channels == layer.groups:
            return self._grad_sample_by_conv(layer, a, g)
        u, gg = _patches(layer, a, g)
        b, grp, o = u.shape[0], layer.groups, layer.out_channels // layer.groups
        c = layer.in_channels // grp
        kh, kw = (1, layer.kernel_size[0]) if isinstance(layer, nn.Conv1d) else layer.kernel_size
        u3 = u.reshape(b * grp, u.shape[2], u.shape[3])  # (B·G, L, D) view
        g3 = gg.reshape(b * grp, o, gg.shape[3])  # (B·G, O/G, L) view
        if u.shape[2] > u.shape[3]:
            # long contraction (L > D, e.g. a first layer): the (D, O) product is ~1.6× faster
            # on CPU BLAS here (measured on Tramèr & Boneh's conv1: 3.1 vs 5.1 ms)
            w = torch.bmm(u3.transpose(1, 2), g3.transpose(1, 2))  # (B·G, D, O/G)
            w = w.reshape(b, grp, kh, kw, c, o).permute(0, 1, 5, 4, 2, 3)
        else:
            w = torch.bmm(g3, u3)  # (B·G, O/G, D), D ordered (k_h, k_w, C_in/G)
            w = w.reshape(b, grp, o, kh, kw, c).permute(0, 1, 2, 5, 3, 4)
        # w: (B, G, O/G, C/G, k_h, k_w) sensitive
        out = {"weight": w.reshape(b, *layer.weight.shape)}  # sensitive
        if layer.bias is not None:
            out["bias"] = gg.sum(-1).reshape(b, -1)  # (B, C_out) sensitive
        return out

    def _grad_sample_by_conv(self, layer, a, g):
        """One input channel per group (a first layer on grey images, depthwise): ∂ℓ_i/∂W[o, 0]
        is the correlation of o's input channel with g_i[o], i.e. one grouped convolution whose
        kernels are the output gradients (layer stride -> dilation, dilation -> stride), batch
        folded into the groups. No patch copy and no batched matmul of small matrices: on
        Tramèr & Boneh's conv1 at B = 256, 2.2 ms instead of 3.5 ms. (For C_in/G > 1 the
        analogous grouped convolution_backward was measured slower than patches + bmm.)"""
        x, g2, (kh, kw), (sh, sw), (dh, dw) = _as_2d(layer, _padded(layer, a), g)
        b, c, o = x.shape[0], x.shape[1], layer.out_channels
        ho, wo = g2.shape[-2], g2.shape[-1]
        w = F.conv2d(x.reshape(1, b * c, x.shape[2], x.shape[3]),
                     g2.reshape(b * o, 1, ho, wo), None, (dh, dw), 0, (sh, sw), b * c)
        w = w[0, :, :kh, :kw]  # (B·O, k_h, k_w) sensitive; the output may overhang the kernel
        out = {"weight": w.reshape(b, *layer.weight.shape)}  # sensitive
        if layer.bias is not None:
            out["bias"] = g.reshape(b, o, -1).sum(-1)  # (B, C_out) sensitive
        return out

    def prefers_ghost(self, layer, a, g):
        positions = g[0, 0].numel() if a.shape[0] else 1  # L
        d = layer.weight[0].numel()  # D = C_in/G · k_h · k_w
        o = layer.out_channels // layer.groups
        return positions * (d + o) < d * o

    def sq_norm(self, layer, a, g):
        u, gg = _patches(layer, a, g)
        b = u.shape[0]
        u3 = u.reshape(-1, u.shape[2], u.shape[3])  # (B·G, L, D) view
        g3 = gg.reshape(-1, gg.shape[2], gg.shape[3])  # (B·G, O/G, L) view
        uu = torch.bmm(u3, u3.transpose(1, 2))  # (B·G, L, L) sensitive
        ggt = torch.bmm(g3.transpose(1, 2), g3)  # (B·G, L, L) sensitive
        out = {"weight": (uu * ggt).reshape(b, -1).sum(1)}  # (B,)
        if layer.bias is not None:
            out["bias"] = gg.sum(-1).reshape(b, -1).square().sum(1)  # (B,)
        return out

    def weighted_sum(self, layer, a, g, w):
        shape = (-1,) + (1,) * (g.dim() - 1)
        gw = g * w["weight"].to(g.dtype).reshape(shape)  # (B, C_out, *spatial) sensitive
        zeros = layer.padding_mode == "zeros" and not isinstance(layer.padding, str)
        x = a if zeros else _padded(layer, a)
        padding = layer.padding if zeros else (0,) * (a.dim() - 2)
        _, dw, _ = torch.ops.aten.convolution_backward(
            gw, x, layer.weight, None, layer.stride, padding, layer.dilation, False,
            (0,) * (a.dim() - 2), layer.groups, (False, True, False))
        out = {"weight": dw}
        if layer.bias is not None:
            gb = gw if w["bias"] is w["weight"] else g * w["bias"].to(g.dtype).reshape(shape)
            out["bias"] = gb.transpose(0, 1).reshape(layer.out_channels, -1).sum(1)
        return out
