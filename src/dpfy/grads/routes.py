"""Routes: each layer's per-example squared norms, then its weighted sums, from the captures.

Per layer and batch the norms take one of three routes, and the weighted sums follow it:

- ``zero``: the loss did not depend on the layer (or the batch is empty): zeros;
- ``ghost``: a rule layer called once whose rule prefers it at this size: ‖∂ℓ_i/∂θ‖² from the
  captured input and output gradient without forming per-sample gradients (``rule.sq_norm``),
  then Σ_i w_i ∂ℓ_i/∂θ by book-keeping (``rule.weighted_sum``, contracting w⊙g with the input);
- ``materialized``: per-sample gradients (B, *θ) — formed in the backward hook for a rule layer
  (``Call.eager``), by ``rule.grad_sample`` or torch.func (``grads/vmap.py``) here — kept as
  (B, P) rows; norms are row norms and weighted sums one (B,)·(B, P) product.

Norms per *privacy unit* (a group of rows: a user's examples, an example's augmented copies)
are ‖Σ_{i∈u} ∂ℓ_i/∂θ‖². A ghost layer whose rule is position-additive (Linear, Embedding)
packs each unit's rows into one sequence and takes its ghost norm (:func:`packed_sq_norm`,
``grads/packing.py``): no per-sample or per-unit gradient is formed. Every other layer forms
per-sample gradients and sums them per group with ``index_add`` (:func:`grouped_sq_norms`); a
ghost layer still takes the book-keeping weighted sum, so only one layer's (B, P) gradients are
alive at a time. Which of the two a batch took depends on how many rows its largest unit has,
which is not public: no batch's route is kept or reported (``GradEngine.explain_planned``).

Two weight sets proportional on the rows where the second is non-zero (OSO's pair) are summed
in one pass over a ghost layer's rows (:class:`Split`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from dpfy.grads.capture import Call, Capture, check_unchanged
from dpfy.grads.packing import UnitPacking
from dpfy.grads.layers import Layer
from dpfy.grads.vmap import vmap_grad_sample

__all__ = ["Routes", "Split", "find_split", "grouped_sq_norms", "packed_sq_norm", "per_sample_rows"]

Rows = tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]  # (B, P) view, unflatten


def per_sample_rows(t: torch.Tensor) -> Rows:
    """Per-sample gradients (B, *θ) as a (B, P) matrix, without a copy when possible.

    Rules may return per-sample gradients as a permuted view (the layout their batched matmul
    produced). Rows are taken in storage order, so a permuted contiguous tensor is viewed, not
    copied; the returned function maps a (P,) row back to θ's shape.
    """
    if t.dim() == 1:  # a 0-dim parameter (nn.Parameter(torch.tensor(1.0))): one column
        return t.view(-1, 1), lambda row: row.view(())
    if t.dim() == 2 and t.is_contiguous():  # a vector parameter: already its rows (no view op)
        return t, lambda row: row
    strides = t.stride()
    natural = list(range(1, t.dim()))
    order = sorted(natural, key=lambda d: -strides[d])
    # the permutes only where the layout is not θ's own (each is a dispatched op on a device)
    p = t if order == natural else t.permute(0, *order)
    if not p.is_contiguous():
        p, order = t.contiguous(), natural
    shape = p.shape[1:]
    if order == natural:
        return p.view(p.shape[0], -1), lambda row: row.view(shape)
    inverse = [order.index(d) for d in natural]
    return p.view(p.shape[0], -1), lambda row: row.view(shape).permute(*inverse)


def _row_sums(rows: dict[str, Rows], w: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Σ_i w_i row_i for materialized per-sample rows, back in each parameter's shape."""
    # rᵀ w as one matrix-vector product (w @ r dispatches it as an unsqueezed matmul: 3 ops)
    return {
        rel: unflatten(torch.mv(r.t(), w[rel].to(r.dtype))).contiguous()
        for rel, (r, unflatten) in rows.items()
    }


