"""Which dimension of a layer's input holds the batch, when its shape cannot say.

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
resized batch (:func:`resize_batch`) and reads the answer (:func:`followed`); the engine
(``grads/engine.py``) records the shapes and runs the probe only for a forward that has an
ambiguous layer input, once per forward.

The probe's one assumption is the loader's contract: the model is called with the batch the
private loader yielded, examples stacked in dimension 0 of each tensor with that many rows. A
tensor passed to the model as a *transposed view* with as many rows as another dimension (the
user transposing before the model) breaks it and is refused; a transposed copy made contiguous
before the model cannot be seen and is documented as unsupported (docs/engine.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

__all__ = ["LayoutProbe", "resized_rows", "resize_batch", "followed", "call_shapes", "shape_of"]


@dataclass
class LayoutProbe:
    """The shapes every captured layer saw in the resized forward, or why there are none.

    ``shapes`` maps a unit's id to one entry per call, in call order (see :func:`call_shapes`).
    """

    rows: int                                  # the resized batch's rows
    shapes: dict[int, list[Any]] = field(default_factory=dict)
    problem: str | None = None                 # why the probe could not run


def resized_rows(rows: int) -> int:
    """The resized batch's size: one row fewer, or one more for a batch of two (so that the
    probe never runs on a single row, where several models squeeze their batch away)."""
    return rows - 1 if rows >= 3 else rows + 1


def _transposed(t: torch.Tensor, rows: int) -> bool:
    """A tensor with ``rows`` rows in dim 0 and another dimension of that size laid out
    outside it: a transposed view, whose dimension 0 may be the sequence, not the batch."""
    return t.stride(0) != 0 and any(
        t.shape[k] == rows and t.stride(k) > t.stride(0) for k in range(1, t.dim()))


def resize_batch(args: tuple, kwargs: dict, rows: int, index: torch.Tensor | None = None
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
                return args, kwargs, (
                    f"the model's input {i} of shape {tuple(t.shape)} is a transposed view with "
                    f"as many rows as another dimension, so its dimension 0 may not be the "
                    f"batch; call the model with the batch as the private loader yields it "
                    f"(examples in dimension 0) and transpose inside the model")
            t = t.index_select(0, index.to(t.device) if index is not None
                               else torch.arange(new, device=t.device) % rows)
        out.append(t)
    a, kw = tree_unflatten(out, spec)
    return tuple(a), dict(kw), None


def shape_of(t: Any) -> tuple[int, ...] | None:
    return tuple(t.shape) if torch.is_tensor(t) else None


def call_shapes(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """What a probe records of one call: the shape of each argument (None: not a tensor)."""
    return tuple(shape_of(a) for a in args), {k: shape_of(v) for k, v in kwargs.items()}


def followed(real: tuple[int, ...], probed: tuple[int, ...] | None, rows: int, new: int
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
