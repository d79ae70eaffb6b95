"""``GradEngine``: per-sample gradient norms and weighted sums from the user's one backward pass.

Attach it to a model and it

1. *holds* the trainable parameters (autograd's ``requires_grad`` off, ``grads/held.py``) so
   autograd no longer computes the non-private parameter gradient (that matmul is replaced by
   our weighted sum, so a private step costs about what a non-private one does), while
   ``p.requires_grad`` still reads True for user code;
2. captures each layer's inputs and output gradients during the user's forward and backward
   (``grads/capture.py``), with the private batch found in every layer's input
   (``grads/layout.py``) and each row checked to be its own example's
   (``grads/row_identity.py``);
3. on request computes per-sample squared norms per parameter, ‖∂ℓ_i/∂θ_k‖² (B,), by ghost norm
   or materialized per-sample gradients (layer rules) or torch.func (vmap layers), and the
   weighted sums Σ_i w_i ∂ℓ_i/∂θ_k by book-keeping, with no second backward
   (``grads/routes.py``; tied weights: ``grads/tied.py``);
4. states per layer which route it takes and why (``grads/explain.py``).

This class is the facade over those pieces; the step calls ``bind_batch``, then after the
user's backward ``per_sample_sq_norms`` (or ``per_unit_sq_norms``, per unit of privacy) and
``weighted_sums``.

``loss_reduction="mean"`` means the user's loss is (1/B)Σ_i ℓ_i over the physical batch of B
rows, so example i's own gradient is B times the captured one; the factor is applied to the
norms (B²) and the weights (B), never in a pass over the captured tensors.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from dpfy._require import require
from dpfy.grads.arithmetic import in_full_precision
from dpfy.grads.capture import Capture, check_unchanged
from dpfy.grads.explain import explain_rows
from dpfy.grads.held import hide_from_ddp, hold, release, show_to_ddp
from dpfy.grads.routes import Routes, Split, grouped_sq_norms
from dpfy.grads.tied import tied_ghost_sq_norm, tied_uses
from dpfy.grads.layers import build_layers

__all__ = ["GradEngine", "LOSS_REDUCTIONS", "require_loss_reduction"]

LOSS_REDUCTIONS = ("mean", "sum")


def require_loss_reduction(loss_reduction: str) -> None:
    """Refuse a ``loss_reduction`` that is not one of :data:`LOSS_REDUCTIONS` (how the loss
    reduces over the batch: it sets the scale the per-example gradients are read at)."""
    require(
        loss_reduction in LOSS_REDUCTIONS,
        "loss_reduction",
        loss_reduction,
        f"one of {list(LOSS_REDUCTIONS)}",
    )


class GradEngine:
    """Per-sample norms and weighted sums for all trainable parameters of ``model``.

    Args:
      model: the model; its trainable parameters are those with ``requires_grad`` at attach.
      route: ``"auto"`` (rules where registered, vmap for other modules), ``"ghost"`` (rules
        only; raises for a module without a rule) or ``"vmap"`` (torch.func on the whole model).
      loss_reduction: ``"mean"`` or ``"sum"``: how the user's loss reduces over the batch.
      declare_row_wise: the user vouches that every row of every layer's input and gradient
        depends on its own example only; a model the perturbation probe cannot run is then
        accepted with a warning instead of refused (``grads/perturbation.py``).
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        route: str = "auto",
        loss_reduction: str = "mean",
        declare_row_wise: bool = False,
    ) -> None:
        require_loss_reduction(loss_reduction)
        self.model = model
        self.route = route
        self.loss_reduction = loss_reduction
        self.named_params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        require(
            len(self.named_params) > 0,
            "model",
            type(model).__name__,
            "a module with trainable parameters",
            "Check requires_grad",
        )
        self.layers = build_layers(model, route, {id(p) for _, p in self.named_params})
        self._tied = tied_uses(self.layers)  # tied parameter name -> its uses, owner first
        self._capture = Capture(model, self.layers, self.named_params[0][1].device)
        self._capture.declared_row_wise = declare_row_wise
        self._routes = Routes(self._capture)
        self._b = 0  # batch size of the captures the norms were computed on
        for _, p in self.named_params:
            hold(p)
        hide_from_ddp(model, [n for n, _ in self.named_params])

    def bind_batch(self, rows: Callable[[], int | None] | int | None) -> None:
        """Tell the engine how many rows the private batch being trained on has (the guard).

        ``rows`` is a callable read at every forward and at the norms (the private optimizer
        binds its loader's current batch: ``None`` while no batch is pending), an int, or None
        (unbound: dim 0 of each layer's input is its batch, the engine's standalone use). Bound,
        every captured layer must hold exactly those rows: a layer used time-first gets its batch
        dimension moved first when only one dimension can be it, an input shared by every
        example (leading dimension 1) is expanded over the batch, and anything else (a loss over
        other data, a ``PackedSequence``) is refused with :class:`~dpfy.errors.PrivacyRefusal`
        naming the layer when its gradient is used.
        """
        self._capture.bind_batch(rows)

    def clear(self) -> None:
        """Drop every captured activation, gradient and cached per-sample value (sensitive)."""
        self._capture.clear()
        self._routes.clear()

    def detach(self) -> None:
        """Remove the hooks and give the parameters autograd's ``requires_grad`` back (what it
        read while held: False for one frozen since)."""
        self._capture.remove()
        self._routes.clear()
        for _, p in self.named_params:
            release(p)
        show_to_ddp(self.model)

    def batch_size(self) -> int:
        """B of the captured physical batch: every used capture must hold the batch's rows.

        Raises:
          PrivacyRefusal: a layer whose gradient is used was called on rows that are not the
            private batch's (see :meth:`bind_batch`), naming every such layer and the fix.
        """
        return self._capture.batch_size()

    def _scale(self, b: int) -> float:
        """Factor from a captured gradient row to example i's own gradient (B for a mean loss).

        Captured gradients are never rescaled in place (a full pass over them): norms are
        multiplied by its square and the weights by it instead.
        """
        return float(b) if self.loss_reduction == "mean" else 1.0

    # -- phase 1: norms --------------------------------------------------------------------
    def per_sample_sq_norms(self) -> dict[str, torch.Tensor]:
        """{parameter name: ‖∂ℓ_i/∂θ‖² (B,)} for every trainable parameter. Sensitive."""
        return self._sq_norms(None, 0)

    def per_unit_sq_norms(
        self, unit_of_row: torch.Tensor | None, *, num_units: int | None = None
    ) -> dict[str, torch.Tensor]:
        """{parameter name: ‖Σ_{i∈u} ∂ℓ_i/∂θ‖² (U,)} per unit of privacy u. Sensitive.

        A unit of privacy (``dpfy/sampling/units.py``) is the group of rows whose joint
        contribution DP bounds: one user's examples (user-level DP), an example's K augmented
        copies. Not to be confused with :attr:`layers`, the model split into layers.

        Args:
          unit_of_row: (B,) integer tensor, the privacy unit of each row of the captured batch,
            in [0, U); rows of a unit need not be contiguous. None: every row is its own unit,
            and this is exactly :meth:`per_sample_sq_norms` (the ghost routes, unchanged).
          num_units: U (default: ``unit_of_row.max() + 1``); a unit without rows in this
            batch gets 0.

        A ghost layer whose rule is position-additive (Linear, Embedding, GPT-2's Conv1D)
        takes its ghost norm on each unit's rows packed into one sequence: a unit's rows are
        like the positions of one example (‖Σ_{i∈u} Σ_t g_it a_itᵀ‖² from the same inner
        products; ``grads/packing.py``), so no per-unit gradient is formed. Other layers (and
        a ghost layer whose packing would more than double the batch, or whose rule prefers
        per-sample gradients at the packed length) form per-sample gradients and sum them per
        unit with ``index_add``, in their dtype, one layer at a time; ``route="ghost"`` works
        too (every layer rule has ``grad_sample``).

        Weighted sums need no per-unit path: with a weight w_u per unit,
        Σ_u w_u Σ_{i∈u} g_i = Σ_i w_{u(i)} g_i, so pass the row weights w_{u(i)}
        (``w_unit[unit_of_row]``) to :meth:`weighted_sums`.
        """
        if unit_of_row is None:
            return self.per_sample_sq_norms()
        b = self.batch_size()
        require(
            unit_of_row.dim() == 1
            and unit_of_row.shape[0] == b
            and not unit_of_row.is_floating_point()
            and not unit_of_row.is_complex(),
            "unit_of_row",
            f"a {unit_of_row.dtype} tensor of shape {tuple(unit_of_row.shape)}",
            f"an integer tensor of shape ({b},)",
            "Give the privacy unit of each row of the captured batch",
        )
        # one host read of both ends (a sync on a GPU; user-level steps only)
        low, top = tuple(torch.stack(unit_of_row.aminmax()).tolist()) if b else (0, -1)
        u = top + 1 if num_units is None else num_units
        require(
            low >= 0 and top < u,
            "unit_of_row",
            f"values in [{low}, {top}]",
            f"in [0, num_units = {u})",
            "Number the privacy units 0, 1, ..., U - 1",
        )
        return self._sq_norms(unit_of_row.long(), u)

    @in_full_precision  # the clip factors' norms in float32, as the sums (grads/arithmetic.py)
    def _sq_norms(
        self, unit_of_row: torch.Tensor | None, num_units: int
    ) -> dict[str, torch.Tensor]:
        """Per row (``unit_of_row`` None) or per privacy unit: see the two public methods."""
        b = self._b = self.batch_size()
        s2 = self._scale(b) ** 2
        # per example, the rules' norms are scaled by s2 at the end in one foreach op (one
        # launch, not one per parameter); the same product t·s2 either way
        at_end = unit_of_row is None and s2 != 1.0
        out: dict[str, torch.Tensor] = {}
        for layer in self.layers:
            norms = self._routes.sq_norms(
                layer, self._capture.used(layer), b, 1.0 if at_end else s2, unit_of_row, num_units
            )
            missing = set(layer.params) - set(norms)
            require(
                not missing,
                f"layer rule of {type(layer.module).__name__}",
                sorted(missing),
                "covering every trainable parameter of the layer",
                "Freeze those parameters or use route='vmap'",
            )
            for rel, sq in norms.items():
                if rel in layer.params:  # its own trainable ones: not a frozen bias, not a tied use
                    out[layer.qualified(rel)] = sq
        if at_end and out:
            out = dict(zip(out, torch._foreach_mul(list(out.values()), s2)))
        for name, uses in self._tied.items():
            if unit_of_row is not None:
                rows = self._routes.tied_grad_sample(uses, b).flatten(1)  # (B, P) sensitive
                out[name] = grouped_sq_norms(rows, unit_of_row, num_units).mul_(s2)
                continue
            tied_sq = tied_ghost_sq_norm(uses, self._capture.used)  # sensitive (B,), or None
            if tied_sq is None:
                tied_sq = self._routes.tied_grad_sample(uses, b).flatten(1).square().sum(1)
            out[name] = tied_sq.mul_(s2)
        return out

    @in_full_precision
    def per_sample_grads(self) -> dict[str, torch.Tensor]:
        """{parameter name: ∂ℓ_i/∂θ (B, *θ.shape)}, materialized for every layer. Sensitive.

        For methods that transform per-sample gradients coordinate-wise (AdaClip): every layer
        takes the materialized route (memory B × parameters), whatever the ghost route would
        cost. The captures are dropped afterwards; sum with the returned tensors.
        """
        b = self._b = self.batch_size()
        s = self._scale(b)
        out: dict[str, torch.Tensor] = {}
        for layer in self.layers:
            calls = self._capture.used(layer)
            if not calls or b == 0:
                gs = {
                    rel: p.new_zeros((b,) + tuple(p.shape)) for rel, p in layer.all_params.items()
                }
            else:
                for c in calls:
                    check_unchanged(layer, c)
                gs = {
                    rel: t * s if s != 1.0 else t
                    for rel, t in self._routes.grad_sample(layer, calls).items()
                }  # (B, *θ)
            for rel, t in gs.items():
                q = layer.qualified(rel)  # a tied parameter: the sum over its uses
                out[q] = t if q not in out else out[q] + t
        self.clear()
        return {n: out[n] for n, _ in self.named_params}

    # -- phase 2: weighted sums ------------------------------------------------------------
    def weighted_sums(self, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """{parameter name: Σ_i w_i ∂ℓ_i/∂θ} for weights {name: (B,)} (sensitive inputs)."""
        return self.weighted_sums_many([weights])[0]

    @in_full_precision
    def weighted_sums_many(
        self, weight_sets: list[dict[str, torch.Tensor]]
    ) -> list[dict[str, torch.Tensor]]:
        """One weighted sum per weight set, from the same captures (sensitive inputs).

        Several sums serve a method that releases a second parameter-shaped sum (OSO's
        threshold gradient Σ_i 1[‖g_i‖ > C] g_i/‖g_i‖). Call after :meth:`per_sample_sq_norms`
        on the same captures. Each layer's captures are dropped as soon as its sums are formed,
        last layer first (the order backward freed them in), so that the largest sums are not
        allocated while every activation is still held.
        """
        outs: list[dict[str, torch.Tensor]] = [{} for _ in weight_sets]
        s = self._scale(self._b)
        unique = {id(t): t for ws in weight_sets for t in ws.values()}  # shared: scaled once
        scaled = {k: t * s for k, t in unique.items()} if s != 1.0 else unique
        splits: dict[tuple[int, int], Split | None] = {}
        for layer in reversed(self.layers):
            per_set = [
                {rel: scaled[id(ws[layer.qualified(rel)])] for rel in layer.all_params}
                for ws in weight_sets
            ]
            for sums, out in zip(self._routes.weighted_sums(layer, per_set, splits), outs):
                for rel, t in sums.items():
                    if rel not in layer.all_params:
                        continue  # a frozen parameter of the layer (see routes._with_frozen)
                    q = layer.qualified(rel)  # a tied parameter: Σ_i w_i Σ_uses G_use,i
                    out[q] = t if q not in out else out[q] + t
        return [{n: out[n] for n, _ in self.named_params} for out in outs]

    # -- checks and explanations -----------------------------------------------------------
    def preflight(self) -> list[str]:
        """Every problem of the captured forward/backward at once, without raising (the probe
        of :func:`dpfy.validate`): calls the batch guard refuses, layers whose per-example
        gradients fail (no torch.func support, dropout inside a vmap layer, a rule refusing its
        input), and a loss that reaches no trainable parameter. Drops the captures."""
        used = [(layer, c) for layer in self.layers for c in self._capture.used(layer)]
        problems = list(dict.fromkeys(c.problem for _, c in used if c.problem is not None))
        rows = self._capture.rows()
        sizes = {c.batch_size for _, c in used if c.problem is None}
        if not used:
            problems.append(
                "loss.backward() must reach a trainable parameter, got no layer "
                "with a gradient. Check that the loss depends on the model's output"
            )
        elif rows is not None and sizes - {rows}:
            problems.append(
                f"every layer must be called on the {rows} rows of the batch, got "
                f"{sorted(sizes)}. Compute the loss only from that batch"
            )
        elif len(sizes) == 1:
            b = sizes.pop()
            for layer in self.layers:
                calls = [c for c in self._capture.used(layer) if c.problem is None]
                try:
                    if calls:
                        self._routes.sq_norms(layer, calls, b, self._scale(b) ** 2)
                except Exception as e:  # each layer's failure is one problem of the list
                    problems.append(f"{layer.label}: {e}")
        self.clear()
        return problems

    def explain(self) -> list[dict[str, Any]]:
        """One row per layer: module, type, parameter count, rule file, route and why.

        After a forward/backward on an example batch (captures present) the route each rule
        layer takes at that input size is stated: ``ghost`` or ``per-sample``; otherwise the
        rule ("ghost or per-sample, by size per batch"). A training batch's route is never
        kept (its shape can depend on the data).
        """
        return explain_rows(self.layers, self._capture.used, self.route)

    def explain_planned(self) -> list[dict[str, Any]]:
        """The rows from the model and the route setting alone, whatever was captured: what
        the privacy report records (data-independent, so nothing in it is a release)."""
        return explain_rows(self.layers, lambda layer: [], self.route)
