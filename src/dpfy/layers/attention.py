"""``DPMultiheadAttention``: ``nn.MultiheadAttention`` computed from ``nn.Linear`` calls.

``nn.MultiheadAttention`` keeps its input projection as one (3E, E) parameter used through
``F.multi_head_attention_forward``, so no layer rule sees a Linear call, and torch.func cannot
batch its masks' checks or its dropout. This module computes the same function from two Linears,
``in_proj`` (sharing ``in_proj_weight``/``in_proj_bias``) and ``out_proj``, whose per-example
gradients the engine's Linear rule gives exactly, so masks and attention dropout (ordinary
randomness: nothing is recomputed) are supported.

The input projection is one Linear call: on ``query`` for self-attention (query, key and value
the same tensor, the usual case), else on the three inputs concatenated along the sequence,
keeping the query block of the query rows, the key block of the key rows and the value block of
the value rows. The unused blocks then receive a zero output gradient, so the per-example
gradient Σ_t g_t a_tᵀ of the shared (3E, E) weight is exactly that of the three projections
(at 3× the projection's cost for cross-attention).

Supported: masks (``key_padding_mask`` (B, S) and ``attn_mask`` (T, S) or (B·heads, T, S),
boolean "True = not allowed" or additive float), ``is_causal``, ``dropout``, ``batch_first``
either way, unbatched inputs, ``need_weights``/``average_attn_weights``, ``bias``, ``kdim``/
``vdim`` equal to ``embed_dim``. Refused: ``add_bias_kv``, ``add_zero_attn`` and key/value
dimensions other than ``embed_dim``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dpfy._require import require

__all__ = ["DPMultiheadAttention"]

_FIX = "Replace the module by hand, or train it with route='vmap' without masks and dropout"


class DPMultiheadAttention(nn.Module):
    """Drop-in ``nn.MultiheadAttention`` for private training (see module docstring).

    ``state_dict`` keys are ``nn.MultiheadAttention``'s (``in_proj_weight``, ``in_proj_bias``,
    ``out_proj.weight``, ``out_proj.bias``).
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        add_bias_kv: bool = False,
        add_zero_attn: bool = False,
        kdim: int | None = None,
        vdim: int | None = None,
        batch_first: bool = False,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        require(
            embed_dim % num_heads == 0,
            "DPMultiheadAttention.embed_dim",
            embed_dim,
            f"divisible by num_heads = {num_heads}",
        )
        require(not add_bias_kv, "DPMultiheadAttention.add_bias_kv", add_bias_kv, "False", _FIX)
        require(
            not add_zero_attn, "DPMultiheadAttention.add_zero_attn", add_zero_attn, "False", _FIX
        )
        for name, d in (("kdim", kdim), ("vdim", vdim)):
            require(
                d is None or d == embed_dim,
                f"DPMultiheadAttention.{name}",
                d,
                f"None or embed_dim = {embed_dim}",
                _FIX,
            )
        require(0 <= dropout <= 1, "DPMultiheadAttention.dropout", dropout, "in [0, 1]")
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.kdim = self.vdim = embed_dim
        self._qkv_same_embed_dim = True
        self.dropout, self.batch_first = float(dropout), batch_first
        factory = {"device": device, "dtype": dtype}
        self.in_proj = nn.Linear(embed_dim, 3 * embed_dim, bias=bias, **factory)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **factory)
        self._reset_parameters()
        self._register_state_dict_hook(_to_torch_keys)
        self._register_load_state_dict_pre_hook(_from_torch_keys)

    def _reset_parameters(self) -> None:
        """torch's initialization: Xavier-uniform in_proj, zero biases."""
        nn.init.xavier_uniform_(self.in_proj.weight)
        if self.in_proj.bias is not None:
            nn.init.zeros_(self.in_proj.bias)
            nn.init.zeros_(self.out_proj.bias)

    # attributes nn.TransformerEncoderLayer reads (its inference fast path)
    @property
    def in_proj_weight(self) -> torch.Tensor:
        return self.in_proj.weight

    @property
    def in_proj_bias(self) -> nn.Parameter | None:
        return self.in_proj.bias

    merge_masks = nn.MultiheadAttention.merge_masks

    @classmethod
    def from_module(cls, m: nn.MultiheadAttention) -> "DPMultiheadAttention":
        """A module computing what ``m`` computes, sharing its ``nn.Parameter`` objects."""
        require(
            type(m) is nn.MultiheadAttention, "module", type(m).__name__, "an nn.MultiheadAttention"
        )
        require(
            m._qkv_same_embed_dim,
            "nn.MultiheadAttention kdim/vdim",
            (m.kdim, m.vdim),
            f"equal to embed_dim = {m.embed_dim} for a DP replacement",
            _FIX,
        )
        with torch.device("meta"):
            new = cls(
                m.embed_dim,
                m.num_heads,
                m.dropout,
                m.in_proj_bias is not None,
                m.bias_k is not None,
                m.add_zero_attn,
                batch_first=m.batch_first,
            )
        new.in_proj.weight = m.in_proj_weight
        new.in_proj.bias = m.in_proj_bias
        new.out_proj.weight = m.out_proj.weight
        new.out_proj.bias = m.out_proj.bias
        new.train(m.training)
        return new

    def extra_repr(self) -> str:
        return (
            f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
            f"dropout={self.dropout}, batch_first={self.batch_first}"
        )

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
        need_weights: bool = True,
        attn_mask: torch.Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        unbatched = query.dim() == 2
        same_kv = key is value
        same_qkv = same_kv and query is key
        q_in, k_in, v_in = (
            _batch_first(t, self.batch_first, unbatched) for t in (query, key, value)
        )  # (B, T|S, E)
        q, k, v = self._project(q_in, k_in, v_in, same_qkv)
        b, t_len, s_len = q.shape[0], q.shape[1], k.shape[1]
        h, d = self.num_heads, self.head_dim
        q, k, v = (x.reshape(b, x.shape[1], h, d).transpose(1, 2) for x in (q, k, v))
        if is_causal and attn_mask is None:
            attn_mask = torch.ones(t_len, s_len, dtype=torch.bool, device=q.device).triu(1)
        bias = self._additive_mask(attn_mask, key_padding_mask, b, t_len, s_len, q.dtype, unbatched)
        p = self.dropout if self.training else 0.0
        if need_weights:  # the weights are an output: form them
            scores = q @ k.transpose(-2, -1) / math.sqrt(d)  # (B, h, T, S)
            attn = (scores if bias is None else scores + bias).softmax(-1)
            attn = F.dropout(attn, p, training=True) if p > 0 else attn
            heads = attn @ v
        else:  # torch's fused kernel, as nn.MultiheadAttention uses here (fully masked rows: 0)
            heads = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=p)
        out = heads.transpose(1, 2).reshape(b, t_len, self.embed_dim)
        out = self.out_proj(out)  # (B, T, E)
        if unbatched:
            out = out.squeeze(0)
        elif not self.batch_first:
            out = out.transpose(0, 1)
        if not need_weights:
            return out, None
        w = attn.mean(1) if average_attn_weights else attn
        return out, (w.squeeze(0) if unbatched else w)

    def _project(
        self, q_in: torch.Tensor, k_in: torch.Tensor, v_in: torch.Tensor, same_qkv: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(q, k, v) from one call of ``in_proj`` (module docstring)."""
        e = self.embed_dim
        if same_qkv:
            return self.in_proj(q_in).chunk(3, -1)
        require(
            q_in.shape[0] == k_in.shape[0] == v_in.shape[0],
            "DPMultiheadAttention query/key/value batch sizes",
            (q_in.shape[0], k_in.shape[0], v_in.shape[0]),
            "equal",
        )
        t_len, s_len = q_in.shape[1], k_in.shape[1]
        y = self.in_proj(torch.cat((q_in, k_in, v_in), 1))  # (B, T + 2S, 3E)
        return (
            y[:, :t_len, :e],
            y[:, t_len : t_len + s_len, e : 2 * e],
            y[:, t_len + s_len :, 2 * e :],
        )

    def _additive_mask(
        self,
        attn_mask: torch.Tensor | None,
        key_padding_mask: torch.Tensor | None,
        b: int,
        t_len: int,
        s_len: int,
        dtype: torch.dtype,
        unbatched: bool,
    ) -> torch.Tensor | None:
        """One float mask broadcastable to (B, h, T, S) from torch's two mask arguments."""
        out = None
        if attn_mask is not None:
            m = _as_additive(attn_mask, dtype)
            if m.dim() == 3:  # (B·h, T, S)
                require(
                    m.shape[0] == b * self.num_heads,
                    "attn_mask.shape[0]",
                    m.shape[0],
                    f"batch·num_heads = {b * self.num_heads} for a 3-D mask",
                )
                m = m.reshape(b, self.num_heads, t_len, s_len)
            out = m
        if key_padding_mask is not None:
            kp = key_padding_mask.unsqueeze(0) if unbatched else key_padding_mask
            kp = _as_additive(kp, dtype)[:, None, None, :]  # (B, 1, 1, S)
            out = kp if out is None else out + kp
        return out


def _as_additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean mask (True = not allowed) as −inf/0, a float mask as is."""
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(
            mask, float("-inf")
        )
    return mask.to(dtype)


def _batch_first(x: torch.Tensor, batch_first: bool, unbatched: bool) -> torch.Tensor:
    """x as (B, L, E)."""
    if unbatched:
        return x.unsqueeze(0)
    return x if batch_first else x.transpose(0, 1)


def _to_torch_keys(module: DPMultiheadAttention, state: dict, prefix: str, local: Any) -> None:
    for ours, theirs in (("in_proj.weight", "in_proj_weight"), ("in_proj.bias", "in_proj_bias")):
        if prefix + ours in state:
            state[prefix + theirs] = state.pop(prefix + ours)


def _from_torch_keys(state: dict, prefix: str, *args: Any) -> None:
    for ours, theirs in (("in_proj.weight", "in_proj_weight"), ("in_proj.bias", "in_proj_bias")):
        if prefix + theirs in state:
            state[prefix + ours] = state.pop(prefix + theirs)
