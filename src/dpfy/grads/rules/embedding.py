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
import torch.nn.functional as F
from torch import nn

from dpfy.grads.rules.base import LayerRule, device_path, register_rule


def flat_ids(
    layer: nn.Embedding, x: torch.Tensor, g: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Ids as (B, T) and output gradients as (B, T, d); padding positions are not masked here.
    Tensors already of those ranks are returned as they are (a reshape is a dispatched op).
    Shared with the tied-embedding rule (:mod:`dpfy.grads.tied`), which reads ids the same way."""
    if layer.max_norm is not None or layer.sparse:
        raise ValueError(
            f"nn.Embedding with max_norm or sparse=True is not supported by "
            f"per-sample clipping, got {layer}. Remove max_norm/sparse"
        )
    x = x if x.dim() == 2 else x.reshape(x.shape[0], -1)
    return x, g if g.dim() == 3 else g.reshape(g.shape[0], -1, g.shape[-1])


@register_rule(nn.Embedding)
class EmbeddingRule(LayerRule):
    has_ghost = True
    position_tails = (0, 1)  # G_i = Σ_t onehot(x_t) g_tᵀ: ids have no feature dim

    def batch_dims(self, layer, a):
        return tuple(range(a.dim()))  # ids: every dimension is a position or the batch

    def grad_sample(self, layer, a, g):
        x, g = flat_ids(layer, a, g)
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
        x, g = flat_ids(layer, a, g)
        b, t, d = g.shape
        if t == 0:  # empty sequences read no row: a zero gradient (and no arange of step 0)
            return {"weight": g.new_zeros(b)}
        pad = layer.padding_idx
        # the same ids in every example (positions): one row's structure serves the batch. The
        # shortcuts read the ids on the host; on a device (a sync each) the general path runs
        rows = x[:1] if not device_path(x) and bool((x == x[:1]).all()) else x  # (1 or B, T)
        xs, order = rows.sort(dim=1)  # each row's ids ascending
        new = xs[:, 1:] != xs[:, :-1]  # sorted position s+1 holds another id than s
        if not device_path(x) and bool(new.all()):  # no id repeats: ‖S_v‖² = ‖g_t‖²
            sq = torch.linalg.vector_norm(g, dim=-1).square_()  # (B, T) sensitive
            if pad is not None:
                sq.masked_fill_(x == pad, 0)
            return {"weight": sq.sum(1)}  # (B,)
        # slot of sorted position s = number of id changes before s, then back to the ids'
        # own order, plus the example offset b·T
        slot = F.pad(torch.cumsum(new, 1), (1, 0))  # (1 or B, T) int64, first slot 0
        slot = torch.empty_like(slot).scatter_(1, order, slot)
        slot = slot + torch.arange(0, b * t, t, device=x.device)[:, None]  # (B, T)
        if pad is not None:
            slot.masked_fill_(x == pad, b * t)  # padding rows go to a row that is dropped
        extra = pad is not None  # that row exists only with a padding id (a slice less)
        sums = g.new_zeros(b * t + extra, d).index_add_(0, slot.reshape(-1), g.reshape(-1, d))
        sums = (sums[:-1] if extra else sums).view(b, t * d)  # (B, T·d) rows S_v, sensitive
        return {"weight": torch.linalg.vector_norm(sums, dim=1).square_()}  # (B,)

    def weighted_sum(self, layer, a, g, w):
        x, g = flat_ids(layer, a, g)
        b, t, d = g.shape
        wb = w["weight"].to(g.dtype)  # (B,)
        if not device_path(x) and bool((x == x[:1]).all()):  # the same ids in every example
            rows = x[0]  # (T,): weight over examples first, one matrix-vector product
            gw = torch.mv(g.reshape(b, t * d).t(), wb).view(t, d)  # Σ_i w_i g_i, sensitive
        else:
            rows = x.reshape(-1)  # (B·T,)
            gw = (g * wb.view(-1, 1, 1)).reshape(-1, d)  # (B·T, d) sensitive
        out = torch.zeros_like(layer.weight)
        out.index_add_(0, rows, gw.to(out.dtype))
        if layer.padding_idx is not None:
            out.select(0, layer.padding_idx).zero_()  # only padding positions were added there
        return {"weight": out}


def _bag_entries(
    a: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(bag, id, weight) of every entry of the canonical input (see ``EmbeddingBagRule``)."""
    ids, wts = a[..., 0].long(), a[..., 1]  # (B, L)
    valid = ids >= 0
    bag = torch.arange(a.shape[0], device=a.device)[:, None].expand_as(ids)
    return bag[valid], ids[valid], wts[valid].to(dtype)


@register_rule(nn.EmbeddingBag)
class EmbeddingBagRule(LayerRule):
    """``nn.EmbeddingBag`` in modes ``sum`` and ``mean``, with 2-D ids or 1-D ids and offsets.

    Bag i's output is o_i = Σ_{t∈bag i} c_t E[x_t] with c_t the per-sample weight (sum mode, 1
    by default) or 1/|bag i| (mean mode; padding ids are not counted, as in torch). So the
    per-example gradient of E has row v = (Σ_{t∈bag i, x_t=v} c_t) g_i, and its squared norm is
    ‖g_i‖² Σ_v (Σ_{t: x_t=v} c_t)², formed from (bag, id) pairs, never from V·d.

    The batch is the bags: :meth:`batch_input` turns (ids, offsets, per_sample_weights) into one
    (B, L, 2) float64 tensor holding, for each bag, its ids (−1: none) and their coefficients
    c_t, so that the engine's batch guard sees B rows. ``max`` mode (its gradient follows an
    argmax), ``max_norm`` and ``sparse=True`` are refused.
    """

    has_ghost = True

    def batch_input(self, layer, args, kwargs):
        if layer.mode == "max" or layer.max_norm is not None or layer.sparse:
            raise ValueError(
                f"nn.EmbeddingBag must use mode 'sum' or 'mean' without max_norm or "
                f"sparse=True for per-sample clipping, got {layer}. Use mode='sum' or 'mean'"
            )
        names = ("input", "offsets", "per_sample_weights")
        x, offsets, psw = (args[k] if k < len(args) else kwargs.get(n) for k, n in enumerate(names))
        if x.dim() == 2:
            bag = torch.arange(x.shape[0], device=x.device)[:, None].expand_as(x).reshape(-1)
            pos = torch.arange(x.shape[1], device=x.device).repeat(x.shape[0])
            b, ids = x.shape[0], x.reshape(-1)
        else:
            starts = offsets[:-1] if layer.include_last_offset else offsets
            b, n = starts.shape[0], x.shape[0]
            bag = torch.searchsorted(starts, torch.arange(n, device=x.device), right=True) - 1
            pos = torch.arange(n, device=x.device) - starts[bag]
            ids = x
        c = (
            psw.reshape(-1).double()
            if psw is not None
            else torch.ones(ids.shape[0], dtype=torch.float64, device=x.device)
        )
        if layer.padding_idx is not None:
            c = c.masked_fill(ids == layer.padding_idx, 0.0)
        if layer.mode == "mean":
            count = torch.zeros(b, dtype=torch.float64, device=x.device).index_add_(
                0, bag, (c != 0).double() if layer.padding_idx is not None else torch.ones_like(c)
            )
            c = c / count.clamp(min=1)[bag]
        width = int(pos.max()) + 1 if pos.numel() else 1
        out = torch.zeros(b, width, 2, dtype=torch.float64, device=x.device)
        out[..., 0] = -1
        out[bag, pos, 0] = ids.double()
        out[bag, pos, 1] = c
        return out  # (B, L, 2): ids and coefficients per bag

    def prefers_ghost(self, layer, a, g):
        return True

    def grad_sample(self, layer, a, g):
        bag, ids, c = _bag_entries(a, g.dtype)
        out = torch.zeros(
            a.shape[0] * layer.num_embeddings, g.shape[-1], dtype=g.dtype, device=g.device
        )
        out.index_add_(0, bag * layer.num_embeddings + ids, c[:, None] * g[bag])  # sensitive
        return {"weight": out.view(a.shape[0], layer.num_embeddings, -1)}

    def sq_norm(self, layer, a, g):
        bag, ids, c = _bag_entries(a, g.dtype)
        keys, inverse = torch.unique(bag * layer.num_embeddings + ids, return_inverse=True)
        coef = torch.zeros(keys.shape[0], dtype=g.dtype, device=g.device).index_add_(0, inverse, c)
        s = torch.zeros(a.shape[0], dtype=g.dtype, device=g.device).index_add_(
            0, keys // layer.num_embeddings, coef.square()
        )  # Σ_v c_{i,v}² per bag
        return {"weight": s * torch.linalg.vector_norm(g, dim=-1).square()}  # (B,)

    def weighted_sum(self, layer, a, g, w):
        bag, ids, c = _bag_entries(a, g.dtype)
        scale = c * w["weight"].to(g.dtype)[bag]  # sensitive
        out = torch.zeros_like(layer.weight)
        out.index_add_(0, ids, (scale[:, None] * g[bag]).to(out.dtype))
        return {"weight": out}
