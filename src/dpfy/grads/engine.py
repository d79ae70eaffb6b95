"""The per-sample gradient engine: one backward pass, then norms, then weighted sums.

Attach it to a model and it

1. *freezes* the trainable parameters (``requires_grad=False``) so autograd no longer computes
   the non-private parameter gradient (that matmul is replaced by our weighted sum, so a private
   step costs about what a non-private one does), and taps constant layer outputs (``_Tap``)
   so that ``loss.backward()`` still reaches them;
2. captures each unit's inputs (forward hook) and output gradients (tensor hook) during the
   user's forward and backward;
3. on request computes per-sample squared norms per parameter, ‖∂ℓ_i/∂θ_k‖² (B,), by ghost norm
   or materialized per-sample gradients (rules) or torch.func (vmap units);
4. then the weighted sums Σ_i w_i ∂ℓ_i/∂θ_k by book-keeping (contracting w⊙g with the stored
   activations; no second backward).

``loss_reduction="mean"`` means the user's loss is (1/B)Σ_i ℓ_i over the physical batch of B
rows, so example i's own gradient is B times the captured one; the factor is applied to the
norms (B²) and the weights (B), never in a pass over the captured tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_unflatten

from dpfy._require import require
from dpfy.errors import PrivacyRefusal
from dpfy.grads.layout import (LayoutProbe, call_shapes, followed, resize_batch,
                               resized_rows, shape_of)
from dpfy.grads.row_identity import (MIN_ROWS, RowProbe, differing_calls, holds_batch,
                                     is_randomness, mixing_problem, output_differs,
                                     probe_index, probe_mode, reseed)
from dpfy.grads.tied import tied_sq_norm, tied_use
from dpfy.grads.units import Unit, build_units
from dpfy.grads.vmap import vmap_grad_sample

__all__ = ["GradEngine", "LOSS_REDUCTIONS"]

LOSS_REDUCTIONS = ("mean", "sum")


def _ghost(unit: Unit, a: torch.Tensor, g: torch.Tensor) -> bool:
    """Whether a rule unit's call on input ``a`` with output gradient ``g`` goes the ghost way."""
    return unit.rule.has_ghost and unit.rule.prefers_ghost(unit.module, a, g)


class _Tap(torch.autograd.Function):
    """Identity on a layer output that does not require grad, so that its gradient is still seen.

    With the parameters frozen, the output of a first layer (its input is data) is a constant.
    Making that output a leaf with ``requires_grad_()`` would work but costs an AccumulateGrad
    copy of its gradient into ``.grad`` and refuses in-place operations after the layer (e.g.
    ``ReLU(inplace=True)``). Instead the output passes through this function, anchored on a
    0-element leaf so that autograd records it; its backward hands the gradient to ``keep`` and
    returns none (nothing is accumulated anywhere). The output aliases the input's storage but
    is not a view, so in-place operations after the layer are allowed.
    """

    @staticmethod
    def forward(ctx: Any, anchor: torch.Tensor, t: torch.Tensor,
                keep: Callable[[torch.Tensor], None]) -> torch.Tensor:
        ctx.keep = keep
        return t.detach()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, None, None]:
        ctx.keep(grad)  # sensitive
        return None, None, None


Rows = tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]  # (B, P) view, unflatten


def _per_sample_rows(t: torch.Tensor) -> Rows:
    """Per-sample gradients (B, *θ) as a (B, P) matrix, without a copy when possible.

    Rules may return per-sample gradients as a permuted view (the layout their batched matmul
    produced). Rows are taken in storage order, so a permuted contiguous tensor is viewed, not
    copied; the returned function maps a (P,) row back to θ's shape.
    """
    if t.dim() == 1:  # a 0-dim parameter (nn.Parameter(torch.tensor(1.0))): one column
        return t.view(-1, 1), lambda row: row.view(())
    order = sorted(range(1, t.dim()), key=lambda d: -t.stride(d))
    p = t.permute(0, *order)
    if not p.is_contiguous():
        p, order = t.contiguous(), list(range(1, t.dim()))
    inverse = [order.index(d) for d in range(1, t.dim())]
    shape = p.shape[1:]
    return p.view(p.shape[0], -1), lambda row: row.view(shape).permute(*inverse)


