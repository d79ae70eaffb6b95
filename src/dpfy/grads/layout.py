"""Which dimension of a layer's input holds the batch: the batch guard's dimensions and the
layout probe that settles them when the shape cannot.

The engine bounds example i's contribution by clipping the gradient formed from row i of each
layer's input and output gradient, so it must know which dimension of each captured input holds
the private batch's rows. For a rule layer it is dimension 0 by convention, another dimension the
rule allows when only that one has the batch's size (a layer used time-first: the batch is moved
to dimension 0), or :data:`BROADCAST` for an input of one row shared by every example (its
output is expanded over the batch). For a vmap layer each tensor argument is batched in
dimension 0 or shared. Anything else is a problem, raised when the call's gradient is used.

On a private batch of 64 rows, a layer input of shape (64, 64, 32) may hold the batch in
dimension 0 (batch-first) or in dimension 1 (a layer used time-first with 64 steps); a (1, 64)
input may be a time-first sequence of one step or position ids shared by the 64 examples. The
shape cannot tell, and neither can the strides: a time-first tensor made contiguous looks
batch-first. Taking dimension 0 would be a guess, and a wrong guess gives per-example norms over
time steps: clipping and noise calibrated for examples that are not the examples — a silent
privacy failure.

What can tell is the model itself. The engine runs the model's forward once more, without
gradients, on the same batch with one row fewer (one more for a batch of two) and compares each
layer's input shapes between the two forwards: the batch dimension is the one that followed the
batch, and an input that did not change is shared by every example. This module builds the
resized batch (:func:`resize_batch`), runs it (:func:`run_layout_probe`) and reads the answer
(:func:`followed`, :func:`probed_rule_dim`, :func:`probed_vmap_problem`); the capture
(``grads/capture.py``) records the shapes and runs the probe only for a forward that has an
ambiguous layer input, once per forward.

The probe's one assumption is the loader's contract: the model is called with the batch the
private loader yielded, examples stacked in dimension 0 of each tensor with that many rows. A
tensor passed to the model as a *transposed view* with as many rows as another dimension (the
user transposing before the model) breaks it and is refused; a transposed copy made contiguous
before the model cannot be seen and is documented as unsupported (docs/engine.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from dpfy.grads.layers import Layer

__all__ = [
    "BROADCAST",
    "AMBIGUOUS",
    "LayoutProbe",
    "rule_candidates",
    "rule_batch_dim",
    "vmap_ambiguous",
    "vmap_batch_dims",
    "expand_rows",
    "resized_rows",
    "resize_batch",
    "run_layout_probe",
    "followed",
    "probed_rule_dim",
    "probed_vmap_problem",
    "call_shapes",
    "shape_of",
]

BROADCAST = -1  # a call whose inputs are shared by every example (leading dimension 1)
AMBIGUOUS = -2  # several dimensions could hold the batch: the layout probe decides

# rerun(probe, args, kwargs): the model's forward on (args, kwargs), every captured layer call
# recorded into ``probe`` instead of captured (``Capture.rerun``); returns the model's output
Rerun = Callable[[Any, tuple, dict], Any]


@dataclass
class LayoutProbe:
    """The shapes every captured layer saw in the resized forward, or why there are none.

    ``shapes`` maps a layer's id to one entry per call, in call order (see :func:`call_shapes`).
    """

    rows: int  # the resized batch's rows
    shapes: dict[int, list[Any]] = field(default_factory=dict)
    problem: str | None = None  # why the probe could not run

    def record_of(self, layer_id: int, j: int) -> tuple[Any, str | None]:
        """What the probe recorded for the layer's j-th call, and why nothing (None when there
        is a record)."""
        if self.problem is not None:
            return None, self.problem
        calls = self.shapes.get(layer_id, [])
        if j >= len(calls):
            return None, (
                f"the resized forward ({self.rows} rows) called it {len(calls)} "
                f"time(s), not {j + 1}"
            )
        return calls[j], None


def rule_candidates(layer: Layer, a: torch.Tensor, b: int) -> list[int]:
    """The dimensions of a rule layer's input that could hold a batch of ``b`` rows.

    Dim 0 if it has ``b`` rows (the convention); every other dimension of ``b`` rows the rule
    allows (a layer used time-first); :data:`BROADCAST` for an input of one row, which could be
    shared by every example (``position_ids`` of shape (1, T)).
    """
    assert layer.rule is not None, "rule_candidates is asked of rule layers only"
    cands = [0] if a.shape[0] == b else []
    cands += [k for k in layer.rule.batch_dims(layer.module, a) if k > 0 and a.shape[k] == b]
    if a.shape[0] == 1 and b != 1:
        cands.append(BROADCAST)
    return cands


def rule_batch_dim(layer: Layer, a: Any, b: int) -> tuple[int, str | None]:
    """Where the batch of ``b`` rows sits in a rule layer's input ``a``: (dim, problem).

    One candidate (:func:`rule_candidates`) is the answer. Several are :data:`AMBIGUOUS`
    (a (64, 64, d) input on a batch of 64, a (1, 64) input that is either one time step or
    shared position ids): the layout probe decides; neither the shape nor the strides can.
    With one example every candidate gives the same gradient. None is a problem.
    """
    if not torch.is_tensor(a) or a.dim() == 0:
        return 0, (
            f"{layer.label} must receive a tensor whose dimension 0 is the batch, got "
            f"{type(a).__name__}{'' if not torch.is_tensor(a) else ' of shape ()'}; the "
            f"private batch has {b} rows"
        )
    cands = rule_candidates(layer, a, b)
    if len(cands) == 1 or (cands and b == 1):
        return cands[0], None
    if cands:
        return AMBIGUOUS, None
    return 0, (
        f"{layer.label} must be called on the {b} rows of the private batch, got an "
        f"input of shape {tuple(a.shape)}: no dimension of that size where this layer "
        f"allows a batch. Compute the loss only from the batch the private loader "
        f"yielded, with the batch first in every layer. An input shared by every example "
        f"without a batch dimension (T5's relative position buckets, shape (T, T)) has no "
        f"per-example gradient here: freeze the layer (requires_grad_(False)) before "
        f"make_private"
    )


def vmap_ambiguous(args: tuple, kwargs: dict, b: int) -> bool:
    """Whether a vmap layer's tensor arguments have, besides dimension 0, a dimension of the
    batch's size (then dimension 0 may not be the batch: the layout probe checks)."""
    return b > 1 and any(
        torch.is_tensor(x) and any(n == b for n in x.shape[1:]) for x in (*args, *kwargs.values())
    )


