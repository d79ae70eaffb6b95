"""The per-example norm of a tied weight without forming its per-example gradient.

A weight used by several layers (GPT-2's ``wte`` and ``lm_head``) has per-example gradient
Σ_u G_u,i, the sum over its uses, and its norm needs the cross terms:

    ‖Σ_u G_u,i‖² = Σ_u Σ_v ⟨G_u,i, G_v,i⟩.

Forming Σ_u G_u,i costs B × the parameter (B·V·d floats for a vocabulary head: 134 MB for a
tiny GPT-2 at B = 32). For ``nn.Linear`` and ``nn.Embedding`` uses, every G_u,i is a sum over
positions of outer products — Linear: Σ_s g_s a_sᵀ (output gradient, input); Embedding:
Σ_t e_{x_t} δ_tᵀ (a one-hot row at the id, the output gradient) — so each inner product is a sum
over pairs of positions of products of dot products, at O(B·S·T) memory:

    Linear–Linear        ⟨G, G'⟩ = Σ_{s,t} (g_s·g'_t)(a_s·a'_t)
    Embedding–Linear     ⟨E, G⟩  = Σ_{s,t} g_s[x_t] (a_s·δ_t)
    Embedding–Embedding  ⟨E, E'⟩ = Σ_{s,t} [x_s = x'_t] (δ_s·δ'_t)

(a ``padding_idx`` position of an Embedding receives no gradient: its δ is zeroed). The
engine uses this (:func:`tied_ghost_sq_norm`) when every use of the weight is one such call on
the ghost-ready captures, and forms the per-example gradient otherwise
(``Routes.tied_grad_sample``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

import torch
from torch import nn

from dpfy.grads.capture import Call, at_least_float32
from dpfy.grads.rules.embedding import EmbeddingRule, flat_ids
from dpfy.grads.rules.linear import LinearRule, as_seq
from dpfy.grads.layers import Layer

__all__ = ["TiedUse", "tied_uses", "tied_use", "tied_sq_norm", "tied_ghost_sq_norm"]

Uses = list[tuple[Layer, str]]  # (layer, the parameter's name relative to it), the owner first


def tied_uses(layers: list[Layer]) -> dict[str, Uses]:
    """{a tied parameter's model-level name: every (layer, relative name) that uses it}, the
    owning layer first (``grads/layers.py``: the layer at its canonical name)."""
    uses: dict[str, Uses] = {}
    for layer in layers:
        for rel in layer.tied:
            uses.setdefault(layer.tied[rel], []).append((layer, rel))
    for layer in layers:
        for rel in layer.params:
            if layer.qualified(rel) in uses:
                uses[layer.qualified(rel)].insert(0, (layer, rel))
    return uses


@dataclass(frozen=True)
class TiedUse:
    """One use of a tied weight as outer-product factors: ``left`` is the output gradient
    g (B, S, V) for a Linear or the ids x (B, T) for an Embedding, ``right`` the input a
    (B, S, d) or the output gradient δ (B, T, d). Sensitive."""

    kind: Literal["linear", "embedding"]
    left: torch.Tensor
    right: torch.Tensor


def tied_use(rule: object, layer: nn.Module, a: torch.Tensor, g: torch.Tensor) -> TiedUse | None:
    """The use's factors, or None for a layer type without them (exact types only: a subclass
    such as transformers' Conv1D lays its weight out transposed)."""
    if type(rule) is LinearRule:
        a, g = as_seq(a, g)
        return TiedUse("linear", g, a)
    if type(rule) is EmbeddingRule:
        assert isinstance(layer, nn.Embedding), "an EmbeddingRule's layer is an nn.Embedding"
        x, delta = flat_ids(layer, a, g)
        if layer.padding_idx is not None:
            delta = delta.masked_fill((x == layer.padding_idx)[..., None], 0)
        return TiedUse("embedding", x, delta)
    return None


def _inner(u: TiedUse, v: TiedUse) -> torch.Tensor:
    """⟨G_u,i, G_v,i⟩ for every example, (B,). Sensitive."""
    right = torch.bmm(u.right, v.right.transpose(1, 2))  # (B, S, T): right factors' dots
    if u.kind == v.kind == "linear":
        left = torch.bmm(u.left, v.left.transpose(1, 2))
    elif u.kind == v.kind == "embedding":
        left = (u.left[:, :, None] == v.left[:, None, :]).to(right.dtype)
    elif u.kind == "linear":  # left[b, s, t] = g_s[x_t]
        left = torch.gather(u.left, 2, v.left[:, None, :].expand(-1, u.left.shape[1], -1))
    else:
        left = torch.gather(v.left, 2, u.left[:, None, :].expand(-1, v.left.shape[1], -1))
        left = left.transpose(1, 2)
    return (left * right).sum((1, 2))


def tied_sq_norm(uses: list[TiedUse]) -> torch.Tensor:
    """‖Σ_u G_u,i‖² (B,) from the uses' factors: each use's own term and twice each pair's."""
    total = None
    for k, u in enumerate(uses):
        for j, v in enumerate(uses[k:]):
            term = _inner(u, v) * (1.0 if j == 0 else 2.0)
            total = term if total is None else total + term
    assert total is not None, "tied_sq_norm needs at least one use"
    return total


def tied_ghost_sq_norm(uses: Uses, used: Callable[[Layer], list[Call]]) -> torch.Tensor | None:
    """A tied weight's per-example squared norm (B,) from its uses' factors, when every use
    that got a gradient (``used(layer)``: its calls the loss depended on) is one Linear or
    Embedding call on its captures; else None. Sensitive."""
    factors = []
    for layer, rel in uses:
        calls = used(layer)
        if not calls:
            continue  # this use contributes nothing
        c = calls[0]
        if (
            len(calls) != 1
            or rel != "weight"
            or layer.rule is None
            or c.eager is not None
            or len(c.grads) != 1
            or c.grads[0] is None
        ):
            return None
        use = tied_use(layer.rule, layer.module, c.args[0], at_least_float32(c.grads[0]))
        if use is None:
            return None
        factors.append(use)
    return tied_sq_norm(factors) if factors else None
