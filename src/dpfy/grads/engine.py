"""The per-sample gradient engine: one backward pass, then norms, then weighted sums.

Attach it to a model and it

1. *freezes* the trainable parameters (``requires_grad=False``) so autograd no longer computes
   the non-private parameter gradient (that matmul is replaced by our weighted sum, so a private
   step costs about what a non-private one does), and makes layer outputs require grad where
   needed so that ``loss.backward()`` still runs;
2. captures each unit's inputs (forward hook) and output gradients (tensor hook) during the
   user's forward and backward;
3. on request computes per-sample squared norms per parameter, ‖∂ℓ_i/∂θ_k‖² (B,), by ghost norm
   or materialized per-sample gradients (rules) or torch.func (vmap units);
4. then the weighted sums Σ_i w_i ∂ℓ_i/∂θ_k by book-keeping (contracting w⊙g with the stored
   activations; no second backward).

``loss_reduction="mean"`` means the user's loss is (1/B)Σ_i ℓ_i over the physical batch of B
rows, so captured gradients are rescaled by B to be example i's own gradient.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from dpfy._validate import require
from dpfy.grads.units import Unit, build_units
from dpfy.grads.vmap import vmap_grad_sample

__all__ = ["GradEngine", "LOSS_REDUCTIONS"]

LOSS_REDUCTIONS = ("mean", "sum")


def _ghost(unit: Unit, a: torch.Tensor, g: torch.Tensor) -> bool:
    """Whether a rule unit's call on input ``a`` with output gradient ``g`` goes the ghost way."""
    return unit.rule.has_ghost and unit.rule.prefers_ghost(unit.module, a, g)


@dataclass
class _Call:
    """One captured forward call of a unit and the gradients its outputs received.

    For a rule unit whose route is "materialized", the per-sample gradients are formed in the
    backward hook as soon as the output gradient arrives, and the input and output gradient are
    dropped (``eager``): for small layers such as LayerNorm that frees B·T·d activations early.
    """

    args: tuple[Any, ...]                       # detached inputs; args[0] is (B, ...) sensitive
    kwargs: dict[str, Any]
    batch_size: int
    grads: list[torch.Tensor | None] = field(default_factory=list)  # per output leaf, sensitive
    eager: dict[str, torch.Tensor] | None = None  # per-sample gradients (B, *θ), sensitive

    @property
    def used(self) -> bool:
        return self.eager is not None or any(g is not None for g in self.grads)


