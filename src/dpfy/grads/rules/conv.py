"""Layer rule for ``nn.Conv1d``, ``nn.Conv2d`` and ``nn.Conv3d`` (any stride, padding, dilation,
groups, padding mode).

With the input cut into patches U_i (L, D) (L output positions, D = C_in/G·k_h·k_w per group)
and the output gradient G_i (C_out/G, L), a convolution is a Linear layer applied at L
positions, so per group ∂ℓ_i/∂W = G_i U_i and the ghost norm is Σ_{l,l'} (u_l·u_l')(g_l·g_l').
Ghost costs L²·(D + C_out/G) per example, materializing L·D·C_out/G: we take the cheaper.
The weighted sum Σ_i w_i ∂ℓ_i/∂W is the ordinary weight gradient of the rescaled output
gradients w_i·G_i, so it is one call to torch's own convolution backward (no patches needed).
Conv1d is handled as a Conv2d of height 1. Bias: ∂ℓ_i/∂b = Σ_l G_i[:, l]. Conv3d: the same
ghost norm over 3-D patches; its per-sample gradients are one call of torch's convolution
backward with the batch folded into the groups (``_grad_sample_by_backward``), and the
super-pixel route below is not used.

Patches are an ``as_strided`` view of the padded, channels-last input, copied once into
(B, L, k_h·k_w·C_in): on CPU this is several times faster than ``F.unfold``.

Ghost norm by super-pixels (undilated layers whose stride divides the kernel, k = r·s per
dimension): cut the input into s_h×s_w super-pixels of F = C_in/G·s_h·s_w features; the layer is
then an r_h×r_w stride-1 convolution over the super-pixel grid, a patch is the concatenation of
the r_h·r_w super-pixels at offsets δ from its corner, and the patch Gram is a sum of r_h·r_w
shifted blocks of the super-pixel Gram: u_l·u_l' = Σ_δ S_{l+δ}·S_{l'+δ}. The super-pixels are
one copy of the input (no k/s-fold duplication) and their Gram has M² F terms (M super-pixels)
instead of L² D, e.g. 4× fewer for Tramèr & Boneh's conv2 (its ghost norm at B = 256: 1.7 ms
instead of 3.7 ms alone, about -1.7 ms in the training step). ``prefers_ghost`` still weighs
the patch route's cost, an upper bound of the super-pixel route's where that one is taken.
"""

from __future__ import annotations

import itertools
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.conv import _ConvNd

from dpfy.grads.rules.base import LayerRule, device_path, register_rule


def _geometry(layer: _ConvNd) -> tuple[tuple[int, ...], ...]:
    """(kernel, stride, dilation) as (height, width) pairs, Conv1d lifted to height 1."""
    if isinstance(layer, nn.Conv1d):
        return tuple((1, t[0]) for t in (layer.kernel_size, layer.stride, layer.dilation))
    return layer.kernel_size, layer.stride, layer.dilation


def _as_2d(layer: _ConvNd, a: torch.Tensor, g: torch.Tensor):
    """(a, g, kernel, stride, dilation) with Conv1d lifted to height 1."""
    if isinstance(layer, nn.Conv1d):
        a, g = a.unsqueeze(2), g.unsqueeze(2)
    return (a, g, *_geometry(layer))


def _padded(layer: _ConvNd, a: torch.Tensor) -> torch.Tensor:
    mode = "constant" if layer.padding_mode == "zeros" else layer.padding_mode
    pad = layer._reversed_padding_repeated_twice
    return F.pad(a, pad, mode=mode) if any(pad) else a