def _row_sums(rows: dict[str, Rows], w: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Σ_i w_i row_i for materialized per-sample rows, back in each parameter's shape."""
    return {rel: unflatten(w[rel].to(r.dtype) @ r).contiguous()
            for rel, (r, unflatten) in rows.items()}


# How far apart the ratios w1_i/w2_i may be and still count as one constant (float32 rounding
# of C/‖g_i‖ against C·(1/‖g_i‖)); the smallest ratio is used, so no example gains weight.
_RATIO_RTOL = 1e-5


@dataclass(frozen=True)
class _Split:
    """Two weight sets w1, w2 (B,) with w1_i = c·w2_i wherever w2_i ≠ 0 (OSO: the clipped
    gradient's min(1, C/‖g_i‖) and the threshold gradient's 1[‖g_i‖ > C]/‖g_i‖, c = C).

    Then Σ_i w1_i g_i = Σ_{w2_i = 0} w1_i g_i + c·Σ_i w2_i g_i: both sums from one pass over the
    batch's rows (each row in one of two gathered parts) instead of two. ``c`` is the smallest
    ratio, so every example's effective weight c·w2_i is ≤ its declared w1_i (never more than
    the sensitivity the step checked), and ≥ (1 − 1e-5)·w1_i.
    """

    zero: torch.Tensor      # indices of rows with w2 = 0
    nonzero: torch.Tensor   # indices of rows with w2 ≠ 0
    ratio: float            # c
    w1: torch.Tensor
    w2: torch.Tensor

    def sums(self, u: Unit, a: torch.Tensor, g: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        def part(rows: torch.Tensor, w: torch.Tensor) -> dict[str, torch.Tensor]:
            if rows.numel() == 0:
                return {rel: torch.zeros_like(p) for rel, p in u.all_params.items()}
            wr = w.index_select(0, rows)
            return u.rule.weighted_sum(u.module, a.index_select(0, rows),
                                       g.index_select(0, rows), {rel: wr for rel in u.all_params})
        second = part(self.nonzero, self.w2)
        rest = part(self.zero, self.w1)
        return [{rel: rest[rel] + self.ratio * t for rel, t in second.items()}, second]


def _unit_split(per_set: list[dict[str, torch.Tensor]],
                cache: dict[tuple[int, int], "_Split | None"]) -> "_Split | None":
    """The :class:`_Split` of a unit's two weight sets, or None (each set must give all the
    unit's parameters one (B,) tensor, and the ratios must be one constant)."""
    ids = [{id(t) for t in ws.values()} for ws in per_set]
    if any(len(i) != 1 for i in ids):
        return None
    key = (ids[0].pop(), ids[1].pop())
    if key not in cache:
        w1, w2 = (next(iter(ws.values())) for ws in per_set)
        cache[key] = _split(w1, w2)
    return cache[key]


def _split(w1: torch.Tensor, w2: torch.Tensor) -> "_Split | None":
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
    return _Split(zero=zero, nonzero=nonzero, ratio=lo, w1=w1, w2=w2)


def _with_frozen(w: dict[str, torch.Tensor], unit: Unit) -> dict[str, torch.Tensor]:
    """A rule unit's weights extended to the layer's frozen parameters (a frozen bias, or the
    weight under BitFit): rules form every parameter of their layer, so each gets a weight; the
    frozen ones' sums are computed and dropped (they are never released)."""
    if unit.rule is None or not w:
        return w
    frozen = set(unit.rule.params(unit.module)) - set(w)
    if not frozen:
        return w
    some = next(iter(w.values()))
    return {**w, **{rel: some for rel in frozen}}


def _rule_grad_sample(unit: Unit, call: "_Call", g: torch.Tensor) -> dict[str, torch.Tensor]:
    """The rule's per-sample gradients for one call, with what its ``capture`` kept."""
    if call.saved is None:
        return unit.rule.grad_sample(unit.module, call.args[0], g)
    return unit.rule.grad_sample(unit.module, call.args[0], g, saved=call.saved)


def _at_least_float32(t: torch.Tensor) -> torch.Tensor:
    """``t`` in float32 if it is a half-precision float (autocast), else unchanged.

    Per-sample norms decide the clipping, and a norm under-estimated in bfloat16 (3 significant
    digits) would let an example contribute more than C: rule units work in float32 at least.
    """
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def _version(t: Any) -> int | None:
    """A tensor's in-place version counter (None: not a tensor, or one that has none)."""
    if not torch.is_tensor(t):
        return None
    try:
        return t._version
    except RuntimeError:  # e.g. inference tensors
        return None


def _check_unchanged(unit: Unit, call: "_Call") -> None:
    """Refuse inputs that were modified in place after the layer ran.

    With its weights frozen, autograd no longer saves a layer's input, so nothing else would
    notice: the per-sample gradients would be computed from the modified values.
    """
    for a, v in zip(call.args, call.versions):
        if v is not None and _version(a) != v:
            raise ValueError(
                f"the input of layer {unit.name or '(root)'!r} ({type(unit.module).__name__}) must "
                f"not change after the layer ran, got it modified in place before backward() "
                f"(version {v} -> {_version(a)}). Use an out-of-place operation there, e.g. "
                f"x = x + f(x) instead of x += f(x)")


BROADCAST = -1  # a call whose inputs are shared by every example (leading dimension 1)


def _label(unit: Unit) -> str:
    return f"layer {unit.name or '(root)'!r} ({type(unit.module).__name__})"


AMBIGUOUS = -2  # several dimensions could hold the batch: the layout probe decides


def _rule_candidates(unit: Unit, a: torch.Tensor, b: int) -> list[int]:
    """The dimensions of a rule unit's input that could hold a batch of ``b`` rows.

    Dim 0 if it has ``b`` rows (the convention); every other dimension of ``b`` rows the rule
    allows (a layer used time-first); :data:`BROADCAST` for an input of one row, which could be
    shared by every example (``position_ids`` of shape (1, T)).
    """
    cands = [0] if a.shape[0] == b else []
    cands += [k for k in unit.rule.batch_dims(unit.module, a) if k > 0 and a.shape[k] == b]
    if a.shape[0] == 1 and b != 1:
        cands.append(BROADCAST)
    return cands


def _rule_batch_dim(unit: Unit, a: Any, b: int) -> tuple[int, str | None]:
    """Where the batch of ``b`` rows sits in a rule unit's input ``a``: (dim, problem).

    One candidate (:func:`_rule_candidates`) is the answer. Several are :data:`AMBIGUOUS`
    (a (64, 64, d) input on a batch of 64, a (1, 64) input that is either one time step or
    shared position ids): the engine's layout probe decides (``grads/layout.py``); neither the
    shape nor the strides can. With one example every candidate gives the same gradient. None
    is a problem.
    """
    if not torch.is_tensor(a) or a.dim() == 0:
        return 0, (f"{_label(unit)} must receive a tensor whose dimension 0 is the batch, got "
                   f"{type(a).__name__}{'' if not torch.is_tensor(a) else ' of shape ()'}; the "
                   f"private batch has {b} rows")
    cands = _rule_candidates(unit, a, b)
    if len(cands) == 1 or (cands and b == 1):
        return cands[0], None
    if cands:
        return AMBIGUOUS, None
    return 0, (f"{_label(unit)} must be called on the {b} rows of the private batch, got an "
               f"input of shape {tuple(a.shape)}: no dimension of that size where this layer "
               f"allows a batch. Compute the loss only from the batch the private loader "
               f"yielded, with the batch first in every layer")


def _vmap_ambiguous(args: tuple, kwargs: dict, b: int) -> bool:
    """Whether a vmap unit's tensor arguments have, besides dimension 0, a dimension of the
    batch's size (then dimension 0 may not be the batch: the layout probe checks)."""
    return b > 1 and any(torch.is_tensor(x) and any(n == b for n in x.shape[1:])
                         for x in (*args, *kwargs.values()))


def _vmap_batch_dims(unit: Unit, args: tuple, kwargs: dict, b: int
                     ) -> tuple[tuple, dict, bool, str | None]:
    """vmap in-dims per argument and keyword argument: 0 (batched), None (shared).

    Returns (arg dims, kwarg dims, broadcast, problem). A tensor is batched if its dimension 0
    has ``b`` rows, shared if it has one row (or none: a scalar); a non-tensor argument holding
    tensors (a ``PackedSequence``, a tuple of states) cannot be split by example: refused. With no
    batched argument but a shared one, the call is a broadcast (its outputs are expanded).
    """
    def dim(name: str, x: Any) -> tuple[int | None, str | None]:
        if torch.is_tensor(x):
            if x.dim() >= 1 and x.shape[0] == b:
                return 0, None
            if x.dim() == 0 or x.shape[0] == 1:
                return None, None
            return None, f"{name} has shape {tuple(x.shape)}"
        if any(torch.is_tensor(t) for t in tree_flatten(x)[0]):
            return None, f"{name} is a {type(x).__name__}, not a tensor"
        return None, None

    problems: list[str] = []
    arg_dims, kw_dims = [], {}
    for i, x in enumerate(args):
        d, p = dim(f"argument {i}", x)
        arg_dims.append(d)
        problems += [p] if p else []
    for k, x in kwargs.items():
        d, p = dim(f"keyword argument {k!r}", x)
        kw_dims[k] = d
        problems += [p] if p else []
    batched = any(d == 0 for d in arg_dims) or any(d == 0 for d in kw_dims.values())
    shared = any(torch.is_tensor(x) and x.dim() >= 1 for x in (*args, *kwargs.values()))
    if not problems and not batched and not (shared and b != 1):
        problems.append("no tensor argument has the batch in dimension 0")
    problem = None if not problems else (
        f"{_label(unit)} must be called with the {b} rows of the private batch in dimension 0 "
        f"of its tensor arguments, got: {'; '.join(problems)}. The engine cannot tell which "
        f"example each row belongs to: pass padded tensors (not a PackedSequence) with the batch "
        f"first, and compute the loss only from the batch the private loader yielded")
    return tuple(arg_dims), kw_dims, not batched and problem is None, problem


def _expand_rows(t: Any, b: int) -> Any:
    """A tensor with one leading row as a (b, ...) view; anything else unchanged."""
    if torch.is_tensor(t) and t.dim() >= 1 and t.shape[0] == 1 and b != 1:
        return t.expand(b, *t.shape[1:])
    return t


def _row_dims(unit: Unit, call: "_Call") -> Any:
    """The batch dimension(s) of a captured call's inputs as the engine split them, for the
    row-identity probe: a vmap unit's in-dims, or a rule unit's batch dimension (None: an
    input shared by the batch)."""
    if unit.rule is None:
        return call.in_dims
    return None if call.shared else call.batch_dim


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
    saved: Any = None                           # the rule's ``capture`` of the output, sensitive
    versions: tuple[int | None, ...] = ()       # version counters of the tensor args at capture
    batch_dim: int = 0                          # where the output gradient holds the batch
    problem: str | None = None                  # why this call's rows are not the batch's
    in_dims: tuple[Any, Any] = ((), {})         # vmap units: batch dim per arg / kwarg
    shared: bool = False                        # inputs shared by every example (broadcast)

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
        self._tied: dict[str, list[tuple[Unit, str]]] = {}  # tied parameter -> its uses
        for u in self.units:
            for rel in u.tied:
                self._tied.setdefault(u.tied[rel], []).append((u, rel))
        for u in self.units:
            for rel in u.params:
                if u.qualified(rel) in self._tied:
                    self._tied[u.qualified(rel)].insert(0, (u, rel))
        self._cache: dict[int, tuple[str, Any]] = {}
        self._b = 0  # batch size of the captures the norms were computed on
        self._rows: Callable[[], int | None] = lambda: None  # the private batch's size (bound)
        self._recomputing = False  # inside our own vmap forward: hooks must not capture it
        self._root_call: tuple[tuple, dict] | None = None  # the model's call, inside its forward
        self._ordinals: dict[int, int] = {}  # unit -> calls so far in this forward
        self._probe: LayoutProbe | None = None  # this forward's layout probe, once run
        self._probing: LayoutProbe | RowProbe | None = None  # the probe being recorded
        self._rows_checked = False  # the row-identity probe ran (grads/row_identity.py)
        self._last_route: dict[int, str] = {}  # unit -> route taken on the last batch (public)
        self._anchor = torch.empty(0, requires_grad=True)  # see _Tap; never receives a gradient
        self._handles = [u.module.register_forward_hook(self._hook(u), with_kwargs=True)
                         for u in self.units]
        self._handles += [model.register_forward_pre_hook(self._enter, with_kwargs=True),
                          model.register_forward_hook(self._exit, always_call=True)]
        for _, p in self.named_params:
            p.requires_grad_(False)

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
        self._rows = rows if callable(rows) else (lambda: rows)

    # -- capture ---------------------------------------------------------------------------
    def _enter(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        """The model's forward starts: keep its call (for the layout probe), count afresh."""
        if self._probing is None and not self._recomputing and torch.is_grad_enabled():
            self._root_call, self._ordinals, self._probe = (args, kwargs), {}, None

    def _exit(self, module: nn.Module, args: tuple, output: Any) -> None:
        if self._probing is None and not self._recomputing:
            if not self._rows_checked and self._root_call is not None and output is not None:
                self._row_identity_probe()
            self._root_call, self._probe = None, None

    def _hook(self, unit: Unit):
        calls = self._calls[id(unit)]

        def hook(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
            if self._probing is not None:  # a probe's forward: record, do not capture
                return self._probe_call(unit, args, kwargs, output)
            if not torch.is_grad_enabled() or self._recomputing:
                return None
            call = self._capture(unit, args, kwargs)
            broadcast = call.batch_dim == BROADCAST
            single = torch.is_tensor(output)  # the common case: no pytree round trip
            if single and unit.rule is not None and not broadcast:
                call.saved = unit.rule.capture(module, output)
            leaves, spec = ([output], None) if single else tree_flatten(output)
            if broadcast:  # each example's own output gradient, not their sum (see _Call)
                bad = [tuple(t.shape) for t in leaves if torch.is_tensor(t)
                       and t.is_floating_point() and (t.dim() == 0 or t.shape[0] != 1)]
                if bad:
                    call.problem = (
                        f"{_label(unit)} must, when called on inputs shared by the batch (one "
                        f"row), return outputs of one row that broadcast over its "
                        f"{call.batch_size} rows, got output shapes {bad}. Call it on the "
                        f"batch's rows, or on shared inputs with a leading dimension of 1")
                else:
                    leaves = [_expand_rows(t, call.batch_size) for t in leaves]
                call.batch_dim, call.shared = 0, True
            tensors = [k for k, t in enumerate(leaves) if torch.is_tensor(t)]
            call.grads = [None] * len(tensors)
            changed = broadcast
            for j, k in enumerate(tensors):
                t = leaves[k]
                if not t.is_floating_point():
                    continue
                if t.requires_grad:
                    t.register_hook(self._keeper(unit, call, j))
                else:  # our frozen weights made it constant: tap it (see _Tap)
                    leaves[k] = _Tap.apply(self._anchor, t, self._keeper(unit, call, j))
                    changed = True
            calls.append(call)
            if not changed:
                return None
            return leaves[0] if single else tree_unflatten(leaves, spec)
        return hook

    def _probe_call(self, unit: Unit, args: tuple, kwargs: dict, output: Any) -> Any:
        """In a probe's forward: record the call's shapes (layout probe) or inputs (row-identity
        probe), and expand an output computed from inputs shared by the batch, as the real
        forward does (so that the layers after it see what they see there)."""
        probe, rows = self._probing, self._probing.rows
        values = isinstance(probe, RowProbe)
        calls = [] if values else probe.shapes.setdefault(id(unit), [])
        if unit.rule is None:
            if values:
                probe.record(id(unit), (args, kwargs))
            else:
                calls.append(call_shapes(args, kwargs))
            shared = _vmap_batch_dims(unit, args, kwargs, rows)[2]
        else:
            a = unit.rule.batch_input(unit.module, args, kwargs)
            if values:
                probe.record(id(unit), a)
            else:
                calls.append(shape_of(a))
            shared = (torch.is_tensor(a) and a.dim() >= 1
                      and _rule_candidates(unit, a, rows) == [BROADCAST])
        if values:  # as the training forward decided for this call, when it made it
            shared = probe.was_shared(id(unit), shared)
        if not shared:
            return None
        leaves, spec = tree_flatten(output)
        return tree_unflatten([_expand_rows(t, rows) if torch.is_tensor(t)
                               and t.is_floating_point() else t for t in leaves], spec)

    def _capture(self, unit: Unit, args: tuple, kwargs: dict) -> _Call:
        """A call's detached inputs, with the batch found in them (the batch guard).

        The batch size is the private batch's (:meth:`bind_batch`) when bound, else dim 0 of the
        first tensor argument. A rule unit's input gets the batch moved to dim 0 (or, shared by
        every example, expanded to it); a vmap unit gets the in-dims of its arguments. A call
        whose rows cannot be the batch's records a problem, raised if its gradient is used.
        """
        rows = self._rows()
        j = self._ordinals.get(id(unit), 0)  # this call's place among the unit's calls
        self._ordinals[id(unit)] = j + 1
        xs = tuple(a.detach() if torch.is_tensor(a) else a for a in args)
        kw = {k: v.detach() if torch.is_tensor(v) else v for k, v in kwargs.items()}
        if unit.rule is None:
            if rows is None:
                rows = next((t.shape[0] for t in (*xs, *kw.values())
                             if torch.is_tensor(t) and t.dim() >= 1), 0)
            arg_dims, kw_dims, broadcast, problem = _vmap_batch_dims(unit, xs, kw, rows)
            if problem is None and _vmap_ambiguous(xs, kw, rows) and self._rows() is not None:
                problem = self._probed_vmap(unit, j, xs, kw, (arg_dims, kw_dims), rows)
            return _Call(xs, kw, rows, versions=tuple(_version(a) for a in xs),
                         batch_dim=BROADCAST if broadcast else 0, problem=problem,
                         in_dims=(arg_dims, kw_dims))
        a = unit.rule.batch_input(unit.module, xs, kw)
        if torch.is_tensor(a):
            a = _at_least_float32(a)
        dim, problem = (0, None) if rows is None else _rule_batch_dim(unit, a, rows)
        if dim == AMBIGUOUS:
            dim, problem = self._probed_rule_dim(unit, j, a, rows)
        if dim == BROADCAST:
            a = a.expand(rows, *a.shape[1:])
        elif dim > 0:
            a = a.movedim(dim, 0)
        xs = (a,) + xs[1:]
        b = a.shape[0] if torch.is_tensor(a) and a.dim() >= 1 else 0
        return _Call(xs, kw, b, versions=tuple(_version(t) for t in xs), batch_dim=dim,
                     problem=problem)

    # -- the layout probe (grads/layout.py) ------------------------------------------------
    def _layout_probe(self) -> LayoutProbe:
        """This forward's probe: the model run once more, without gradients, on the batch
        resized by a row, every captured layer's input shapes recorded. Run at most once per
        forward, and only for a forward with an ambiguous layer input."""
        if self._probe is None:
            self._probe = self._run_probe()
        return self._probe

    def _run_probe(self) -> LayoutProbe:
        rows = self._rows()
        new = resized_rows(rows)
        if self._root_call is None:
            return LayoutProbe(new, problem=(
                "it was called outside a forward of the model the engine was given, so the "
                "engine cannot rerun the model on a resized batch to find out"))
        args, kwargs, problem = resize_batch(*self._root_call, rows)
        if problem is not None:
            return LayoutProbe(new, problem=problem)
        probe = self._probing = LayoutProbe(new)
        try:
            with torch.no_grad():
                self.model(*args, **kwargs)
        except Exception as err:  # noqa: BLE001 - reported as the reason for a refusal
            return LayoutProbe(new, problem=(
                f"rerunning the model on {new} of the batch's rows to find out failed "
                f"({type(err).__name__}: {str(err)[:200]})"))
        finally:
            self._probing = None
        return probe

    def _probed_record(self, unit: Unit, j: int) -> tuple[Any, int, str | None]:
        """What the probe recorded for the unit's j-th call of this forward, the probe's batch
        size, and why nothing (None when there is a record)."""
        probe = self._layout_probe()
        if probe.problem is not None:
            return None, probe.rows, probe.problem
        calls = probe.shapes.get(id(unit), [])
        if j >= len(calls):
            return None, probe.rows, (f"the resized forward ({probe.rows} rows) called it "
                                      f"{len(calls)} time(s), not {j + 1}")
        return calls[j], probe.rows, None

    def _probed_rule_dim(self, unit: Unit, j: int, a: torch.Tensor, rows: int
                         ) -> tuple[int, str | None]:
        """The batch dimension of an ambiguous rule-unit input, from the probe: the one that
        followed the batch, or :data:`BROADCAST` for a one-row input that did not change."""
        probed, new, why = self._probed_record(unit, j)
        if why is None:
            got = followed(tuple(a.shape), probed, rows, new)
            if got == [] and a.shape[0] == 1:
                return BROADCAST, None
            if got and got[0] in _rule_candidates(unit, a, rows):
                return got[0], None
            why = (f"on {new} of the batch's rows it received shape {probed}, so no single "
                   f"dimension of it follows the batch")
        return 0, (f"{_label(unit)} must be called with the {rows} rows of the private batch in "
                   f"one dimension, got an input of shape {tuple(a.shape)} where several "
                   f"dimensions could be the batch, and {why}. Call the layer with the batch in "
                   f"dimension 0 (transpose after the layer, not before it), or use a batch "
                   f"size that no other dimension has")

    def _probed_vmap(self, unit: Unit, j: int, args: tuple, kwargs: dict,
                     dims: tuple[tuple, dict], rows: int) -> str | None:
        """Check a vmap unit's in-dims (batch in dim 0, or shared) against the probe."""
        probed, new, why = self._probed_record(unit, j)
        if why is None:
            for (name, x, d), got in zip(
                    [*((f"argument {i}", x, dims[0][i]) for i, x in enumerate(args)),
                     *((f"keyword argument {k!r}", x, dims[1][k]) for k, x in kwargs.items())],
                    [*probed[0], *(probed[1].get(k) for k in kwargs)]):
                if not torch.is_tensor(x):
                    continue
                want = [0] if d == 0 else []
                if followed(tuple(x.shape), got, rows, new) != want:
                    why = (f"its {name} of shape {tuple(x.shape)} became {got} on {new} of the "
                           f"batch's rows, so its batch is not "
                           f"{'in dimension 0' if d == 0 else 'absent (shared)'}")
                    break
            else:
                return None
        return (f"{_label(unit)} must be called with the {rows} rows of the private batch in "
                f"dimension 0 of its tensor arguments (or shared by every example), and "
                f"{why}. Call it with the batch in dimension 0, or use a batch size that no "
                f"other dimension has")

    # -- the row-identity probe (grads/row_identity.py) ------------------------------------
    def _row_identity_probe(self) -> None:
        """Once per engine, at the end of the first forward on a bound batch of ≥ 3 rows: rerun
        the model on the batch and on the batch without one row, reordered, and give every call
        of this forward whose rows are not its examples' own a problem (raised when its
        gradient is used, listed by the pre-flight)."""
        rows = self._rows()
        if (rows is None or rows < MIN_ROWS or not torch.is_grad_enabled()
                or not holds_batch(*self._root_call, rows)):
            return
        self._rows_checked = True
        index = probe_index(rows)
        now = {id(u): calls[len(calls) - self._ordinals.get(id(u), 0):]  # this forward's calls
               for u in self.units for calls in [self._calls[id(u)]]}
        args, kwargs, problem = resize_batch(*self._root_call, rows, index=index)
        if problem is not None:
            return  # a transposed view: the layout probe refuses it where it matters
        shared = {uid: [c.shared for c in calls] for uid, calls in now.items()}
        try:
            (full, out_full), (part, out_part) = (
                self._row_forward(*call, shared) for call in
                [(self._root_call[0], self._root_call[1], rows), (args, kwargs, rows - 1)])
        except Exception:  # noqa: BLE001 - a batch the model cannot run on: not checked
            return  # (EmbeddingBag's 1-D ids with offsets cannot be cut by rows)
        units = {id(u): u for u in self.units}

        def dims(uid: int, j: int) -> Any:  # None: a call not to check
            real = now[uid][j] if j < len(now[uid]) else None
            return None if real is None or real.problem is not None else (
                _row_dims(units[uid], real),)

        differing = differing_calls(full, part, index, dims)
        out_differs = output_differs(out_full, out_part, rows, index)
        if not differing and not out_differs:
            return
        again = self._row_forward(*self._root_call, rows, shared, seed=1)
        if is_randomness(full, out_full, again, differing, rows, dims):
            return
        problem = (mixing_problem(_label(units[differing[0][0]]), rows, differing[0][2])
                   if differing else mixing_problem(None, rows, "its rows; the last layer "
                                                    f"called is {_label(units[full.order[-1][0]])}"
                                                    if full.order else "its rows"))
        targets = ([c for calls in now.values() for c in calls] if out_differs
                   else [now[uid][j] for uid, j, _ in differing])
        for c in targets:
            c.problem = c.problem or problem

    def _row_forward(self, args: tuple, kwargs: dict, rows: int, shared: dict[int, list[bool]],
                     seed: int = 0) -> tuple[RowProbe, Any]:
        """One forward of the row-identity probe: its record and the model's output.
        ``shared``: which calls of each unit the training forward found shared by the batch
        (their outputs are expanded over the probe's rows, as there)."""
        device = next((p.device for _, p in self.named_params), None)
        with probe_mode(self.model, device):
            reseed(seed)
            probe = self._probing = RowProbe(rows, shared=shared)
            try:
                return probe, self.model(*args, **kwargs)
            finally:
                self._probing = None

    def _keeper(self, unit: Unit, call: _Call, k: int):
        def keep(grad: torch.Tensor) -> None:
            rule = unit.rule
            if rule is not None:
                grad = _at_least_float32(grad)
                if call.batch_dim:  # a layer used time-first: its batch back to dim 0
                    grad = grad.movedim(call.batch_dim, 0)
            if (rule is not None and len(call.grads) == 1 and call.batch_size > 0
                    and call.problem is None
                    and (call.eager is not None or not _ghost(unit, call.args[0], grad))):
                _check_unchanged(unit, call)
                gs = _rule_grad_sample(unit, call, grad)  # sensitive
                call.eager = gs if call.eager is None else {
                    n: call.eager[n] + t for n, t in gs.items()}
                call.args = (call.args[0][:0],) + call.args[1:]  # keep dtype/shape info only
                call.saved, call.versions = None, ()  # used up: later changes do not matter
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
    def _scale(self, b: int) -> float:
        """Factor from a captured gradient row to example i's own gradient (B for a mean loss).

        Captured gradients are never rescaled in place (a full pass over them): norms are
        multiplied by its square and the weights by it instead.
        """
        return float(b) if self.loss_reduction == "mean" else 1.0

    def batch_size(self) -> int:
        """B of the captured physical batch: every used capture must hold the batch's rows.

        Raises:
          PrivacyRefusal: a layer whose gradient is used was called on rows that are not the
            private batch's (see :meth:`bind_batch`), naming every such layer and the fix.
        """
        used = [(u, c) for u in self.units for c in self._calls[id(u)] if c.used]
        problems = list(dict.fromkeys(c.problem for _, c in used if c.problem is not None))
        if problems:
            raise PrivacyRefusal("; ".join(problems))
        rows = self._rows()
        sizes = {c.batch_size for _, c in used}
        if rows is not None and sizes - {rows}:
            wrong = sorted({_label(u) for u, c in used if c.batch_size != rows})
            raise PrivacyRefusal(
                f"every layer's gradient must come from the {rows} rows of the private batch, "
                f"got {', '.join(wrong)} called on {sorted(sizes - {rows})} rows. Compute the "
                f"loss only from the batch the private loader yielded, and step once per batch")
        require(len(sizes) <= 1, "the batch dimension", sorted(sizes),
                "the same (dim 0) for every layer",
                "Put the batch first (e.g. batch_first=True) and do not reshape it away")
        if rows == 0 and not sizes:
            # An empty Poisson batch: a model that cannot run on 0 rows (Hugging Face) may skip
            # its forward/backward; the step then releases noise only, as it must.
            return 0
        require(len(sizes) == 1, "loss.backward()", "not called",
                "called before optimizer.step()",
                "No per-sample gradient was captured: run forward and loss.backward() on a "
                "batch from the private loader first")
        return sizes.pop()

    def per_sample_sq_norms(self) -> dict[str, torch.Tensor]:
        """{parameter name: ‖∂ℓ_i/∂θ‖² (B,)} for every trainable parameter. Sensitive."""
        b = self._b = self.batch_size()
        out: dict[str, torch.Tensor] = {}
        for u in self.units:
            calls = [c for c in self._calls[id(u)] if c.used]
            norms = self._unit_sq_norms(u, calls, b)
            missing = set(u.params) - set(norms)
            require(not missing, f"layer rule of {type(u.module).__name__}", sorted(missing),
                    "covering every trainable parameter of the layer",
                    "Freeze those parameters or use engine='vmap'")
            for rel, sq in norms.items():
                if rel in u.params:  # its own trainable ones: not a frozen bias, not a tied use
                    out[u.qualified(rel)] = sq
            kind = self._cache[id(u)][0]
            if kind != "zero":
                self._last_route[id(u)] = ("vmap" if u.rule is None else
                                           "ghost" if kind == "ghost" else "per-sample")
        s2 = self._scale(b) ** 2
        for name, uses in self._tied.items():
            sq = self._tied_ghost_sq_norm(uses)  # sensitive (B,), or None: not for these uses
            if sq is None:
                sq = self._tied_grad_sample(uses, b).flatten(1).square().sum(1)  # sensitive
            out[name] = sq.mul_(s2)
        return out

    def _tied_ghost_sq_norm(self, uses: list[tuple[Unit, str]]) -> torch.Tensor | None:
        """A tied weight's per-example squared norm from its uses' factors (``grads/tied.py``),
        when every use that got a gradient is one Linear or Embedding call on its captures."""
        factors = []
        for u, rel in uses:
            calls = [c for c in self._calls[id(u)] if c.used]
            if not calls:
                continue  # this use contributes nothing
            c = calls[0]
            if (len(calls) != 1 or rel != "weight" or u.rule is None or c.eager is not None
                    or len(c.grads) != 1 or c.grads[0] is None):
                return None
            use = tied_use(u.rule, u.module, c.args[0], _at_least_float32(c.grads[0]))
            if use is None:
                return None
            factors.append(use)
        return tied_sq_norm(factors) if factors else None

    def _tied_grad_sample(self, uses: list[tuple[Unit, str]], b: int) -> torch.Tensor:
        """Per-example gradients of a tied parameter: the sum of its uses' contributions.

        Exact (not a bound): ‖Σ_u G_u,i‖ includes the cross terms between the uses, which a sum
        of per-use ghost norms would miss. Costs B × the parameter's size in memory.
        """
        total = None
        for u, rel in uses:
            calls = [c for c in self._calls[id(u)] if c.used]
            if calls and b:
                t = self._grad_sample(u, calls)[rel]
                total = t if total is None else total + t
        p = uses[0][0].all_params[uses[0][1]]
        return total if total is not None else p.new_zeros((b,) + tuple(p.shape))

    def _unit_sq_norms(self, u: Unit, calls: list[_Call], b: int) -> dict[str, torch.Tensor]:
        if not calls or b == 0:  # an empty batch, or a unit the loss did not depend on
            self._cache[id(u)] = ("zero", None)
            return {rel: p.new_zeros(b) for rel, p in u.params.items()}
        for c in calls:
            _check_unchanged(u, c)
        if u.rule is not None and len(calls) == 1 and calls[0].eager is None:
            c = calls[0]
            a, g = c.args[0], c.grads[0]
            if _ghost(u, a, g):
                self._cache[id(u)] = ("ghost", c)
                sq = u.rule.sq_norm(u.module, a, g)
                s2 = self._scale(b) ** 2
                return {rel: t * s2 for rel, t in sq.items()} if s2 != 1 else sq
        gs = self._grad_sample(u, calls)  # sensitive: rel -> (B, *θ.shape), captured scale
        rows = {rel: _per_sample_rows(t) for rel, t in gs.items()}  # sensitive: (B, P) views
        self._cache[id(u)] = ("materialized", rows)
        s2 = self._scale(b) ** 2
        return {rel: torch.linalg.vector_norm(r, dim=1).square().mul_(s2)
                for rel, (r, _) in rows.items()}  # (B,) each, no (B, P) temporary

    def _grad_sample(self, u: Unit, calls: list[_Call]) -> dict[str, torch.Tensor]:
        """Per-sample gradients, at the captured scale (see ``_scale``), summed over calls."""
        total: dict[str, torch.Tensor] = {}
        for c in calls:
            if c.eager is not None:
                gs = c.eager
            elif u.rule is not None:
                gs = _rule_grad_sample(u, c, c.grads[0])
            else:
                self._recomputing = True
                try:
                    gs = vmap_grad_sample(u.module, u.name, u.all_params, c.args, c.kwargs,
                                          c.grads, in_dims=c.in_dims)
                finally:
                    self._recomputing = False
            for rel, t in gs.items():
                total[rel] = t if rel not in total else total[rel] + t
        return total

    def per_sample_grads(self) -> dict[str, torch.Tensor]:
        """{parameter name: ∂ℓ_i/∂θ (B, *θ.shape)}, materialized for every unit. Sensitive.

        For methods that transform per-sample gradients coordinate-wise (AdaClip): every unit
        takes the materialized route (memory B × parameters), whatever the ghost route would
        cost. The captures are dropped afterwards; sum with the returned tensors.
        """
        b = self._b = self.batch_size()
        s = self._scale(b)
        out: dict[str, torch.Tensor] = {}
        for u in self.units:
            calls = [c for c in self._calls[id(u)] if c.used]
            if not calls or b == 0:
                gs = {rel: p.new_zeros((b,) + tuple(p.shape))
                      for rel, p in u.all_params.items()}
            else:
                for c in calls:
                    _check_unchanged(u, c)
                gs = {rel: t * s if s != 1.0 else t
                      for rel, t in self._grad_sample(u, calls).items()}  # (B, *θ) sensitive
            for rel, t in gs.items():
                q = u.qualified(rel)  # a tied parameter: the sum over its uses
                out[q] = t if q not in out else out[q] + t
        self.clear()
        return {n: out[n] for n, _ in self.named_params}

    # -- phase 2: weighted sums ------------------------------------------------------------
    def weighted_sums(self, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """{parameter name: Σ_i w_i ∂ℓ_i/∂θ} for weights {name: (B,)} (sensitive inputs)."""
        return self.weighted_sums_many([weights])[0]

    def weighted_sums_many(self, weight_sets: list[dict[str, torch.Tensor]]
                           ) -> list[dict[str, torch.Tensor]]:
        """One weighted sum per weight set, from the same captures (sensitive inputs).

        Several sums serve a method that releases a second parameter-shaped sum (OSO's
        threshold gradient Σ_i 1[‖g_i‖ > C] g_i/‖g_i‖). Call after :meth:`per_sample_sq_norms`
        on the same captures. Each unit's captures are dropped as soon as its sums are formed,
        last layer first (the order backward freed them in), so that the largest sums are not
        allocated while every activation is still held.
        """
        outs: list[dict[str, torch.Tensor]] = [{} for _ in weight_sets]
        s = self._scale(self._b)
        unique = {id(t): t for ws in weight_sets for t in ws.values()}  # shared: scaled once
        scaled = {k: t * s for k, t in unique.items()} if s != 1.0 else unique
        splits: dict[tuple[int, int], _Split | None] = {}
        for u in reversed(self.units):
            kind, data = self._cache.pop(id(u))
            self._calls[id(u)].clear()
            per_set = [_with_frozen({rel: scaled[id(ws[u.qualified(rel)])]
                                     for rel in u.all_params}, u) for ws in weight_sets]
            split = (_unit_split(per_set, splits) if kind == "ghost" and len(per_set) == 2
                     else None)
            if split is not None:   # two sums for the rows of one (OSO's pair)
                all_sums = split.sums(u, data.args[0], data.grads[0])
            else:
                all_sums = [self._unit_weighted_sum(u, kind, data, w) for w in per_set]
            for sums, out in zip(all_sums, outs):
                for rel, t in sums.items():
                    if rel not in u.all_params:
                        continue  # a frozen parameter of the layer (see _with_frozen)
                    q = u.qualified(rel)  # a tied parameter: Σ_i w_i Σ_uses G_use,i
                    out[q] = t if q not in out else out[q] + t
            del data
        return [{n: out[n] for n, _ in self.named_params} for out in outs]

    @staticmethod
    def _unit_weighted_sum(u: Unit, kind: str, data: Any, w: dict[str, torch.Tensor]
                           ) -> dict[str, torch.Tensor]:
        if kind == "zero":
            return {rel: torch.zeros_like(p) for rel, p in u.all_params.items()}
        if kind == "ghost":
            return u.rule.weighted_sum(u.module, data.args[0], data.grads[0], w)
        return _row_sums(data, w)

    def preflight(self) -> list[str]:
        """Every problem of the captured forward/backward at once, without raising (the probe
        of :func:`dpfy.validate`): calls the batch guard refuses, layers whose per-example
        gradients fail (no torch.func support, dropout inside a vmap unit, a rule refusing its
        input), and a loss that reaches no trainable parameter. Drops the captures."""
        used = [(u, c) for u in self.units for c in self._calls[id(u)] if c.used]
        problems = list(dict.fromkeys(c.problem for _, c in used if c.problem is not None))
        rows = self._rows()
        sizes = {c.batch_size for _, c in used if c.problem is None}
        if not used:
            problems.append("loss.backward() must reach a trainable parameter, got no layer "
                            "with a gradient. Check that the loss depends on the model's output")
        elif rows is not None and sizes - {rows}:
            problems.append(f"every layer must be called on the {rows} rows of the batch, got "
                            f"{sorted(sizes)}. Compute the loss only from that batch")
        elif len(sizes) == 1:
            b = sizes.pop()
            for u in self.units:
                calls = [c for c in self._calls[id(u)] if c.used and c.problem is None]
                try:
                    if calls:
                        self._unit_sq_norms(u, calls, b)
                except Exception as e:  # each layer's failure is one problem of the list
                    problems.append(f"{_label(u)}: {e}")
        self.clear()
        return problems

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
            row = u.explain("registered layer rule" + "".join(
                f"; {rel} tied to {q} (per-example gradients summed over its uses)"
                for rel, q in u.tied.items()))
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
