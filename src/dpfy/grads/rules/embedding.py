"""Layer rule for ``nn.Embedding`` on index tensors (B, T...).

The per-sample gradient of the table E (V, d) is sparse: row v gets S_v = Σ_{t: x_t = v} g_t. Its
ghost norm Σ_v ‖S_v‖² is formed from those row sums directly, never from V·d: sorting each
example's ids gives every position the slot of its id among the example's distinct ids, g rows are
summed into their slots (B·T·d work and memory, where the pairwise form Σ_{t,t'} 1[x_t = x_t']
(g_t·g_t') costs B·T²·d and a (B, T, T) mask), and the squared norms of the slots add up per
example. When no example repeats an id (position ids, for instance) S_v is a single g_t and the
norm is Σ_t ‖g_t‖², with no scatter at all. The ghost route is always used. When every example
has the same ids (positions again), only one example's ids are sorted for the norm, and the
weighted sum weights g over examples first (T·d rows to scatter instead of B·T·d).

``padding_idx`` rows receive no gradient, as in torch. ``max_norm`` renormalizes the table in
place during the forward, which this rule does not model, so it is refused.
"""

from __future__ import annotations

import torch
from torch import nn

from dpfy.grads.rules.base import LayerRule, register_rule


def _flat(layer: nn.Embedding, x: torch.Tensor, g: torch.Tensor
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Ids as (B, T) and output gradients as (B, T, d); padding positions are not masked here."""
    if layer.max_norm is not None or layer.sparse:
        raise ValueError(f"nn.Embedding with max_norm or sparse=True is not supported by "
                         f"per-sample clipping, got {layer}. Remove max_norm/sparse")
    return x.reshape(x.shape[0], -1), g.reshape(g.shape[0], -1, g.shape[-1])


@register_rule(nn.Embedding)
class EmbeddingRule(LayerRule):
    has_ghost = True

    def batch_dims(self, layer, a):
        return tuple(range(a.dim()))  # ids: every dimension is a position or the batch

    def grad_sample(self, layer, a, g):
        x, g = _flat(layer, a, g)
        b, t, d = g.shape
        out = torch.zeros(b, layer.num_embeddings, d, dtype=g.dtype, device=g.device)
        rows = (x + torch.arange(b, device=x.device)[:, None] * layer.num_embeddings).reshape(-1)
        out.view(-1, d).index_add_(0, rows, g.reshape(-1, d))  # (B, V, d) sensitive
        if layer.padding_idx is not None:
            out[:, layer.padding_idx] = 0  # only padding positions were added there
        return {"weight": out}

    def prefers_ghost(self, layer, a, g):
        return True

    def sq_norm(self, layer, a, g):
        x, g = _flat(layer, a, g)
        b, t, d = g.shape
        pad = layer.padding_idx
        # the same ids in every example (positions): one row's structure serves the batch
        rows = x[:1] if bool((x == x[:1]).all()) else x  # (1 or B, T)
        xs, order = rows.sort(dim=1)  # each row's ids ascending
        new = xs[:, 1:] != xs[:, :-1]  # sorted position s+1 holds another id than s
        if bool(new.all()):  # no id repeats within an example: ‖S_v‖² = ‖g_t‖²
            sq = torch.linalg.vector_norm(g, dim=-1).square_()  # (B, T) sensitive
            if pad is not None:
                sq.masked_fill_(x == pad, 0)
            return {"weight": sq.sum(1)}  # (B,)
        # slot of sorted position s = number of id changes before s, then back to the ids'
        # own order, plus the example offset b·T
        slot = torch.zeros_like(xs, dtype=torch.long)
        torch.cumsum(new, 1, out=slot[:, 1:])
        slot = torch.empty_like(slot).scatter_(1, order, slot)
        slot = slot + torch.arange(0, b * t, t, device=x.device)[:, None]  # (B, T)
        if pad is not None:
            slot.masked_fill_(x == pad, b * t)  # padding rows go to a row that is dropped
        sums = g.new_zeros(b * t + 1, d).index_add_(0, slot.reshape(-1), g.reshape(-1, d))
        sums = sums[:-1].view(b, t * d)  # (B, T·d) the rows S_v of each example, sensitive
        return {"weight": torch.linalg.vector_norm(sums, dim=1).square_()}  # (B,)

    def weighted_sum(self, layer, a, g, w):
        x, g = _flat(layer, a, g)
        b, t, d = g.shape
        wb = w["weight"].to(g.dtype)  # (B,)
        if bool((x == x[:1]).all()):  # the same ids in every example, e.g. positions
            rows = x[0]  # (T,): weight over examples first, one matrix-vector product
            gw = torch.mv(g.reshape(b, t * d).t(), wb).view(t, d)  # Σ_i w_i g_i, sensitive
        else:
            rows = x.reshape(-1)  # (B·T,)
            gw = (g * wb[:, None, None]).reshape(-1, d)  # (B·T, d) sensitive
        out = torch.zeros_like(layer.weight)
        out.index_add_(0, rows, gw.to(out.dtype))
        if layer.padding_idx is not None:
            out[layer.padding_idx] = 0  # only padding positions were added there
        return {"weight": out}