def _patches(layer: _ConvNd, a: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Patches (B, G, L, k_1⋯k_n·C_in/G) and output grads (B, G, C_out/G, L), n = 2 or 3
    spatial dimensions (Conv1d lifted to 2), patch features ordered (k_1, …, k_n, C_in/G)."""
    a, g, k, s, d = _as_2d(layer, _padded(layer, a), g)
    b, c, grp = a.shape[0], a.shape[1], layer.groups
    out = g.shape[2:]
    n = len(out)
    x = a.movedim(1, -1).contiguous()  # (B, *spatial, C) channels-last
    st = x.stride()
    u = x.as_strided(
        (b, *out, *k, grp, c // grp),
        (
            st[0],
            *(st[1 + i] * s[i] for i in range(n)),
            *(st[1 + i] * d[i] for i in range(n)),
            (c // grp) * st[-1],
            st[-1],
        ),
    )
    u = u.permute(0, 2 * n + 1, *range(1, 2 * n + 1), 2 * n + 2)
    u = u.reshape(b, grp, out.numel(), math.prod(k) * (c // grp))
    g = g.reshape(b, grp, layer.out_channels // grp, out.numel())
    return u, g  # (B, G, L, D) sensitive, (B, G, C_out/G, L) sensitive


def _superpixel_ratio(layer: _ConvNd, g: torch.Tensor) -> tuple[int, int] | None:
    """(r_h, r_w) = kernel / stride if the ghost norm by super-pixels covers the layer (no
    dilation, stride dividing the kernel) and costs no more flops and no more memory than the
    one by patches at this output size; else None (then patches are used)."""
    if isinstance(layer, nn.Conv3d):
        return None
    (kh, kw), (sh, sw), (dh, dw) = _geometry(layer)
    if (dh, dw) != (1, 1) or kh % sh or kw % sw:
        return None
    rh, rw = kh // sh, kw // sw
    ho, wo = (1, g.shape[-1]) if isinstance(layer, nn.Conv1d) else g.shape[-2:]
    m, n, p = (ho + rh - 1) * (wo + rw - 1), (ho - 1) * (wo + rw - 1) + wo, ho * wo
    f = layer.in_channels // layer.groups * sh * sw  # super-pixel features
    d = f * rh * rw  # patch features
    # per example and group: copy + Gram (+ shifted sums) flops; peak buffers (see the code)
    flops_ok = m * f + m * m * f + rh * rw * n * n <= p * d + p * p * d
    memory_ok = max(m * f + m * m + n * n, 2 * n * n) <= p * d + 2 * p * p
    return (rh, rw) if flops_ok and memory_ok else None


def _weight_sq_norm_by_superpixels(
    layer: _ConvNd, a: torch.Tensor, g: torch.Tensor, rh: int, rw: int
) -> torch.Tensor:
    """‖∂ℓ_i/∂W‖² (B,) from the Gram of s_h×s_w super-pixels (module docstring).

    The super-pixels are one strided view of the input in (B, G, C/G, s_h, s_w, h_s, w_s) order
    (one dispatched op, where slicing and unflattening took one per dimension). Positions are
    flattened row-major on the super-pixel grid's width w_s = w_o + r_w - 1, so that the shift
    by δ = (p, q) is one offset p·w_s + q and the r_h·r_w shifted blocks of the Gram are one
    strided view (B·G, r_h, r_w, n, n); the w_s - w_o extra columns per row that this adds are
    left out by a last strided view of the patch Gram at the h_o×w_o output positions, so the
    output gradient needs no zero padding."""
    a, g, _, (sh, sw), _ = _as_2d(layer, _padded(layer, a), g)
    b, grp = a.shape[0], layer.groups
    c = a.shape[1] // grp
    ho, wo = g.shape[-2], g.shape[-1]
    hs, ws = ho + rh - 1, wo + rw - 1  # the super-pixel grid the output reads (≤ the input)
    m, n = hs * ws, (ho - 1) * ws + wo  # super-pixels; output positions, extra columns included
    st = a.stride()
    x = a.as_strided(  # (B, G, C/G, s_h, s_w, h_s, w_s) view of a (any strides)
        (b, grp, c, sh, sw, hs, ws),
        (st[0], c * st[1], st[1], st[2], st[3], sh * st[2], sw * st[3]),
        a.storage_offset(),
    )
    s = x.reshape(b * grp, c * sh * sw, m)  # (B·G, F, M) sensitive, one copy
    ss = torch.bmm(s.transpose(1, 2), s)  # (B·G, M, M) super-pixel Gram, sensitive, contiguous
    del s
    blocks = ss.as_strided((b * grp, rh, rw, n, n), (m * m, ws * (m + 1), m + 1, m, 1))
    if device_path(ss):  # one reduction over the shifts
        uu = blocks.sum((1, 2))  # (B·G, n, n) patch Gram, sensitive
    else:  # on CPU a reduction over strided dims is slow (9 ms, not 0.2, at B = 256): a loop
        uu = blocks[:, 0, 0].clone()
        for p, q in itertools.product(range(rh), range(rw)):
            if p or q:
                uu.add_(blocks[:, p, q])
    del ss, blocks  # the super-pixels' Gram is no longer needed
    su = uu.stride()  # its (h_o, w_o, h_o, w_o) output positions, extra columns left out
    uu = uu.as_strided((b * grp, ho, wo, ho, wo), (su[0], ws * su[1], su[1], ws * su[2], su[2]))
    g3 = g.reshape(b * grp, layer.out_channels // grp, ho * wo)  # (B·G, O/G, L)
    ggt = torch.bmm(g3.transpose(1, 2), g3)  # (B·G, L, L) sensitive
    sq = ggt.view(uu.shape).mul_(uu).sum((1, 2, 3, 4))  # (B·G,)
    return sq if grp == 1 else sq.view(b, grp).sum(1)  # (B,)


def _grad_sample_by_backward(
    layer: _ConvNd, a: torch.Tensor, g: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Per-sample gradients of any convolution as one weight gradient of torch's own kernel:
    the batch folded into the groups (input (1, B·C_in, …), groups B·G), so that output
    channel block b·G + k only sees sample b's group k. Used for Conv3d."""
    x = _padded(layer, a)
    b, grp = x.shape[0], layer.groups
    sp = x.dim() - 2
    weight = layer.weight.new_empty((b * layer.out_channels, *layer.weight.shape[1:]))
    _, w, _ = torch.ops.aten.convolution_backward(
        g.reshape(1, -1, *g.shape[2:]).to(x.dtype),
        x.reshape(1, -1, *x.shape[2:]),
        weight.to(x.dtype),
        None,
        layer.stride,
        (0,) * sp,
        layer.dilation,
        False,
        (0,) * sp,
        b * grp,
        (False, True, False),
    )
    out = {"weight": w.reshape(b, *layer.weight.shape)}  # sensitive
    if layer.bias is not None:
        out["bias"] = g.flatten(2).sum(-1)  # (B, C_out) sensitive
    return out


@register_rule(nn.Conv1d, nn.Conv2d, nn.Conv3d)
class ConvRule(LayerRule):
    has_ghost = True

    def grad_sample(self, layer, a, g):
        if isinstance(layer, nn.Conv3d):
            return _grad_sample_by_backward(layer, a, g)
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
        w = F.conv2d(
            x.reshape(1, b * c, x.shape[2], x.shape[3]),
            g2.reshape(b * o, 1, ho, wo),
            None,
            (dh, dw),
            0,
            (sh, sw),
            b * c,
        )
        w = w[0, :, :kh, :kw]  # (B·O, k_h, k_w) sensitive; the output may overhang the kernel
        out = {"weight": w.reshape(b, *layer.weight.shape)}  # sensitive
        if layer.bias is not None:
            out["bias"] = g.reshape(b, o, -1).sum(-1)  # (B, C_out) sensitive
        return out

    def prefers_ghost(self, layer, a, g):
        positions = math.prod(g.shape[2:])  # L (from shapes: indexing a tensor is an op)
        d = math.prod(layer.weight.shape[1:])  # D = C_in/G · k_h · k_w
        o = layer.out_channels // layer.groups
        return positions * (d + o) < d * o

    def sq_norm(self, layer, a, g):
        b = a.shape[0]
        ratio = _superpixel_ratio(layer, g)
        if ratio is not None:
            out = {"weight": _weight_sq_norm_by_superpixels(layer, a, g, *ratio)}  # (B,)
        else:
            u, gg = _patches(layer, a, g)
            u3 = u.reshape(-1, u.shape[2], u.shape[3])  # (B·G, L, D) view
            g3 = gg.reshape(-1, gg.shape[2], gg.shape[3])  # (B·G, O/G, L) view
            uu = torch.bmm(u3, u3.transpose(1, 2))  # (B·G, L, L) sensitive
            ggt = torch.bmm(g3.transpose(1, 2), g3)  # (B·G, L, L) sensitive
            sq = uu.mul_(ggt).sum((1, 2))  # (B·G,)
            out = {"weight": sq if layer.groups == 1 else sq.view(b, layer.groups).sum(1)}
        if layer.bias is not None:
            # ‖Σ_l g_l‖²: the spatial sum in one reduction over its dims (no flattening view)
            out["bias"] = g.sum(tuple(range(2, g.dim()))).square().sum(1)  # (B,)
        return out

    def weighted_sum(self, layer, a, g, w):
        shape = (-1,) + (1,) * (g.dim() - 1)
        gw = g * w["weight"].to(g.dtype).reshape(shape)  # (B, C_out, *spatial) sensitive
        zeros = layer.padding_mode == "zeros" and not isinstance(layer.padding, str)
        x = a if zeros else _padded(layer, a)
        padding = layer.padding if zeros else (0,) * (a.dim() - 2)
        _, dw, _ = torch.ops.aten.convolution_backward(
            gw,
            x,
            layer.weight,
            None,
            layer.stride,
            padding,
            layer.dilation,
            False,
            (0,) * (a.dim() - 2),
            layer.groups,
            (False, True, False),
        )
        out = {"weight": dw}
        if layer.bias is not None:
            gb = gw if w["bias"] is w["weight"] else g * w["bias"].to(g.dtype).reshape(shape)
            out["bias"] = gb.sum([0, *range(2, gb.dim())])  # (C_out,), no transposed copy
        return out