class GradEngine:
    """Per-sample norms and weighted sums for all trainable parameters of ``model``.

    Args:
      model: the model; its trainable parameters are those with ``requires_grad`` at attach.
      engine: ``"auto"`` (rules where registered, vmap for other modules), ``"ghost"`` (rules
        only; raises for a module without a rule) or ``"vmap"`` (torch.func on the whole model).
      loss_reduction: ``"mean"`` or ``"sum"``: how the user's loss reduces over the batch.
    """

    def __init__(self, model: nn.Module, *, engine: str = "auto",
                 loss_reduction: str = "mean") -> None:
        require(loss_reduction in LOSS_REDUCTIONS, "loss_reduction", loss_reduction,
                f"one of {list(LOSS_REDUCTIONS)}")
        self.model = model
        self.engine = engine
        self.loss_reduction = loss_reduction
        self.named_params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        require(len(self.named_params) > 0, "model", type(model).__name__,
                "a module with trainable parameters", "Check requires_grad")
        self.units = build_units(model, engine, {id(p) for _, p in self.named_params})
        self._calls: dict[int, list[_Call]] = {id(u): [] for u in self.units}
        self._cache: dict[int, tuple[str, Any]] = {}
        self._last_route: dict[int, str] = {}  # unit -> route taken on the last batch (public)
        self._handles = [u.module.register_forward_hook(self._hook(u), with_kwargs=True)
                         for u in self.units]
        for _, p in self.named_params:
            p.requires_grad_(False)

    # -- capture ---------------------------------------------------------------------------
    def _hook(self, unit: Unit):
        calls = self._calls[id(unit)]

        def hook(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
            if not torch.is_grad_enabled():
                return
            xs = tuple(a.detach() if torch.is_tensor(a) else a for a in args)
            b = next((a.shape[0] for a in xs if torch.is_tensor(a)), 0)
            call = _Call(xs, {k: v.detach() if torch.is_tensor(v) else v
                              for k, v in kwargs.items()}, b)
            leaves = [t for t in tree_flatten(output)[0] if torch.is_tensor(t)]
            call.grads = [None] * len(leaves)
            for k, t in enumerate(leaves):
                if not t.is_floating_point():
                    continue
                if not t.requires_grad:
                    t.requires_grad_(True)  # a leaf: our frozen weights made it constant
                t.register_hook(self._keeper(unit, call, k))
            calls.append(call)
        return hook

    def _keeper(self, unit: Unit, call: _Call, k: int):
        def keep(grad: torch.Tensor) -> None:
            rule = unit.rule
            if (rule is not None and len(call.grads) == 1 and call.batch_size > 0
                    and (call.eager is not None or not _ghost(unit, call.args[0], grad))):
                gs = rule.grad_sample(unit.module, call.args[0], grad)  # sensitive
                call.eager = gs if call.eager is None else {
                    n: call.eager[n] + t for n, t in gs.items()}
                call.args = (call.args[0][:0],) + call.args[1:]  # keep dtype/shape info only
                return
            call.grads[k] = grad if call.grads[k] is None else call.grads[k] + grad
        return keep

    def clear(self) -> None:
        """Drop every captured activation, gradient and cached per-sample value (sensitive)."""
        for calls in self._calls.values():
            calls.clear()
        self._cache.clear()

    def detach(self) -> None:
        """Remove the hooks and give the parameters their ``requires_grad`` back."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self.clear()
        for _, p in self.named_params:
            p.requires_grad_(True)

    # -- phase 1: norms --------------------------------------------------------------------
    def _scale(self, call: _Call) -> float:
        return float(call.batch_size) if self.loss_reduction == "mean" else 1.0

    def batch_size(self) -> int:
        """B of the captured physical batch; all units must agree (batch dim first)."""
        sizes = {c.batch_size for calls in self._calls.values() for c in calls if c.used}
        require(len(sizes) <= 1, "the batch dimension", sorted(sizes),
                "the same (dim 0) for every layer",
                "Put the batch first (e.g. batch_first=True) and do not reshape it away")
        require(len(sizes) == 1, "loss.backward()", "not called",
                "called before optimizer.step()",
                "No per-sample gradient was captured: run forward and loss.backward() on a "
                "batch from the private loader first")
        return sizes.pop()

    def per_sample_sq_norms(self) -> dict[str, torch.Tensor]:
        """{parameter name: ‖∂ℓ_i/∂θ‖² (B,)} for every trainable parameter. Sensitive."""
        b = self.batch_size()
        out: dict[str, torch.Tensor] = {}
        for u in self.units:
            calls = [c for c in self._calls[id(u)] if c.used]
            norms = self._unit_sq_norms(u, calls, b)
            missing = set(u.params) - set(norms)
            require(not missing, f"layer rule of {type(u.module).__name__}", sorted(missing),
                    "covering every trainable parameter of the layer",
                    "Freeze those parameters or use engine='vmap'")
            for rel, sq in norms.items():
                out[u.qualified(rel)] = sq
            kind = self._cache[id(u)][0]
            if kind != "zero":
                self._last_route[id(u)] = ("vmap" if u.rule is None else
                                           "ghost" if kind == "ghost" else "per-sample")
        return out

    def _unit_sq_norms(self, u: Unit, calls: list[_Call], b: int) -> dict[str, torch.Tensor]:
        if not calls or b == 0:  # an empty batch, or a unit the loss did not depend on
            self._cache[id(u)] = ("zero", None)
            return {rel: p.new_zeros(b) for rel, p in u.params.items()}
        if u.rule is not None and len(calls) == 1 and calls[0].eager is None:
            c = calls[0]
            a, g = c.args[0], c.grads[0]
            if _ghost(u, a, g):
                self._cache[id(u)] = ("ghost", c)
                s2 = self._scale(c) ** 2
                return {rel: sq * s2 for rel, sq in u.rule.sq_norm(u.module, a, g).items()}
        gs = self._grad_sample(u, calls)  # sensitive: rel -> (B, *θ.shape)
        self._cache[id(u)] = ("materialized", gs)
        return {rel: torch.linalg.vector_norm(t.reshape(t.shape[0], -1), dim=1).square()
                for rel, t in gs.items()}  # (B,) each, no (B, P) temporary

    def _grad_sample(self, u: Unit, calls: list[_Call]) -> dict[str, torch.Tensor]:
        """Per-sample gradients of example losses ℓ_i, summed over the unit's calls."""
        total: dict[str, torch.Tensor] = {}
        for c in calls:
            if c.eager is not None:
                gs = c.eager
            elif u.rule is not None:
                gs = u.rule.grad_sample(u.module, c.args[0], c.grads[0])
            else:
                gs = vmap_grad_sample(u.module, u.name, u.params, c.args, c.kwargs, c.grads)
            s = self._scale(c)
            for rel, t in gs.items():
                t = t * s if s != 1.0 else t
                total[rel] = t if rel not in total else total[rel] + t
        return total

    # -- phase 2: weighted sums ------------------------------------------------------------
    def weighted_sums(self, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """{parameter name: Σ_i w_i ∂ℓ_i/∂θ} for weights {name: (B,)} (sensitive inputs).

        Call after :meth:`per_sample_sq_norms` on the same captures. Each unit's captures are
        dropped as soon as its sum is formed, last layer first (the order backward freed them
        in), so that the largest sums are not allocated while every activation is still held.
        """
        out: dict[str, torch.Tensor] = {}
        for u in reversed(self.units):
            kind, data = self._cache.pop(id(u))
            self._calls[id(u)].clear()
            w = {rel: weights[u.qualified(rel)] for rel in u.params}
            if kind == "zero":
                sums = {rel: torch.zeros_like(p) for rel, p in u.params.items()}
            elif kind == "ghost":
                s = self._scale(data)
                shared = {id(t): t * s for t in w.values()}  # keep shared weights shared
                sums = u.rule.weighted_sum(u.module, data.args[0], data.grads[0],
                                           {rel: shared[id(t)] for rel, t in w.items()})
            else:
                sums = {rel: torch.einsum("b,b...->...", w[rel].to(t.dtype), t)
                        for rel, t in data.items()}
            del data
            for rel, t in sums.items():
                out[u.qualified(rel)] = t
        return {n: out[n] for n, _ in self.named_params}

    def explain(self) -> list[dict[str, Any]]:
        """One row per unit: module, type, parameter count, rule file, route and why.

        After a forward/backward on an example batch (captures present) the route each rule
        unit takes at that input size is stated: ``ghost`` or ``per-sample``; after training
        steps, the route taken on the last batch is.
        """
        rows = []
        for u in self.units:
            calls = [c for c in self._calls[id(u)] if c.used]
            if u.rule is None:
                why = ("whole model (engine='vmap')" if u.name == "" and self.engine == "vmap"
                       else "no layer rule for this type; torch.func on its subtree")
                rows.append(u.explain(why))
                continue
            row = u.explain("registered layer rule")
            if not calls and id(u) in self._last_route:
                row["engine"] = self._last_route[id(u)]
                row["why"] = "route taken on the last training batch"
            elif len(calls) > 1:
                row["engine"], row["why"] = "per-sample", f"called {len(calls)} times per batch"
            elif calls:
                c = calls[0]
                ghost = c.eager is None and _ghost(u, c.args[0], c.grads[0])
                row["engine"] = "ghost" if ghost else "per-sample"
                row["why"] = ("ghost norm is cheaper than per-sample gradients at this size"
                              if ghost else "per-sample gradients are cheaper at this size"
                              if u.rule.has_ghost else "per-sample gradients are small")
            rows.append(row)
        return rows
