"""Capture: what the user's own forward and backward leave for the per-sample gradients.

The engine never runs a second backward. During the user's forward, a hook on every layer
(``grads/layers.py``) keeps the call's detached inputs, with the private batch found in them (the
batch guard: ``grads/layout.py``); a tensor hook on each output keeps the gradient the loss sends
it. That is all a layer rule needs (a layer's input and output gradient), and all a vmap layer
needs to recompute its per-example vector–Jacobian products.

Three details make that work with the parameters frozen (``requires_grad=False``, so that
autograd does not form the non-private gradient; ``grads/engine.py``):

- a layer whose input is data (the first layer) then has a constant output, which autograd would
  not differentiate: it passes through :class:`Tap` (``grads/calls.py``, with :class:`Call`,
  what is kept of one call), an identity whose backward hands the
  gradient to the capture;
- autograd no longer saves a layer's input, so an in-place change after the layer would go
  unnoticed: each input's version counter is kept and checked (:func:`check_unchanged`);
- a call whose route is materialized forms its per-sample gradients in the backward hook, as
  soon as its output gradient arrives, and drops the input and gradient (``Call.eager``).

The hooks also serve the two probes. While a probe runs the model again (:meth:`Capture.rerun`)
each call is recorded into the probe instead of captured: its input shapes for the layout probe
(``grads/layout.py``), its input values for the row-identity probe (``grads/row_identity.py``),
which the capture runs at the end of the first training forward.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_unflatten

from dpfy._hooks import OwnHook
from dpfy._require import require
from dpfy.errors import PrivacyRefusal
from dpfy.grads.calls import Call, Tap, version_of, at_least_float32, check_unchanged
from dpfy.grads.layout import (
    AMBIGUOUS,
    BROADCAST,
    LayoutProbe,
    call_shapes,
    expand_rows,
    probed_rule_dim,
    probed_vmap_problem,
    rule_batch_dim,
    rule_candidates,
    run_layout_probe,
    shape_of,
    vmap_ambiguous,
    vmap_batch_dims,
)
from dpfy.grads.perturbation import PerturbProbe, find_cross_row
from dpfy.grads.row_identity import (
    MIN_ROWS,
    ProbedForward,
    RowProbe,
    find_mixing,
    row_probe_applies,
)
from dpfy.grads.layers import Layer

__all__ = ["Call", "Capture", "Tap", "at_least_float32", "check_unchanged"]


class Capture:
    """The hooks on ``model`` and, per layer, the calls of the batch being trained on.

    ``calls[id(layer)]`` lists the layer's captured calls in call order (several for a layer
    called several times per forward). :meth:`bind_batch` gives the private batch's size, which
    every captured call must hold (:meth:`batch_size` raises the problems recorded).
    """

    def __init__(self, model: nn.Module, layers: list[Layer], device: torch.device | None) -> None:
        self.model = model
        self.layers = layers
        self.device = device  # of the trainable parameters: the probes fork the RNG there
        self.calls: dict[int, list[Call]] = {id(layer): [] for layer in layers}
        self.rows: Callable[[], int | None] = lambda: None  # the private batch's size (bound)
        self.rows_checked = False  # the row-identity probe ran (grads/row_identity.py)
        self.pair_checked = False  # it ran on a 2-row batch (partial: no reorder)
        self.declared_row_wise = False  # the user vouches for a model the probes cannot run
        self.anchor = torch.empty(0, requires_grad=True)  # see Tap; never receives a gradient
        self._recomputing = False  # inside our own vmap forward: hooks must not capture it
        self._root_call: tuple[tuple, dict] | None = None  # the model's call, inside its forward
        self._ordinals: dict[int, int] = {}  # layer -> calls so far in this forward
        self._layout: LayoutProbe | None = None  # this forward's layout probe, once run
        self._probing: LayoutProbe | RowProbe | None = None  # the probe being recorded
        self._handles = [  # OwnHook: a copy of the model (deepcopy, torch.save) gets inert hooks
            layer.module.register_forward_hook(OwnHook(self._hook(layer)), with_kwargs=True)
            for layer in layers
        ]
        self._handles += [
            model.register_forward_pre_hook(OwnHook(self._enter), with_kwargs=True),
            model.register_forward_hook(OwnHook(self._exit), always_call=True),
        ]

    def bind_batch(self, rows: Callable[[], int | None] | int | None) -> None:
        """The private batch's size: a callable read at every forward, an int, or None."""
        self.rows = rows if callable(rows) else (lambda: rows)

    def used(self, layer: Layer) -> list[Call]:
        """The layer's calls whose outputs the loss depended on."""
        return [c for c in self.calls[id(layer)] if c.used]

    def clear(self) -> None:
        """Drop every captured activation and gradient (sensitive)."""
        for calls in self.calls.values():
            calls.clear()

    def remove(self) -> None:
        """Remove the hooks and drop the captures."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self.clear()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Hooks off while the engine recomputes a vmap layer's forward itself."""
        self._recomputing = True
        try:
            yield
        finally:
            self._recomputing = False

    def rerun(self, probe: LayoutProbe | RowProbe, args: tuple, kwargs: dict) -> Any:
        """The model's forward on (args, kwargs) with every layer call recorded into
        ``probe`` instead of captured; the model's output."""
        self._probing = probe
        try:
            return self.model(*args, **kwargs)
        finally:
            self._probing = None

    def batch_size(self) -> int:
        """B of the captured physical batch: every used capture must hold the batch's rows.

        Raises:
          PrivacyRefusal: a layer whose gradient is used was called on rows that are not the
            private batch's, naming every such layer and the fix.
        """
        used = [(layer, c) for layer in self.layers for c in self.used(layer)]
        problems = list(dict.fromkeys(c.problem for _, c in used if c.problem is not None))
        if problems:
            raise PrivacyRefusal("; ".join(problems))
        rows = self.rows()
        sizes = {c.batch_size for _, c in used}
        if rows is not None and sizes - {rows}:
            wrong = sorted({layer.label for layer, c in used if c.batch_size != rows})
            raise PrivacyRefusal(
                f"every layer's gradient must come from the {rows} rows of the private batch, "
                f"got {', '.join(wrong)} called on {sorted(sizes - {rows})} rows. Compute the "
                f"loss only from the batch the private loader yielded, and step once per batch"
            )
        require(
            len(sizes) <= 1,
            "the batch dimension",
            sorted(sizes),
            "the same (dim 0) for every layer",
            "Put the batch first (e.g. batch_first=True) and do not reshape it away",
        )
        if rows == 0 and not sizes:
            # An empty Poisson batch: a model that cannot run on 0 rows (Hugging Face) may skip
            # its forward/backward; the step then releases noise only, as it must.
            return 0
        require(
            len(sizes) == 1,
            "loss.backward()",
            "not called",
            "called before optimizer.step()",
            "No per-sample gradient was captured: run forward and loss.backward() on a "
            "batch from the private loader first",
        )
        return sizes.pop()

    # -- the model's forward ---------------------------------------------------------------
    def _enter(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        """The model's forward starts: keep its call (for the probes), count afresh."""
        if self._probing is None and not self._recomputing and torch.is_grad_enabled():
            self._root_call, self._ordinals, self._layout = (args, kwargs), {}, None

    def _exit(self, module: nn.Module, args: tuple, output: Any) -> None:
        """The model's forward ends: the row-identity probe, once per engine."""
        if self._probing is None and not self._recomputing:
            if not self.rows_checked and self._root_call is not None and output is not None:
                self._check_rows()
            self._root_call, self._layout = None, None

    def _check_rows(self) -> None:
        """At the end of the first forward on a bound batch of ≥ 3 rows (the full check,
        ``row_identity.MIN_ROWS``), and of the first on 2 rows before it: give every call of
        this forward whose rows are not its examples' own the problem (raised when its
        gradient is used, listed by the pre-flight)."""
        assert self._root_call is not None  # called at the end of the model's own forward
        rows = self.rows()
        if not row_probe_applies(self._root_call, rows):
            return
        assert rows is not None  # row_probe_applies refused None
        if rows < MIN_ROWS:  # a 2-row check is partial (row_identity.py): once, then wait
            if self.pair_checked:  # for a batch of MIN_ROWS rows for the full one
                return
            self.pair_checked = True
        else:
            self.rows_checked = True
        now = {  # each layer's calls of this forward
            id(layer): calls[len(calls) - self._ordinals.get(id(layer), 0) :]
            for layer in self.layers
            for calls in [self.calls[id(layer)]]
        }
        layers = {id(layer): layer for layer in self.layers}
        probed = ProbedForward(
            self.model, self._root_call, rows, now, layers, self.rerun, self.device
        )
        found = [
            find_mixing(probed),
            find_cross_row(probed, self.anchor, self.declared_row_wise),
        ]
        for problem, targets in filter(None, found):
            for c in targets:
                c.problem = c.problem or problem

    # -- each layer's call ------------------------------------------------------------------
    def _hook(self, layer: Layer) -> Callable[..., Any]:
        calls = self.calls[id(layer)]

        def hook(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
            if self._probing is not None:  # a probe's forward: record, do not capture
                return self._record(layer, args, kwargs, output)
            if not torch.is_grad_enabled() or self._recomputing:
                return None
            call = self._capture(layer, args, kwargs)
            broadcast = call.batch_dim == BROADCAST
            single = torch.is_tensor(output)  # the common case: no pytree round trip
            if single and layer.rule is not None and not broadcast:
                call.saved = layer.rule.capture(module, output)
            leaves, spec = ([output], None) if single else tree_flatten(output)
            if broadcast:  # each example's own output gradient, not their sum (see Call)
                bad = [
                    tuple(t.shape)
                    for t in leaves
                    if torch.is_tensor(t)
                    and t.is_floating_point()
                    and (t.dim() == 0 or t.shape[0] != 1)
                ]
                if bad:
                    call.problem = (
                        f"{layer.label} must, when called on inputs shared by the batch (one "
                        f"row), return outputs of one row that broadcast over its "
                        f"{call.batch_size} rows, got output shapes {bad}. Call it on the "
                        f"batch's rows, or on shared inputs with a leading dimension of 1"
                    )
                else:
                    leaves = [expand_rows(t, call.batch_size) for t in leaves]
                call.batch_dim, call.shared = 0, True
            tensors = [k for k, t in enumerate(leaves) if torch.is_tensor(t)]
            call.grads = [None] * len(tensors)
            changed = broadcast
            for j, k in enumerate(tensors):
                t = leaves[k]
                if not t.is_floating_point():
                    continue
                if t.requires_grad:
                    t.register_hook(self._keeper(layer, call, j))
                else:  # our frozen weights made it constant: tap it (see Tap)
                    leaves[k] = Tap.apply(self.anchor, t, self._keeper(layer, call, j))
                    changed = True
            calls.append(call)
            if not changed:
                return None
            if single:
                return leaves[0]
            assert spec is not None  # tree_flatten gave it
            return tree_unflatten(leaves, spec)

        return hook

    def _record(self, layer: Layer, args: tuple, kwargs: dict, output: Any) -> Any:
        """In a probe's forward: record the call's shapes (layout probe) or inputs (row-identity
        probe), and expand an output computed from inputs shared by the batch, as the real
        forward does (so that the layers after it see what they see there)."""
        probe = self._probing
        assert probe is not None  # _record runs in a probe's forward only
        rows = probe.rows
        calls = [] if isinstance(probe, RowProbe) else probe.shapes.setdefault(id(layer), [])
        if layer.rule is None:
            if isinstance(probe, RowProbe):
                probe.record(id(layer), (args, kwargs))
            else:
                calls.append(call_shapes(args, kwargs))
            shared = vmap_batch_dims(layer, args, kwargs, rows)[2]
        else:
            a = layer.rule.batch_input(layer.module, args, kwargs)
            if isinstance(probe, RowProbe):
                probe.record(id(layer), a)
            else:
                calls.append(shape_of(a))
            shared = (
                torch.is_tensor(a)
                and a.dim() >= 1
                and rule_candidates(layer, a, rows) == [BROADCAST]
            )
        if isinstance(probe, RowProbe):  # as the training forward decided for this call
            shared = probe.was_shared(id(layer), shared)
        if isinstance(probe, PerturbProbe):
            return self._probe_taps(layer, output, shared, probe)
        if not shared:
            return None
        leaves, spec = tree_flatten(output)
        return tree_unflatten(
            [
                expand_rows(t, rows) if torch.is_tensor(t) and t.is_floating_point() else t
                for t in leaves
            ],
            spec,
        )

    def _probe_taps(self, layer: Layer, output: Any, shared: bool, probe: PerturbProbe) -> Any:
        """In the perturbation probe's forward: the output (expanded over the rows when the
        call is shared by the batch), with each floating leaf's gradient kept into the probe,
        as the training forward's hook keeps it (a hook, or a :class:`Tap` on a constant)."""
        leaves, spec = tree_flatten(output)
        if shared:
            leaves = [
                expand_rows(t, probe.rows) if torch.is_tensor(t) and t.is_floating_point() else t
                for t in leaves
            ]
        tensors = [k for k, t in enumerate(leaves) if torch.is_tensor(t)]
        for j, k in enumerate(tensors):
            t = leaves[k]
            if not t.is_floating_point():
                continue
            keep = probe.keeper(id(layer), j, len(tensors))
            if t.requires_grad:
                t.register_hook(keep)
            else:
                leaves[k] = Tap.apply(self.anchor, t, keep)
        return tree_unflatten(leaves, spec)

    def _layout_probe(self, rows: int) -> LayoutProbe:
        """This forward's layout probe, run at most once per forward, and only for a forward
        with an ambiguous layer input."""
        if self._layout is None:
            self._layout = run_layout_probe(self._root_call, rows, self.rerun)
        return self._layout

    def _capture(self, layer: Layer, args: tuple, kwargs: dict) -> Call:
        """A call's detached inputs, with the batch found in them (the batch guard).

        The batch size is the private batch's (:meth:`bind_batch`) when bound, else dim 0 of the
        first tensor argument. A rule layer's input gets the batch moved to dim 0 (or, shared by
        every example, expanded to it); a vmap layer gets the in-dims of its arguments. A call
        whose rows cannot be the batch's records a problem, raised if its gradient is used.
        """
        rows = self.rows()
        j = self._ordinals.get(id(layer), 0)  # this call's place among the layer's calls
        self._ordinals[id(layer)] = j + 1
        xs = tuple(a.detach() if torch.is_tensor(a) else a for a in args)
        kw = {k: v.detach() if torch.is_tensor(v) else v for k, v in kwargs.items()}
        if layer.rule is None:
            bound = rows is not None
            if not bound:
                rows = next(
                    (
                        t.shape[0]
                        for t in (*xs, *kw.values())
                        if torch.is_tensor(t) and t.dim() >= 1
                    ),
                    0,
                )
            assert rows is not None  # bound, or counted just above
            arg_dims, kw_dims, broadcast, problem = vmap_batch_dims(layer, xs, kw, rows)
            if problem is None and bound and vmap_ambiguous(xs, kw, rows):
                problem = probed_vmap_problem(
                    self._layout_probe(rows), layer, j, xs, kw, (arg_dims, kw_dims), rows
                )
            return Call(
                xs,
                kw,
                rows,
                versions=tuple(version_of(a) for a in xs),
                batch_dim=BROADCAST if broadcast else 0,
                problem=problem,
                in_dims=(arg_dims, kw_dims),
            )
        a = layer.rule.batch_input(layer.module, xs, kw)
        if torch.is_tensor(a):
            a = at_least_float32(a)
        dim, problem = (0, None) if rows is None else rule_batch_dim(layer, a, rows)
        if dim == AMBIGUOUS:
            assert rows is not None  # only a bound batch's dimension can be ambiguous
            dim, problem = probed_rule_dim(self._layout_probe(rows), layer, j, a, rows)
        if dim == BROADCAST:
            a = a.expand(rows, *a.shape[1:])
        elif dim > 0:
            a = a.movedim(dim, 0)
        xs = (a,) + xs[1:]
        b = a.shape[0] if torch.is_tensor(a) and a.dim() >= 1 else 0
        return Call(
            xs, kw, b, versions=tuple(version_of(t) for t in xs), batch_dim=dim, problem=problem
        )

    def _keeper(self, layer: Layer, call: Call, k: int) -> Callable[[torch.Tensor], None]:
        """The tensor hook of output leaf ``k``: keep its gradient, or (a rule layer whose
        call takes the per-sample route) form the per-sample gradients at once."""

        def keep(grad: torch.Tensor) -> None:
            rule = layer.rule
            if rule is not None:
                grad = at_least_float32(grad)
                if call.batch_dim:  # a layer used time-first: its batch back to dim 0
                    grad = grad.movedim(call.batch_dim, 0)
            if (
                rule is not None
                and len(call.grads) == 1
                and call.batch_size > 0
                and call.problem is None
                and (call.eager is not None or not layer.takes_ghost(call.args[0], grad))
            ):
                check_unchanged(layer, call)
                gs = call.rule_grad_sample(layer, grad)  # sensitive
                call.eager = (
                    gs if call.eager is None else {n: call.eager[n] + t for n, t in gs.items()}
                )
                call.args = (call.args[0][:0],) + call.args[1:]  # keep dtype/shape info only
                call.saved, call.versions = None, ()  # used up: later changes do not matter
                return
            before = call.grads[k]
            call.grads[k] = grad if before is None else before + grad

        return keep