def packed_sq_norm(
    layer: Layer, a: Any, g: torch.Tensor, unit_of_row: torch.Tensor, num_units: int, b: int
) -> dict[str, torch.Tensor] | None:
    """The privacy units' ‖Σ_{i∈u} ∂ℓ_i/∂θ‖² (U,) by the rule's ghost norm on each unit's rows
    packed into one sequence (``grads/packing.py``), at the captured scale; None when the rule
    is not position-additive, when packing would more than double the rows (a few heavy units
    among light ones), or when the rule prefers per-sample gradients at the packed length."""
    assert layer.rule is not None, "packed_sq_norm is asked of rule layers only"
    tails = layer.rule.position_tails
    if tails is None or not isinstance(a, torch.Tensor):
        return None
    packing = UnitPacking.of(unit_of_row.to(g.device), num_units)
    if packing.padded_rows() > 2 * max(b, 1):
        return None
    pa, pg = packing.pack(a, tails[0]), packing.pack(g, tails[1])  # sensitive
    if not layer.rule.prefers_ghost(layer.module, pa, pg):
        return None
    return layer.rule.sq_norm(layer.module, pa, pg)  # (U,) each


def grouped_sq_norms(r: torch.Tensor, unit_of_row: torch.Tensor, num_units: int) -> torch.Tensor:
    """‖Σ_{i: unit_of_row[i] = u} r_i‖² for each privacy unit u, (U,), in r's dtype.

    ``r`` is (B, P) per-sample gradient rows, ``unit_of_row`` (B,) int64 in [0, U).
    """
    sums = r.new_zeros(num_units, r.shape[1]).index_add_(0, unit_of_row.to(r.device), r)  # (U, P)
    # sensitive: each unit's summed gradient
    return torch.linalg.vector_norm(sums, dim=1).square()  # (U,) sensitive


# How far apart the ratios w1_i/w2_i may be and still count as one constant (float32 rounding
# of C/‖g_i‖ against C·(1/‖g_i‖)); the smallest ratio is used, so no example gains weight.
_RATIO_RTOL = 1e-5