def vmap_batch_dims(
    layer: Layer, args: tuple, kwargs: dict, b: int
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
    problem = (
        None
        if not problems
        else (
            f"{layer.label} must be called with the {b} rows of the private batch in dimension 0 "
            f"of its tensor arguments, got: {'; '.join(problems)}. The engine cannot tell which "
            f"example each row belongs to: pass padded tensors (not a PackedSequence) with the "
            f"batch "
            f"first, and compute the loss only from the batch the private loader yielded"
        )
    )
    return tuple(arg_dims), kw_dims, not batched and problem is None, problem


def expand_rows(t: Any, b: int) -> Any:
    """A tensor with one leading row as a (b, ...) view (an output computed from inputs shared
    by the batch, seen by each example); anything else unchanged."""
    if torch.is_tensor(t) and t.dim() >= 1 and t.shape[0] == 1 and b != 1:
        return t.expand(b, *t.shape[1:])
    return t


def resized_rows(rows: int) -> int:
    """The resized batch's size: one row fewer, or one more for a batch of two (so that the
    probe never runs on a single row, where several models squeeze their batch away)."""
    return rows - 1 if rows >= 3 else rows + 1


def _transposed(t: torch.Tensor, rows: int) -> bool:
    """A tensor with ``rows`` rows in dim 0 and another dimension of that size laid out
    outside it: a transposed view, whose dimension 0 may be the sequence, not the batch."""
    return t.stride(0) != 0 and any(
        t.shape[k] == rows and t.stride(k) > t.stride(0) for k in range(1, t.dim())
    )


def resize_batch(
    args: tuple, kwargs: dict, rows: int, index: torch.Tensor | None = None
) -> tuple[tuple, dict, str | None]:
    """The model call's arguments with every batch tensor cut (or grown) to
    :func:`resized_rows` rows, or to the rows ``index`` (the row-identity probe's batch,
    ``grads/row_identity.py``): (args, kwargs, problem).

    A batch tensor is a tensor leaf (inside tuples, lists, dicts) whose dimension 0 has
    ``rows`` rows; rows are taken in order, cycling for the grown case. Other leaves (shared
    tensors of one row, scalars, non-tensors) are passed unchanged.
    """
    new = resized_rows(rows)
    leaves, spec = tree_flatten((args, kwargs))
    out = []
    for i, t in enumerate(leaves):
        if torch.is_tensor(t) and t.dim() >= 1 and t.shape[0] == rows:
            if _transposed(t, rows):
                return (
                    args,
                    kwargs,
                    (
                        f"the model's input {i} of shape {tuple(t.shape)} is a transposed "
                        f"view with as many rows as another dimension, so its dimension 0 "
                        f"may not be the batch; call the model with the batch as the private "
                        f"loader yields it (examples in dimension 0) and transpose inside the "
                        f"model"
                    ),
                )
            t = t.index_select(
                0,
                index.to(t.device)
                if index is not None
                else torch.arange(new, device=t.device) % rows,
            )
        out.append(t)
    a, kw = tree_unflatten(out, spec)
    return tuple(a), dict(kw), None


def run_layout_probe(root_call: tuple[tuple, dict] | None, rows: int, rerun: Rerun) -> LayoutProbe:
    """The model run once more, without gradients, on its call ``root_call`` resized by a row,
    every captured layer's input shapes recorded (or why that could not be done)."""
    new = resized_rows(rows)
    if root_call is None:
        return LayoutProbe(
            new,
            problem=(
                "it was called outside a forward of the model the engine was given, so the "
                "engine cannot rerun the model on a resized batch to find out"
            ),
        )
    args, kwargs, problem = resize_batch(*root_call, rows)
    if problem is not None:
        return LayoutProbe(new, problem=problem)
    probe = LayoutProbe(new)
    try:
        with torch.no_grad():
            rerun(probe, args, kwargs)
    except Exception as err:  # noqa: BLE001 - reported as the reason for a refusal
        return LayoutProbe(
            new,
            problem=(
                f"rerunning the model on {new} of the batch's rows to find out failed "
                f"({type(err).__name__}: {str(err)[:200]})"
            ),
        )
    return probe


def shape_of(t: Any) -> tuple[int, ...] | None:
    return tuple(t.shape) if torch.is_tensor(t) else None


def call_shapes(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """What a probe records of one call: the shape of each argument (None: not a tensor)."""
    return tuple(shape_of(a) for a in args), {k: shape_of(v) for k, v in kwargs.items()}


def followed(
    real: tuple[int, ...], probed: tuple[int, ...] | None, rows: int, new: int
) -> list[int] | None:
    """The dimensions of an input that followed the batch between the two forwards.

    ``[k]``: dimension k held ``rows`` rows and the resized forward gave it ``new``; ``[]``:
    nothing changed (an input shared by every example, or one unrelated to the batch); None:
    anything else (a rank change, a dimension that changed by another amount, several that
    changed): the input does not follow the batch in a way the engine can split by example.
    """
    if probed is None or len(probed) != len(real):
        return None
    changed = [k for k in range(len(real)) if real[k] != probed[k]]
    if not changed:
        return []
    if len(changed) == 1 and real[changed[0]] == rows and probed[changed[0]] == new:
        return changed
    return None


def probed_rule_dim(
    probe: LayoutProbe, layer: Layer, j: int, a: torch.Tensor, rows: int
) -> tuple[int, str | None]:
    """The batch dimension of an ambiguous rule-layer input (its j-th call in this forward),
    from the probe: the one that followed the batch, or :data:`BROADCAST` for a one-row input
    that did not change; (0, problem) when the probe cannot tell."""
    probed, why = probe.record_of(id(layer), j)
    new = probe.rows
    if why is None:
        got = followed(tuple(a.shape), probed, rows, new)
        if got == [] and a.shape[0] == 1:
            return BROADCAST, None
        if got and got[0] in rule_candidates(layer, a, rows):
            return got[0], None
        why = (
            f"on {new} of the batch's rows it received shape {probed}, so no single "
            f"dimension of it follows the batch"
        )
    return 0, (
        f"{layer.label} must be called with the {rows} rows of the private batch in "
        f"one dimension, got an input of shape {tuple(a.shape)} where several "
        f"dimensions could be the batch, and {why}. Call the layer with the batch in "
        f"dimension 0 (transpose after the layer, not before it), or use a batch "
        f"size that no other dimension has"
    )


def probed_vmap_problem(
    probe: LayoutProbe,
    layer: Layer,
    j: int,
    args: tuple,
    kwargs: dict,
    dims: tuple[tuple, dict],
    rows: int,
) -> str | None:
    """Check a vmap layer's in-dims (batch in dim 0, or shared) for its j-th call against the
    probe: None if every tensor argument followed the batch as ``dims`` says."""
    probed, why = probe.record_of(id(layer), j)
    new = probe.rows
    if why is None:
        for (name, x, d), got in zip(
            [
                *((f"argument {i}", x, dims[0][i]) for i, x in enumerate(args)),
                *((f"keyword argument {k!r}", x, dims[1][k]) for k, x in kwargs.items()),
            ],
            [*probed[0], *(probed[1].get(k) for k in kwargs)],
        ):
            if not torch.is_tensor(x):
                continue
            want = [0] if d == 0 else []
            if followed(tuple(x.shape), got, rows, new) != want:
                why = (
                    f"its {name} of shape {tuple(x.shape)} became {got} on {new} of the "
                    f"batch's rows, so its batch is not "
                    f"{'in dimension 0' if d == 0 else 'absent (shared)'}"
                )
                break
        else:
            return None
    return (
        f"{layer.label} must be called with the {rows} rows of the private batch in "
        f"dimension 0 of its tensor arguments (or shared by every example), and "
        f"{why}. Call it with the batch in dimension 0, or use a batch size that no "
        f"other dimension has"
    )
