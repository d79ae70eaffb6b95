"""The loss contract, checked at the first step: the loss you backpropagate is what dpfy clips.

The engine reads example i's gradient from the gradient the loss sends each layer, scaled by B
for ``loss_reduction="mean"`` (``grads/engine.py``). That is example i's own gradient only when
the loss is ``(1/B)·Σ_i ℓ_i`` (or ``Σ_i ℓ_i`` for ``"sum"``), each ℓ_i computed from example i
alone, and nothing else. Three common losses break it without any error:

- ``reduction="sum"`` under the default ``"mean"`` (or the reverse): every example's gradient is
  read B times too large (too small), so the clipping threshold means something else;
- a term that autograd cannot differentiate, such as an L2 penalty on the parameters: dpfy holds
  the parameters' own gradient (``grads/held.py``), so the term is dropped from the update;
- a divisor that depends on the whole batch: a loss divided by a tensor (Hugging Face's
  ``num_items_in_batch``, the batch's token count), or a ``"mean"`` cross entropy over ignored
  targets (``ignore_index``) in unequal numbers per example or with class weights. Example i's
  gradient then depends on the other examples, and clipping no longer bounds one example's
  contribution. So it does under an elementwise loss (``mse_loss``, ``l1_loss``, ...) whose
  input and target both lead with the batch but differ in rank: (B, 1) against (B,) broadcasts
  to (B, B), every output against every target (torch only warns).

Scale. A loss c·Σ_i ℓ_i has the per-example gradient scale k = c·B under ``"mean"`` (the
engine multiplies by the batch's B rows) and k = c under ``"sum"``; the engine clips k·∇ℓ_i at
C, so the release has sensitivity C whatever k is, and what is accounted stays exact. A
*constant* k (``10 * F.cross_entropy(...)``, ``0.5 * mse``) is accepted: it only moves the
threshold on ∇ℓ_i to C/k, the same at every step, and scales what clipping leaves, as a
learning rate would. A k that depends on B is refused: the loss reduced the other way
(``reduction="sum"`` under ``"mean"``, k = B; ``sum / 32``, k = B/32), since Poisson sampling
draws B anew at every step and the threshold would move with it. The message states the k it
measured. (``sum / n`` where n equals this batch's rows is read as the mean: it is, for
``len(x)``.)

How it is seen: at the first training forward after ``make_private`` the model's output tensors
come back as :class:`Witness` tensors (the same values and autograd graph, a tensor subclass
whose ``__torch_function__`` notes how each result was computed from the output: the loss
functions' ``reduction``, reductions over the batch dimension, terms added, divisors). When the
loss is backpropagated its notes are kept, and the private step reads them before its first
clipping (:meth:`LossContract.problems`). Later forwards are plain. What is computed inside the
model's ``forward`` (a Hugging Face model's own loss from ``labels=``) is not seen, except a
``num_items_in_batch`` argument, which is.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_map

from dpfy._hooks import OwnHook

__all__ = ["LossContract", "Witness"]

_ADD = {
    "add",
    "__add__",
    "__radd__",
    "__iadd__",
    "add_",
    "sub",
    "__sub__",
    "__rsub__",
    "__isub__",
    "sub_",
    "rsub",
    "subtract",
}
_MUL = {"mul", "__mul__", "__rmul__", "__imul__", "mul_", "multiply"}
_DIV = {"div", "__truediv__", "__itruediv__", "div_", "divide", "true_divide"}
_REDUCE = {"sum": "sum", "nansum": "sum", "mean": "mean", "nanmean": "mean"}
_COUNTED = {"cross_entropy", "nll_loss"}  # "mean" divides by the count of kept targets
# elementwise losses that broadcast input against target (torch warns for some, not for
# gaussian_nll_loss, kl_div or hinge_embedding_loss)
_BROADCASTING = {
    "mse_loss",
    "l1_loss",
    "smooth_l1_loss",
    "huber_loss",
    "poisson_nll_loss",
    "gaussian_nll_loss",
    "kl_div",
    "hinge_embedding_loss",
}

EXTRA_TERM = (
    "the loss must be computed from the model's output only, got a term added to it that "
    "autograd cannot differentiate (an L2 penalty on the parameters, say: dpfy holds the "
    "parameters' own gradient, so the term would be dropped from the update silently). For an "
    "L2 penalty use the optimizer's weight_decay= (applied to the released gradient, no "
    "privacy cost); any other term must be computed from the model's output"
)
TENSOR_DIVISOR = (
    "the loss must not be divided by a tensor, got loss / tensor (Hugging Face's "
    "num_items_in_batch, the batch's token count, say): each example's gradient would depend "
    "on the other examples of the batch, and clipping would no longer bound one example's "
    "contribution. Divide by a Python number, or average each example's own tokens "
    "(reduction='none', a mean per example, then the mean over the batch)"
)


def _measured(found: str, scale: float, rows: int) -> str:
    """The per-example gradient scale k a loss reduced by ``found`` and then multiplied by the
    constant ``scale`` gives, relative to the other reduction (module docstring, "Scale")."""
    times = "" if scale == 1 else f" × {scale:g}" if scale > 1 else f" / {1 / scale:g}"
    if found == "sum":  # c = scale, read under "mean" as c·B
        k, rule = scale * rows, "B" if scale == 1 else f"B{times}"
    else:  # c = scale/B, read under "sum" as c
        k, rule = scale / rows, "1/B" if scale == 1 else f"(1/B){times}"
    return (
        f"a loss whose per-example gradient scale is k = {rule} (the {found} over the batch"
        f"{times}; k = {k:.4g} at this batch of B = {rows} rows)"
    )


def _mismatch(found: str, expected: str, scale: float, rows: int) -> str:
    fix = (
        "pass loss_reduction='sum' to make_private, or reduce with reduction='mean'"
        if found == "sum"
        else "pass loss_reduction='mean' (the default) to make_private, or reduce with "
        "reduction='sum'"
    )
    return (
        f"the loss must be the {expected} over the batch's examples, times a constant, for "
        f"loss_reduction={expected!r}, got {_measured(found, scale, rows)}: k depends on the "
        f"batch's size B, which Poisson sampling draws anew at every step, so each example's "
        f"gradient would be clipped at a threshold C/k that moves with B"
        + (
            f" ({'B times smaller' if found == 'sum' else 'B times larger'} than the C you chose)"
            if scale == 1
            else ""
        )
        + ". A constant k (10 × the mean, say) is accepted: it is clipped at "
        f"C/k, the same at every step. Make them agree: {fix}"
    )


@dataclass
class _Notes:
    """What a witness tensor's computation from the model's output did (public facts only)."""

    reductions: frozenset[str] = frozenset()  # over the batch: "mean" / "sum"
    problems: tuple[str, ...] = ()
    loss: bool = False  # a loss already: a loss function's output, or reduced over the batch
    scale: float = 1.0  # constant factors applied to the loss after its reduction

    def join(self, other: "_Notes") -> "_Notes":
        return _Notes(
            self.reductions | other.reductions,
            tuple(dict.fromkeys(self.problems + other.problems)),
            self.loss or other.loss,
            self.scale if other.scale == 1 else other.scale if self.scale == 1 else math.nan,
        )


@dataclass
class _Trace:
    """One armed forward: the batch's rows and, once backpropagated, the loss's notes."""

    rows: int
    wrapped: bool = False  # the output of this forward was made a witness
    loss: _Notes | None = None
    problems: list[str] = field(default_factory=list)  # seen in the call itself


class Witness(torch.Tensor):
    """A model output that notes how the loss is computed from it (see the module docstring)."""

    _dpfy_trace: _Trace
    _dpfy_notes: _Notes

    @classmethod
    def __torch_function__(
        cls, func: Callable[..., Any], types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        kwargs = kwargs or {}
        witnesses = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, Witness)]
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **kwargs)
        if not witnesses:
            return out
        trace = witnesses[0]._dpfy_trace
        if func is torch.Tensor.backward or func is torch.autograd.backward:
            first = args[0] if args else kwargs.get("tensors")
            loss = first if isinstance(first, Witness) else witnesses[0]
            trace.loss = (
                loss._dpfy_notes if trace.loss is None else trace.loss.join(loss._dpfy_notes)
            )
            return out
        notes = _notes_of(func, args, kwargs, witnesses, trace.rows)

        def wrap(t: Any) -> Any:
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                w = t if isinstance(t, Witness) else t.as_subclass(Witness)
                w._dpfy_trace, w._dpfy_notes = trace, notes
                return w
            return t

        return tree_map(wrap, out)


def _notes_of(
    func: Callable[..., Any], args: tuple, kwargs: dict, witnesses: list[Witness], rows: int
) -> _Notes:
    """The notes of ``func``'s result from its witness inputs' notes and its own effect."""
    notes = witnesses[0]._dpfy_notes
    for w in witnesses[1:]:
        notes = notes.join(w._dpfy_notes)
    name = getattr(func, "__name__", "")
    first = args[0] if args else None
    if getattr(func, "__module__", "") == "torch.nn.functional" and name.endswith(
        ("_loss", "cross_entropy", "kl_div")
    ):
        return notes.join(_loss_notes(func, name, args, kwargs, rows))
    if name in _REDUCE and isinstance(first, Witness):
        dims = kwargs.get("dim", args[1] if len(args) > 1 else None)
        if dims is None or _covers_batch(dims, first.dim()):
            if (
                rows > 0 and first.dim() >= 1 and first.shape[0] == rows and not notes.reductions
            ):  # (an empty batch: no example to read)
                return notes.join(_Notes(frozenset({_REDUCE[name]}), loss=True))
        return notes
    other = (args[1] if len(args) > 1 else kwargs.get("other")) if args else None
    if not notes.loss and name in _ADD:  # a target subtracted by hand: ((o - y) ** 2).mean()
        out, target = (first, other) if isinstance(first, Witness) else (other, first)
        if not isinstance(target, Witness):
            problem = _broadcast_problem(
                "a subtraction's" if "sub" in name else "an addition's", out, target, rows
            )
            if problem:
                return notes.join(_Notes(problems=problem))
    # Terms and divisors matter once the value is a loss; before (targets subtracted from the
    # output, a per-example weight) they are part of each example's own loss.
    if (
        notes.loss
        and isinstance(first, Witness)
        and isinstance(other, torch.Tensor)
        and not isinstance(other, Witness)
    ):
        if name in _ADD and not other.requires_grad:
            return notes.join(_Notes(problems=(EXTRA_TERM,)))
        if name in _DIV and (notes.reductions or other.numel() == 1):
            return notes.join(_Notes(problems=(TENSOR_DIVISOR,)))
    if (
        notes.loss
        and name in _ADD
        and isinstance(other, Witness)
        and isinstance(first, torch.Tensor)
        and not isinstance(first, Witness)
        and not first.requires_grad
    ):
        return notes.join(_Notes(problems=(EXTRA_TERM,)))
    if (
        isinstance(first, Witness)
        and isinstance(other, (int, float))
        and not isinstance(other, bool)
        and other == rows
        and rows > 1
        and len(notes.reductions) == 1
    ):
        (r,) = notes.reductions
        if name in _DIV and r == "sum":  # (Σ_i ℓ_i) / B: a mean
            return _Notes(frozenset({"mean"}), notes.problems, loss=True, scale=notes.scale)
        if name in _MUL and r == "mean":  # B · mean: a sum
            return _Notes(frozenset({"sum"}), notes.problems, loss=True, scale=notes.scale)
    if (
        notes.reductions
        and isinstance(first, Witness)
        and isinstance(other, (int, float))
        and not isinstance(other, bool)
        and other != 0
        and name in _MUL | _DIV
    ):  # a constant factor: the per-example scale k of the module docstring
        factor = float(other) if name in _MUL else 1 / float(other)
        return _Notes(notes.reductions, notes.problems, notes.loss, notes.scale * factor)
    return notes


def _covers_batch(dims: Any, ndim: int) -> bool:
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    return any(d % max(ndim, 1) == 0 for d in dims) if dims else True


def _loss_notes(
    func: Callable[..., Any], name: str, args: tuple, kwargs: dict, rows: int
) -> _Notes:
    """A ``torch.nn.functional`` loss: its reduction over the batch, and its divisor."""
    try:
        bound = inspect.signature(func).bind(*args, **kwargs)
    except (TypeError, ValueError):
        return _Notes()
    bound.apply_defaults()
    a = bound.arguments
    reduction = a.get("reduction", "mean")
    if a.get("size_average") is not None or a.get("reduce") is not None:
        reduction = nn._reduction.legacy_get_string(a.get("size_average"), a.get("reduce"))
    x = a.get("input", args[0] if args else None)
    broadcast = (
        _broadcast_problem(f"{name}'s", x, a.get("target"), rows) if name in _BROADCASTING else ()
    )
    if broadcast:
        return _Notes(problems=broadcast, loss=True)
    if (
        reduction == "none"
        or rows == 0
        or not isinstance(x, torch.Tensor)
        or x.dim() == 0
        or x.shape[0] % rows
    ):
        return _Notes(loss=True)
    if reduction == "batchmean" and x.shape[0] != rows:
        return _Notes(problems=(TENSOR_DIVISOR,), loss=True)
    found = "sum" if reduction == "sum" else "mean"
    problems: tuple[str, ...] = ()
    if name in _COUNTED and reduction == "mean":
        problems = _counted_mean_problem(name, a, rows)
    return _Notes(frozenset({found}), problems, loss=True)


def _broadcast_problem(whose: str, x: Any, target: Any, rows: int) -> tuple[str, ...]:
    """An elementwise loss (or a subtraction) whose input and target both lead with the batch's
    rows, or with a multiple of them (tokens flattened to (B·T, 1) against (B·T,)), but differ
    in rank: broadcasting aligns trailing dimensions, so one's leading dimension meets the
    other's last ((B, 1) against (B,) gives (B, B)) and each row is compared with every
    target."""
    if (
        rows < 2
        or not isinstance(x, torch.Tensor)
        or not isinstance(target, torch.Tensor)
        or x.dim() == target.dim()
        or min(x.dim(), target.dim()) == 0
        or x.shape[0] != target.shape[0]
        or x.shape[0] % rows
        or not _expands(x.shape, target.shape)
    ):
        return ()
    return (
        f"{whose} input and target must have the same number of dimensions, got "
        f"input.shape = {tuple(x.shape)} and target.shape = {tuple(target.shape)}: broadcasting "
        f"compares each example's output with the other examples' targets, so each example's "
        f"gradient would depend on the other examples and clipping would no longer bound one "
        f"example's contribution. Match the shapes (output.squeeze(-1), or "
        f"target.unsqueeze(-1))",
    )


def _expands(x: torch.Size, target: torch.Size) -> bool:
    """Whether broadcasting ``target`` against ``x`` gives more elements than ``x`` (a per-class
    constant target of length B does not: each example meets the same constant)."""
    try:
        return torch.broadcast_shapes(x, target) != x
    except RuntimeError:  # torch's own error follows in the loss itself
        return False


def _counted_mean_problem(name: str, a: dict[str, Any], rows: int) -> tuple[str, ...]:
    """A "mean" cross entropy divides by Σ weight[target] over the kept targets: per example
    equal (no weights, the same count of kept targets in each example) or a problem."""
    target, ignore = a.get("target"), a.get("ignore_index", -100)
    why = None
    if a.get("weight") is not None:
        why = "class weights (weight=)"
    elif (
        isinstance(target, torch.Tensor)
        and not target.is_floating_point()
        and rows > 0
        and target.numel() % rows == 0
    ):
        kept = (target.reshape(rows, -1) != ignore).sum(1)
        if bool((kept != kept[0]).any()):
            why = f"ignored targets (ignore_index={ignore}) in unequal numbers per example"
    if why is None:
        return ()
    return (
        f"{name}(reduction='mean') must divide by a number that does not depend on the "
        f"batch, got {why}: it divides by a count over the whole batch, so each example's "
        f"gradient would depend on the other examples and clipping would no longer bound "
        f"one example's contribution. Use reduction='none', average each example's own "
        f"losses, then take the mean over the batch",
    )


class LossContract:
    """Watches the first training forward after ``arm`` and says what its loss breaks.

    Args:
      model: the model whose output becomes a :class:`Witness` (its root forward).
      rows: the private batch's row count now (None: no private batch pending, nothing armed).
      loss_reduction: what ``make_private`` was told: ``"mean"`` or ``"sum"``.
    """

    def __init__(
        self, model: nn.Module, rows: Callable[[], int | None], loss_reduction: str
    ) -> None:
        self.rows, self.loss_reduction = rows, loss_reduction
        self.trace: _Trace | None = None
        self._depth = 0  # nested calls of the model (the engine's probes rerun it inside)
        self._handles = [
            model.register_forward_pre_hook(OwnHook(self._enter), with_kwargs=True),
            model.register_forward_hook(OwnHook(self._exit), always_call=True),
        ]

    def _enter(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        self._depth += 1
        if self._depth > 1 or self.trace is not None or not torch.is_grad_enabled():
            return
        rows = self.rows()
        if rows is None:
            return
        self.trace = _Trace(rows=rows)
        n = kwargs.get("num_items_in_batch")
        if n is not None and not (float(n) == 1.0):
            self.trace.problems.append(
                f"num_items_in_batch must be 1 (or not given) while the model is private, got "
                f"num_items_in_batch = {float(n):g}: the model divides the batch's summed "
                f"token loss by it, so each example's gradient would depend on the other "
                f"examples of the batch. Pass num_items_in_batch=1 with make_private(..., "
                f"loss_reduction='sum') (each example's loss is then the sum of its tokens)"
            )

    def _exit(self, module: nn.Module, args: tuple, output: Any) -> Any:
        self._depth -= 1
        trace = self.trace
        if self._depth or trace is None or trace.wrapped:
            return None
        trace.wrapped = True
        notes = _Notes()

        def wrap(t: Any) -> Any:
            if isinstance(t, torch.Tensor) and t.is_floating_point() and not isinstance(t, Witness):
                w = t.as_subclass(Witness)
                w._dpfy_trace, w._dpfy_notes = trace, notes
                return w
            return t

        if isinstance(output, dict):  # a Hugging Face ModelOutput: its fields, in place
            for k in list(output.keys()):
                output[k] = wrap(output[k])
            return output
        return tree_map(wrap, output)

    def problems(self) -> list[str] | None:
        """What the backpropagated loss breaks; None while no loss was backpropagated yet."""
        trace = self.trace
        if trace is None or (trace.loss is None and not trace.problems):
            return None
        found = list(trace.problems)
        if trace.loss is not None:
            found += list(trace.loss.problems)
            found += [
                _mismatch(r, self.loss_reduction, trace.loss.scale, trace.rows)
                for r in sorted(trace.loss.reductions - {self.loss_reduction})
            ]
        return list(dict.fromkeys(found))

    def rearm(self) -> None:
        """Watch the next training forward again (after a refusal, to check the fix)."""
        self.trace = None

    def remove(self) -> None:
        """Stop watching (after the first step's check)."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self.trace = None
