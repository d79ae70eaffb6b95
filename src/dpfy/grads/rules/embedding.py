"""Layer rule for ``nn.Embedding`` on index tensors (B, T...).

The per-sample gradient of the table E (V, d) is sparse: row v gets Σ_{t: x_t = v} g_t. Its ghost
norm is Σ_{t,t'} 1[x_t = x_t'] (g_t·g_t') (cost B·T²·d, never V·d), which we always use.
``padding_idx`` rows receive no gradient, as in torch. ``max_norm`` renormalizes the table in
place during the forward, which this rule does not model, so it is refused.
"""

from __future__ import annotations

import torch
from torch import nn

from dpfy.grads.rules.base import LayerRule, register_rule


def _flat(layer: nn.Embedding, x: torch.Tensor, g: torch.Tensor
          ) -> tuple[torch.Tensor, torch.Tensor]:
    if layer.max_norm is not None or layer.sparse:
        raise ValueError(f"nn.Embedding with max_norm or sparse=True is not supported by "
                         f"per-sample clipping, got {layer}. Remove max_norm/sparse")
    x = x.reshape(x.shape[0], -1)  # (B, T)
    g = g.reshape(g.shape[0], -1, g.shape[-1])  # (B, T, d)
    if layer.padding_idx is not None:
        g = g * (x != layer.padding_idx).unsqueeze(-1).to(g.dtype)
    return x, g


@register_rule(nn.Embedding)
class EmbeddingRule(LayerRule):
    has_ghost = True

    def grad_sample(self, layer, a, g):
        x, g = _flat(layer, a, g)
        b, t, d = g.shape
        out = torch.zeros(b, layer.num_embeddings, d, dtype=g.dtype, device=g.device)
        rows = (x + torch.arange(b, device=x.device)[:, None] * layer.num_embeddings).reshape(-1)
        out.view(-1, d).index_add_(0, rows, g.reshape(-1, d))  # (B, V, d) sensitive
        return {"weight": out}

    def prefers_ghost(self, layer, a, g):
        return True

    def sq_norm(self, layer, a, g):
        x, g = _flat(layer, a, g)
        same = (x[:, :, None] == x[:, None, :]).to(g.dtype)  # (B, T, T)
        gg = torch.bmm(g, g.transpose(1, 2))  # (B, T, T) sensitive
        return {"weight": (same * gg).sum((1, 2))}  # (B,)

    def weighted_sum(self, layer, a, g, w):
        x, g = _flat(layer, a, g)
        gw = (g * w["weight"].to(g.dtype)[:, None, None]).reshape(-1, g.shape[-1])  # (B·T, d)
        out = torch.zeros_like(layer.weight)
        out.index_add_(0, x.reshape(-1), gw.to(out.dtype))
        return {"weight": out}