@dataclass(frozen=True)
class Split:
    """Two weight sets w1, w2 (B,) with w1_i = c·w2_i wherever w2_i ≠ 0 (OSO: the clipped
    gradient's min(1, C/‖g_i‖) and the threshold gradient's 1[‖g_i‖ > C]/‖g_i‖, c = C).

    Then Σ_i w1_i g_i = Σ_{w2_i = 0} w1_i g_i + c·Σ_i w2_i g_i: both sums from one pass over the
    batch's rows (each row in one of two gathered parts) instead of two. ``c`` is the smallest
    ratio, so every example's effective weight c·w2_i is ≤ its declared w1_i (never more than
    the sensitivity the step checked), and ≥ (1 − 1e-5)·w1_i.
    """

    zero: torch.Tensor  # indices of rows with w2 = 0
    nonzero: torch.Tensor  # indices of rows with w2 ≠ 0
    ratio: float  # c
    w1: torch.Tensor  # (B,) sensitive
    w2: torch.Tensor  # (B,) sensitive

    def sums(self, layer: Layer, a: torch.Tensor, g: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        def part(rows: torch.Tensor, w: torch.Tensor) -> dict[str, torch.Tensor]:
            if rows.numel() == 0:
                return {rel: torch.zeros_like(p) for rel, p in layer.all_params.items()}
            wr = w.index_select(0, rows)
            assert layer.rule is not None, "the ghost sums are of rule layers only"
            return layer.rule.weighted_sum(
                layer.module,
                a.index_select(0, rows),
                g.index_select(0, rows),
                {rel: wr for rel in layer.all_params},
            )

        second = part(self.nonzero, self.w2)
        rest = part(self.zero, self.w1)
        return [{rel: rest[rel] + self.ratio * t for rel, t in second.items()}, second]


def find_split(w1: torch.Tensor, w2: torch.Tensor) -> Split | None:
    """The :class:`Split` of two (B,) weight sets, or None (not proportional where w2 ≠ 0)."""
    if w1.dim() != 1 or w1.shape != w2.shape:
        return None
    nz = w2 != 0
    nonzero, zero = nz.nonzero().flatten(), (~nz).nonzero().flatten()
    if nonzero.numel() == 0:
        return None
    ratios = w1[nonzero].double() / w2[nonzero].double()
    lo, hi = float(ratios.min()), float(ratios.max())
    if not (lo > 0 and hi <= lo * (1 + _RATIO_RTOL)):
        return None
    return Split(zero=zero, nonzero=nonzero, ratio=lo, w1=w1, w2=w2)


def _layer_split(
    per_set: list[dict[str, torch.Tensor]], cache: dict[tuple[int, int], Split | None]
) -> Split | None:
    """The :class:`Split` of a layer's two weight sets, or None (each set must give all the
    layer's parameters one (B,) tensor, and the ratios must be one constant)."""
    ids = [{id(t) for t in ws.values()} for ws in per_set]
    if any(len(i) != 1 for i in ids):
        return None
    key = (ids[0].pop(), ids[1].pop())
    if key not in cache:
        w1, w2 = (next(iter(ws.values())) for ws in per_set)
        cache[key] = find_split(w1, w2)
    return cache[key]


def _with_frozen(w: dict[str, torch.Tensor], layer: Layer) -> dict[str, torch.Tensor]:
    """A rule layer's weights extended to the layer's frozen parameters (a frozen bias, or the
    weight under BitFit): rules form every parameter of their layer, so each gets a weight; the
    frozen ones' sums are computed and dropped (they are never released)."""
    if layer.rule is None or not w:
        return w
    frozen = set(layer.rule.params(layer.module)) - set(w)
    if not frozen:
        return w
    some = next(iter(w.values()))
    return {**w, **{rel: some for rel in frozen}}


class Routes:
    """Per layer: the route the current batch takes and what the weighted sums need of it.

    ``cache[id(layer)]`` is ("zero", None), ("ghost", the call) or ("materialized", rows), set
    by :meth:`sq_norms` and used up by :meth:`weighted_sums`.
    """

    def __init__(self, capture: Capture) -> None:
        self.capture = capture
        self.cache: dict[int, tuple[str, Any]] = {}

    def clear(self) -> None:
        self.cache.clear()

    def sq_norms(
        self,
        layer: Layer,
        calls: list[Call],
        b: int,
        s2: float,
        unit_of_row: torch.Tensor | None = None,
        num_units: int = 0,
    ) -> dict[str, torch.Tensor]:
        """{rel: ‖∂ℓ_i/∂θ‖²} (B,) for the layer's parameters (``s2``: the squared scale from a
        captured row to example i's gradient), or with ``unit_of_row`` the privacy units'
        ‖Σ_{i∈u} ∂ℓ_i/∂θ‖² (U,). Sensitive."""
        grouped = unit_of_row is not None
        if not calls or b == 0:  # an empty batch, or a layer the loss did not depend on
            self.cache[id(layer)] = ("zero", None)
            return {
                rel: p.new_zeros(num_units if grouped else b) for rel, p in layer.params.items()
            }
        for c in calls:
            check_unchanged(layer, c)
        if layer.rule is not None and len(calls) == 1 and calls[0].eager is None:
            c = calls[0]
            a, g = c.args[0], c.grads[0]
            assert g is not None  # a call with no eager sums kept its output gradient
            if layer.takes_ghost(a, g):
                self.cache[id(layer)] = ("ghost", c)
                if unit_of_row is not None:
                    sq = packed_sq_norm(layer, a, g, unit_of_row, num_units, b)
                    if sq is None:  # this layer's per-sample gradients, only while grouped
                        gs = c.rule_grad_sample(layer, g)  # sensitive: rel -> (B, *θ)
                        return {
                            rel: grouped_sq_norms(
                                per_sample_rows(t)[0], unit_of_row, num_units
                            ).mul_(s2)
                            for rel, t in gs.items()
                        }
                else:
                    sq = layer.rule.sq_norm(layer.module, a, g)
                return {rel: t * s2 for rel, t in sq.items()} if s2 != 1 else sq
        gs = self.grad_sample(layer, calls)  # sensitive: rel -> (B, *θ.shape), captured scale
        rows = {rel: per_sample_rows(t) for rel, t in gs.items()}  # sensitive: (B, P) views
        self.cache[id(layer)] = ("materialized", rows)
        if unit_of_row is not None:
            return {
                rel: grouped_sq_norms(r, unit_of_row, num_units).mul_(s2)
                for rel, (r, _) in rows.items()
            }
        # (B,) each, no (B, P) temporary; squared in one foreach launch for all the layer's
        # parameters; unscaled rows (s2 = 1, the usual case) need no launch to scale
        norms = [torch.linalg.vector_norm(r, dim=1) for r, _ in rows.values()]
        # a foreach op refuses an empty list (a rule returning no rows): the engine then refuses
        squares = [n.square() for n in norms] if len(norms) < 2 else torch._foreach_pow(norms, 2)
        if s2 != 1 and squares:
            torch._foreach_mul_(squares, s2)
        return dict(zip(rows, squares))

    def grad_sample(self, layer: Layer, calls: list[Call]) -> dict[str, torch.Tensor]:
        """Per-sample gradients {rel: (B, *θ)}, at the captured scale, summed over calls."""
        total: dict[str, torch.Tensor] = {}
        for c in calls:
            if c.eager is not None:
                gs = c.eager
            elif layer.rule is not None:
                g = c.grads[0]
                assert g is not None  # a call with no eager sums kept its output gradient
                gs = c.rule_grad_sample(layer, g)
            else:
                with self.capture.paused():  # our own forward of the layer: not captured
                    gs = vmap_grad_sample(
                        layer.module,
                        layer.name,
                        layer.all_params,
                        c.args,
                        c.kwargs,
                        c.grads,
                        in_dims=c.in_dims,
                    )
            for rel, t in gs.items():
                total[rel] = t if rel not in total else total[rel] + t
        return total  # sensitive

    def tied_grad_sample(self, uses: list[tuple[Layer, str]], b: int) -> torch.Tensor:
        """Per-example gradients (B, *θ) of a tied parameter: the sum of its uses' contributions.

        Exact (not a bound): ‖Σ_u G_u,i‖ includes the cross terms between the uses, which a sum
        of per-use ghost norms would miss. Costs B × the parameter's size in memory.
        """
        total = None
        for layer, rel in uses:
            calls = self.capture.used(layer)
            if calls and b:
                t = self.grad_sample(layer, calls)[rel]
                total = t if total is None else total + t
        p = uses[0][0].all_params[uses[0][1]]
        return total if total is not None else p.new_zeros((b,) + tuple(p.shape))  # sensitive

    def weighted_sums(
        self,
        layer: Layer,
        per_set: list[dict[str, torch.Tensor]],
        splits: dict[tuple[int, int], Split | None],
    ) -> list[dict[str, torch.Tensor]]:
        """Σ_i w_i ∂ℓ_i/∂θ per weight set ({rel: (B,)}, already scaled), by the route the
        norms took; the layer's captures and cached values are dropped. Sensitive."""
        kind, data = self.cache.pop(id(layer))
        self.capture.calls[id(layer)].clear()
        per_set = [_with_frozen(w, layer) for w in per_set]
        split = _layer_split(per_set, splits) if kind == "ghost" and len(per_set) == 2 else None
        if split is not None:  # two sums for the rows of one (OSO's pair)
            return split.sums(layer, data.args[0], data.grads[0])
        return [self._weighted_sum(layer, kind, data, w) for w in per_set]

    @staticmethod
    def _weighted_sum(
        layer: Layer, kind: str, data: Any, w: dict[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        if kind == "zero":
            return {rel: torch.zeros_like(p) for rel, p in layer.all_params.items()}
        if kind == "ghost":
            assert layer.rule is not None, "only rule layers take the ghost route"
            return layer.rule.weighted_sum(layer.module, data.args[0], data.grads[0], w)
        return _row_sums(data, w)
