"""One direction of one recurrent layer, split so that both weight matrices are plain Linears.

A recurrent layer computes, for t = 1..T, gates from x_t W_ihᵀ + b_ih and h_{t−1} W_hhᵀ + b_hh.
The per-example gradient of W_ih is Σ_t δ_t x_tᵀ and that of W_hh is Σ_t δ'_t h_{t−1}ᵀ (δ, δ' the
gradients of the two pre-activation sums at step t): each is a Linear layer applied to a whole
sequence, so the engine's Linear rule (ghost norm or one batched matmul over the sequence) gives
them exactly, once per layer, instead of once per time step as a per-step cell would.

To get there the layer runs as

1. ``xp = ih(x)`` on the whole sequence (B, T, d) -> (B, T, G·H);
2. the recurrence itself under ``no_grad`` (``_scan``): states h_0..h_T (and c for LSTM) and the
   gate activations, with the current W_hh;
3. ``zp = hh(h_prev, value=z)`` on the stacked previous states (B, T, H) -> (B, T, G·H): one
   Linear call for the engine to see, whose value is the z_t the recurrence computed (a
   ``RecurrentLinear``: no second matmul; its backward is a Linear's);
4. ``_Recurrence.apply(xp, zp, h0, c0)`` returns the outputs of step 2; its backward runs the
   recurrence backward (back-propagation through time) with W_hh and hands each Linear its
   output gradient (δ for ``xp``, δ' for ``zp``) and the initial states theirs.

Autograd then gives W_ih and W_hh their ordinary gradients through the two Linear calls, so the
layer trains unchanged without dpfy, and the private engine sees two Linears called once each.

Variable lengths (packed sequences) use a (B, T) mask: past its length an example's state is
carried unchanged, so its final state is the one at its last step, and the output gradient
at masked steps is zero (hence no contribution to either weight's per-example gradient).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from dpfy.grads.rules.recurrent_linear import RecurrentLinear

__all__ = ["CELL_KINDS", "GATES", "run_direction"]

CELL_KINDS = ("rnn_tanh", "rnn_relu", "gru", "lstm")  # the recurrent cells a direction can run
GATES = {"rnn_tanh": 1, "rnn_relu": 1, "gru": 3, "lstm": 4}  # gate blocks G per cell kind


@dataclass
class _Saved:
    """What the forward recurrence keeps for the backward one (all time-major, sensitive)."""

    kind: str
    w_hh: torch.Tensor  # (G·H, H) the recurrent weight's value
    hs: torch.Tensor  # (T+1, B, H) states h_0..h_T (carried past each length)
    zs: torch.Tensor  # (T, B, G·H) h_{t−1} W_hhᵀ + b_hh, the hidden projections
    acts: torch.Tensor  # (T, B, G·H) gate activations (RNN: the new state)
    cs: torch.Tensor | None  # (T+1, B, H) LSTM cell states
    mask: torch.Tensor | None  # (T, B, 1) 1 where the step is inside the example's length


def _scan(
    kind: str,
    xp: torch.Tensor,
    w_hh: torch.Tensor,
    b_hh: torch.Tensor | None,
    h0: torch.Tensor,
    c0: torch.Tensor | None,
    mask: torch.Tensor | None,
) -> _Saved:
    """The forward recurrence (no autograd) from the input projections xp (B, T, G·H)."""
    b, t_len, gh = xp.shape
    h_size = h0.shape[-1]
    hs = xp.new_empty(t_len + 1, b, h_size)
    hs[0] = h0
    zs = xp.new_empty(t_len, b, gh)
    acts = xp.new_empty(t_len, b, gh)
    cs = None
    if kind == "lstm":
        assert c0 is not None, "an LSTM's recurrence starts from a cell state"
        cs = xp.new_empty(t_len + 1, b, h_size)
        cs[0] = c0
    wt = w_hh.t()
    h, c = h0, c0
    for t in range(t_len):
        x_t = xp[:, t]
        z = (
            torch.addmm(b_hh, h, wt, out=zs[t]) if b_hh is not None else torch.mm(h, wt, out=zs[t])
        )  # (B, G·H)
        a = acts[t]
        if kind == "lstm":
            assert c is not None and cs is not None, "an LSTM carries its cell states"
            torch.add(z, x_t, out=a)  # pre-activations of (i, f, g, o)
            a[:, : 2 * h_size].sigmoid_()
            a[:, 2 * h_size : 3 * h_size].tanh_()  # the cell candidate g
            a[:, 3 * h_size :].sigmoid_()
            i, f, g, o = a.chunk(4, 1)
            if mask is None:  # write the new states in place (no copies)
                torch.addcmul(f * c, i, g, out=cs[t + 1])
                torch.mul(o, cs[t + 1].tanh(), out=hs[t + 1])
                h, c = hs[t + 1], cs[t + 1]
                continue
            c_new = torch.addcmul(f * c, i, g)
            h_new = o * c_new.tanh()
        elif kind == "gru":
            torch.add(z[:, : 2 * h_size], x_t[:, : 2 * h_size], out=a[:, : 2 * h_size]).sigmoid_()
            r, u = a[:, :h_size], a[:, h_size : 2 * h_size]
            n = torch.addcmul(x_t[:, 2 * h_size :], r, z[:, 2 * h_size :]).tanh_()
            a[:, 2 * h_size :] = n
            h_new = torch.addcmul(n, u, h - n)  # (1 − u)·n + u·h
        else:
            pre = torch.add(z, x_t, out=a)
            h_new = pre.tanh_() if kind == "rnn_tanh" else pre.relu_()
        if mask is not None:
            m = mask[t]  # (B, 1) bool
            h_new = torch.where(m, h_new, h)
            if kind == "lstm":
                assert c is not None, "an LSTM carries its cell state"
                c_new = torch.where(m, c_new, c)
        hs[t + 1] = h_new
        h = hs[t + 1]
        if kind == "lstm":
            assert cs is not None, "an LSTM keeps its cell states"
            cs[t + 1] = c_new
            c = cs[t + 1]
    return _Saved(kind, w_hh, hs, zs, acts, cs, None if mask is None else mask.to(xp.dtype))


def _local_factors(s: _Saved) -> tuple[torch.Tensor, ...]:
    """Per-step derivative factors, computed for all steps at once before the backward loop.

    LSTM (gates i, f, g, o; c̃_t = f c_{t−1} + i g, h̃_t = o tanh c̃_t):
      p = [g·i(1−i), c_{t−1}·f(1−f), i·(1−g²)] so that δ_{i,f,g} = dc̃ ⊙ p,
      q = tanh c̃ · o(1−o) so that δ_o = dh̃ ⊙ q, and k = o(1 − tanh² c̃) so that dc̃ += dh̃ ⊙ k.
    GRU (r, u, n; h̃ = (1−u) n + u h): a = (1−u)(1−n²) gives δ_n = dh̃ ⊙ a, bz = (h − n) u(1−u)
      gives δ_u, cr = z_n r(1−r) (z_n the candidate's hidden projection) gives δ_r = δ_n ⊙ cr;
      the h-part of δ_n is δ_n ⊙ r.
    RNN: the activation's derivative at the new state.
    """
    h_size = s.hs.shape[-1]
    if s.kind == "lstm":
        assert s.cs is not None, "an LSTM's scan saved its cell states"
        i, f, g, o = s.acts.unflatten(2, (4, h_size)).unbind(2)
        tc = s.cs[1:].tanh()
        p = torch.stack((g * i * (1 - i), s.cs[:-1] * f * (1 - f), i * (1 - g * g)), 2)
        return p, tc * o * (1 - o), o * (1 - tc * tc), f
    if s.kind == "gru":
        r, u, n = s.acts.unflatten(2, (3, h_size)).unbind(2)
        dn = (1 - u) * (1 - n * n)
        return dn, (s.hs[:-1] - n) * u * (1 - u), s.zs[..., 2 * h_size :] * r * (1 - r), r, u
    if s.kind == "rnn_tanh":
        return (1 - s.acts * s.acts,)
    return ((s.acts > 0).to(s.acts.dtype),)


def _backward(
    s: _Saved, d_out: torch.Tensor | None, d_hn: torch.Tensor | None, d_cn: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Back-propagation through time: (δ for xp, δ' for zp (both (T, B, G·H)), dh_0, dc_0)."""
    t_len, b, h_size = s.hs.shape[0] - 1, s.hs.shape[1], s.hs.shape[2]
    gh = s.acts.shape[-1]
    fac = _local_factors(s)
    dx = s.acts.new_empty(t_len, b, gh)
    dz = s.acts.new_empty(t_len, b, gh) if s.kind == "gru" else dx
    dh = d_hn if d_hn is not None else s.hs.new_zeros(b, h_size)
    dc = None
    if s.kind == "lstm":
        dc = d_cn if d_cn is not None else s.hs.new_zeros(b, h_size)
    for t in range(t_len - 1, -1, -1):
        if d_out is not None:
            dh = dh + d_out[:, t]
        keep_h = keep_c = None
        if s.mask is not None:  # past the length the state is carried: its gradient too
            m = s.mask[t]
            keep_h, dh = dh * (1 - m), dh * m
            if dc is not None:
                keep_c, dc = dc * (1 - m), dc * m
        if s.kind == "lstm":
            p, q, k, f = fac
            assert dc is not None, "an LSTM's cell-state gradient starts above the loop"
            dc = torch.addcmul(dc, dh, k[t])  # dc̃
            d4 = dx[t].view(b, 4, h_size)
            torch.mul(p[t], dc.unsqueeze(1), out=d4[:, :3])
            torch.mul(q[t], dh, out=d4[:, 3])
            dc = dc * f[t]
            if keep_c is not None:
                dc = dc + keep_c
            dh_prev = None
        elif s.kind == "gru":
            a, bz, cr, r, u = fac
            d3, z3 = dx[t].view(b, 3, h_size), dz[t].view(b, 3, h_size)
            torch.mul(dh, a[t], out=d3[:, 2])
            torch.mul(d3[:, 2], cr[t], out=d3[:, 0])
            torch.mul(dh, bz[t], out=d3[:, 1])
            z3[:, :2] = d3[:, :2]
            torch.mul(d3[:, 2], r[t], out=z3[:, 2])
            dh_prev = dh * u[t]
        else:
            torch.mul(dh, fac[0][t], out=dx[t])
            dh_prev = None
        dh = dz[t] @ s.w_hh if dh_prev is None else torch.addmm(dh_prev, dz[t], s.w_hh)
        if keep_h is not None:
            dh = dh + keep_h
    return dx, dz, dh, dc


class _Recurrence(torch.autograd.Function):
    """Outputs of a recurrence already computed by ``_scan``, with its backward (see module)."""

    @staticmethod
    def forward(
        ctx: Any,
        xp: torch.Tensor,
        zp: torch.Tensor,
        h0: torch.Tensor,
        c0: torch.Tensor | None,
        saved: _Saved,
    ) -> tuple[torch.Tensor, torch.Tensor] | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        ctx.saved = saved
        ctx.lstm = c0 is not None
        out = saved.hs[1:].transpose(0, 1).clone(memory_format=torch.contiguous_format)
        h_n = saved.hs[-1].clone()
        c_n = saved.cs[-1].clone() if saved.cs is not None else None
        if c_n is None:
            return out, h_n
        return out, h_n, c_n

    @staticmethod
    def backward(
        ctx: Any,
        d_out: torch.Tensor | None,
        d_hn: torch.Tensor | None,
        d_cn: torch.Tensor | None = None,
    ):
        s = ctx.saved
        dx, dz, dh0, dc0 = _backward(s, d_out, d_hn, d_cn)
        ctx.saved = None
        return dx.transpose(0, 1), dz.transpose(0, 1), dh0, dc0, None


def _cell(
    kind: str, x_t: torch.Tensor, z: torch.Tensor, h: torch.Tensor, c: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One step from the two projections x_t, z (B, G·H), out of place (autograd, torch.func)."""
    if kind == "lstm":
        i, f, g, o = (x_t + z).chunk(4, 1)
        assert c is not None, "an LSTM step reads the cell state"
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        return torch.sigmoid(o) * torch.tanh(c), c
    if kind == "gru":
        (xr, xu, xn), (zr, zu, zn) = x_t.chunk(3, 1), z.chunk(3, 1)
        r, u = torch.sigmoid(xr + zr), torch.sigmoid(xu + zu)
        n = torch.tanh(xn + r * zn)
        return n + u * (h - n), None
    pre = x_t + z
    return (torch.tanh(pre) if kind == "rnn_tanh" else torch.relu(pre)), None


def _direction_by_autograd(
    kind: str,
    xp: torch.Tensor,
    hh: RecurrentLinear,
    h0: torch.Tensor,
    c0: torch.Tensor | None,
    mask: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The same function step by step with plain autograd ops, from the input projections
    ``xp`` (B, T, G·H): the path under torch.func transforms (``route="vmap"``), where the
    in-place scan and its autograd.Function cannot run. One hh call per step, so slower; exact
    all the same."""
    h, c, outs = h0, c0, []
    for t in range(xp.shape[1]):
        h_new, c_new = _cell(kind, xp[:, t], hh(h), h, c)
        if mask is not None:
            m = mask[:, t, None]
            h_new = torch.where(m, h_new, h)
            c_new = None if c is None or c_new is None else torch.where(m, c_new, c)
        h, c = h_new, c_new
        outs.append(h)
    return torch.stack(outs, 1), h, c


def run_direction(
    kind: str,
    ih: nn.Linear,
    hh: RecurrentLinear,
    x: torch.Tensor,
    h0: torch.Tensor,
    c0: torch.Tensor | None,
    mask: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(outputs (B, T, H), h_T, c_T or None) of one recurrent direction over x (B, T, d).

    ``mask`` (B, T) bool marks the steps inside each example's length (None: all of them).
    """
    xp = ih(x)  # (B, T, G·H): one Linear call over the whole sequence
    if torch._C._are_functorch_transforms_active():
        return _direction_by_autograd(kind, xp, hh, h0, c0, mask)
    with torch.no_grad():
        m = None if mask is None else mask.t().unsqueeze(-1)  # (T, B, 1)
        saved = _scan(
            kind,
            xp.detach(),
            hh.weight.detach(),
            None if hh.bias is None else hh.bias.detach(),
            h0.detach(),
            None if c0 is None else c0.detach(),
            m,
        )
    # (B, T, G·H): the states the recurrence read, through the hidden Linear, whose values the
    # recurrence already computed (RecurrentLinear: no second matmul)
    zp = hh(saved.hs[:-1].transpose(0, 1), value=saved.zs.transpose(0, 1))
    outs = _Recurrence.apply(xp, zp, h0, c0, saved)
    return outs[0], outs[1], (outs[2] if kind == "lstm" else None)
