"""Whether row i of every layer's input belongs to example i: the row-identity probe.

The engine bounds one example's contribution by clipping, for each i, the gradient formed from
row i of every captured layer's input and row i of its output gradient. That is example i's
gradient only if row i of each of those tensors was computed from example i alone. A model
that mixes or moves rows across the batch breaks it silently: batch statistics written by hand
(``(h - h.mean(0)) / h.std(0)``), rows sorted before a layer and unsorted after it, a
``reshape`` that moves the batch dimension. Then one example changes other examples' rows, and
its contribution to the released sum is no longer bounded by C (measured: 4.45·C, 1.37·C).

The check. At the first training forward of an engine bound to a private batch of n ≥ 3 rows
(and at the first forward of n = 2 rows before that: the removal only, :data:`MIN_PROBE_ROWS`)
(and in :func:`dpfy.validate`'s pre-flight), the capture (``grads/capture.py``) calls
:func:`find_mixing`, which runs the model twice more, without
gradients: once on the batch, once on the batch *without its first row and in reverse order*
(:func:`probe_index`). Each captured layer call's input rows along the engine's batch dimension
for that call, and the model's output rows, must then be the full forward's rows in that order,
up to the differences the arithmetic in effect makes between batch sizes (:func:`rows_differ`,
``grads/arithmetic.py``: TF32, autocast and cuDNN's choice of algorithm included). Removing a
row catches batch statistics; reversing the rest catches sorting, which a removal alone misses
whenever the removed example sorts to where it already is (any removal misses it on an
already-sorted batch).
A layer's input that is shared by every example (one row, or a vmap layer's non-batched
argument) must not change at all.

Randomness. Both probe forwards run with the modules in ``eval()`` mode (each module's own mode
is restored after) and from the same global RNG seed inside ``torch.random.fork_rng``, so the
training run's global RNG stream is neither consumed nor changed; dpfy's noise has its own
generator and is not touched. Training mode cannot work in general: the dropout masks drawn for
n and n − 1 rows do not line up row by row (their draws, and every later layer's, are offset).
Randomness that ``eval()`` does not switch off (``F.dropout(x, p)`` without ``training=``,
``torch.rand_like`` in a forward) makes rows differ too: when rows differ, the full batch is run
a third time from another seed, and if the first difference shows there as well it is
randomness, not mixing. The layers from that call on cannot be checked and are passed (the
calls before it were checked); such a model is checked only up to its first random layer.

What the probe cannot see: it compares activations, not the loss. A loss that mixes examples
(normalized by the batch's total token count, an in-batch contrastive loss, mixup in the loss)
is not detected; nor is mixing that this one batch does not show (a sort that is the identity on
both probe batches, data-dependent mixing that these rows do not trigger); nor mixing inside a
vmap layer that does not reach its inputs or the model's output; nor a model whose call cannot
be cut by rows (its probe forward raises, e.g. ``EmbeddingBag`` called with 1-D ids and offsets,
whose offsets reversed are invalid; or a transposed view as input): such a model is not checked
here (not refused). Training mode, the backward pass and models that cannot be cut by rows are
the perturbation probe's (``grads/perturbation.py``), which keeps the batch's shape and runs
right after this one. A layer whose input depends on
the position of a row in the batch (``x + torch.arange(B)[:, None]``) is refused although it
would be private: the probe reorders the rows.

Cost: two forwards without gradients and the comparison, once per engine (the first forward on
≥ 3 rows); a third forward only when rows differ. On the tanh CNN (batch 256 of 1×28×28, one
CPU thread, median of 7) the step that probes took 118 ms against 48 ms for a step without it:
70 ms more, of which two no-grad forwards ≈ 56 ms (28 ms each) and the comparison the rest;
later steps are unchanged. Memory: the two probe forwards' layer inputs, held together.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import contextlib

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from dpfy.grads.arithmetic import row_rtol
from dpfy.grads.layout import Rerun, resize_batch
from dpfy.grads.layers import Layer

__all__ = [
    "RowProbe",
    "MIN_ROWS",
    "MIN_PROBE_ROWS",
    "row_probe_applies",
    "ProbedForward",
    "find_mixing",
    "holds_batch",
    "probe_index",
    "rows_differ",
    "beyond_arithmetic",
    "call_differs",
    "differing_calls",
    "is_randomness",
    "output_differs",
    "forked_rng",
    "probe_mode",
    "reseed",
    "mixing_problem",
    "rows_mixed_problem",
]

MIN_ROWS = 3  # the first forward of >= 3 rows is the engine's full check (remove one, reorder)
# A 2-row batch is probed too (a 1-row batch cannot mix): removing its first row catches batch
# statistics and the perturbation probe a loss that couples the two (HF's token mean over
# unequal label counts), though a reorder of one row shows nothing; such a check does not count
# as the full one: the first 2-row forward is probed, and the first of MIN_ROWS rows still is.
MIN_PROBE_ROWS = 2


@dataclass
class RowProbe:
    """What one probe forward recorded: every captured layer's inputs, per call in call order.

    ``rows`` is the probe batch's size (the engine expands an output computed from shared
    inputs to it, as it does in the training forward). ``inputs`` maps a layer's id to one
    entry per call: a rule layer's batch input, or a vmap layer's (args, kwargs).
    """

    rows: int
    inputs: dict[int, list[Any]] = field(default_factory=dict)
    order: list[tuple[int, int]] = field(default_factory=list)  # (layer id, call) in call order
    shared: dict[int, list[bool]] = field(default_factory=dict)  # the training forward's

    def was_shared(self, layer_id: int, otherwise: bool) -> bool:
        """Whether the training forward found the call being recorded shared by the batch
        (``otherwise`` for a call it did not make). Call after :meth:`record`."""
        made, j = self.shared.get(layer_id, []), len(self.inputs.get(layer_id, [])) - 1
        return made[j] if 0 <= j < len(made) else otherwise

    def record(self, layer_id: int, value: Any) -> None:
        calls = self.inputs.setdefault(layer_id, [])
        self.order.append((layer_id, len(calls)))
        calls.append(value)


def row_probe_applies(root_call: tuple[tuple, dict], rows: int | None) -> bool:
    """Whether the model's call ``root_call`` is one to probe: a forward with autograd on over
    the bound private batch of at least :data:`MIN_PROBE_ROWS` rows."""
    return (
        rows is not None
        and rows >= MIN_PROBE_ROWS
        and torch.is_grad_enabled()
        and holds_batch(*root_call, rows)
    )


@dataclass(frozen=True)
class ProbedForward:
    """One training forward, as the row checks (:func:`find_mixing`,
    :func:`dpfy.grads.perturbation.find_cross_row`) run it again.

    Args:
      model: the model, called as ``root_call`` (args, kwargs) on the private batch of ``rows``.
      now: each layer's calls of that forward (``grads/capture.py``'s ``Call``: ``.shared``,
        ``.problem`` and ``.row_dims(layer)``), by layer id, in call order.
      layers: the layers by id.
      rerun: runs the model recording each layer call into a probe (``Capture.rerun``).
      device: where the trainable parameters live (the RNG forked there too).
    """

    model: nn.Module
    root_call: tuple[tuple, dict]
    rows: int
    now: dict[int, list[Any]]
    layers: dict[int, Layer]
    rerun: Rerun
    device: torch.device | None

    def shared(self) -> dict[int, list[bool]]:
        """Which calls the forward found shared by the batch, by layer id (a probe's
        ``shared``)."""
        return {uid: [c.shared for c in calls] for uid, calls in self.now.items()}

    def to_check(self, uid: int, j: int) -> Any:
        """Layer ``uid``'s ``j``-th call in the forward, or None when it made no such call or
        the call already has its problem (a call not to check)."""
        calls = self.now[uid]
        real = calls[j] if j < len(calls) else None
        return None if real is None or real.problem is not None else real

    def calls(self) -> list[Any]:
        """Every call of the forward (the targets of a refusal of its output)."""
        return [c for calls in self.now.values() for c in calls]


def find_mixing(probed: ProbedForward) -> tuple[str, list[Any]] | None:
    """The row-identity check of one training forward (see the module docstring).

    Returns:
      None when every row is its example's own (or the model cannot be cut by rows, or its
      differences are randomness), else the refusal and the calls it belongs to.
    """
    root_call, rows, layers = probed.root_call, probed.rows, probed.layers
    index = probe_index(rows, probed.device)
    args, kwargs, problem = resize_batch(*root_call, rows, index=index)
    if problem is not None:
        return None  # a transposed view: the layout probe refuses it where it matters
    shared = probed.shared()

    def forward(args: tuple, kwargs: dict, rows: int, seed: int = 0) -> tuple[RowProbe, Any]:
        with probe_mode(probed.model, probed.device):
            reseed(seed)
            probe = RowProbe(rows, shared=shared)
            return probe, probed.rerun(probe, args, kwargs)

    try:
        (full, out_full), (part, out_part) = (
            forward(*root_call, rows),
            forward(args, kwargs, rows - 1),
        )
    except Exception:  # noqa: BLE001 - a batch the model cannot run on: not checked
        return None  # (EmbeddingBag's 1-D ids with offsets cannot be cut by rows)

    def dims(uid: int, j: int) -> Any:  # None: a call not to check
        real = probed.to_check(uid, j)
        return None if real is None else (real.row_dims(layers[uid]),)

    differing = differing_calls(full, part, index, dims)
    out_differs = output_differs(out_full, out_part, rows, index)
    if not differing and not out_differs:
        return None
    again = forward(*root_call, rows, seed=1)
    if is_randomness(full, out_full, again, differing, rows, dims):
        return None
    problem = (
        mixing_problem(layers[differing[0][0]].label, rows, differing[0][2])
        if differing
        else mixing_problem(
            None,
            rows,
            f"its rows; the last layer called is {layers[full.order[-1][0]].label}"
            if full.order
            else "its rows",
        )
    )
    targets = probed.calls() if out_differs else [probed.now[uid][j] for uid, j, _ in differing]
    return problem, targets


def holds_batch(args: tuple, kwargs: dict, rows: int) -> bool:
    """Whether the model was called with a tensor of ``rows`` rows (the private batch): a
    forward on other data (held out, with autograd on) is not the one to probe."""
    return any(
        torch.is_tensor(t) and t.dim() >= 1 and t.shape[0] == rows
        for t in tree_flatten((args, kwargs))[0]
    )


def _device_of(tree: Any) -> torch.device | None:
    """The device of the first tensor in ``tree`` (None: no tensor in it)."""
    return next((t.device for t in tree_flatten(tree)[0] if torch.is_tensor(t)), None)


def probe_index(rows: int, device: torch.device | None = None) -> torch.Tensor:
    """The rows of the second probe batch: all but the first, in reverse order (n − 1 rows),
    on ``device`` (the trainable parameters'; the batch's rows are selected there)."""
    return torch.arange(rows - 1, 0, -1, device=device)


@contextlib.contextmanager
def probe_mode(model: nn.Module, device: torch.device | None) -> Iterator[None]:
    """The probe forwards' conditions: no gradients, every module in eval() mode (restored
    after, module by module), and the global RNG forked (restored after, so that the training
    run's stream is unchanged). Call :func:`reseed` before each forward."""
    modes = [(m, m.training) for m in model.modules()]
    try:
        with forked_rng(device), torch.no_grad():
            model.eval()
            yield
    finally:
        for m, mode in modes:
            m.training = mode


def forked_rng(device: torch.device | None) -> contextlib.AbstractContextManager[None]:
    """The global RNG forked for a probe: the CPU's and, for a CUDA ``device``, that device's
    (restored after, so that the training run's stream is unchanged)."""
    devices = (
        [device.index if device.index is not None else torch.cuda.current_device()]
        if device is not None and device.type == "cuda"
        else []
    )
    return torch.random.fork_rng(devices=devices)


def reseed(seed: int = 0) -> None:
    """Start a probe forward from a fixed global RNG state (the same for the two forwards
    compared; another for the forward that tells randomness from mixing)."""
    torch.manual_seed(seed)


def rows_differ(
    full: Any, part: Any, index: torch.Tensor, dim: int | None, rtol: float | None = None
) -> bool:
    """Whether ``part`` is not ``full``'s rows ``index`` along ``dim`` (None: a shared input,
    which must not change beyond the arithmetic), up to the differences that the arithmetic
    in effect makes between batch sizes: ``rtol`` (default :func:`~dpfy.grads.arithmetic.
    row_rtol` of ``full``'s dtype and device) bounds each element's change by its row's
    scale (:func:`beyond_arithmetic`)."""
    if not torch.is_tensor(full) or not torch.is_tensor(part):
        return torch.is_tensor(full) != torch.is_tensor(part)
    if dim is not None:
        if full.dim() <= dim:
            return True
        full = full.index_select(dim, index.to(full.device))
    if full.shape != part.shape:
        return True
    if not full.is_floating_point():
        return not torch.equal(full, part)
    if full.numel() == 0:
        return False
    tol = rtol if rtol is not None else row_rtol(full.dtype, full.device.type)
    return beyond_arithmetic(full, part, dim, tol)


def beyond_arithmetic(full: torch.Tensor, part: torch.Tensor, dim: int | None, rtol: float) -> bool:
    """Whether some element of ``part`` differs from ``full`` (same shape) by more than
    ``rtol · (|x| + rms of its row) + 0.1 · rtol · max|x|``, rows along ``dim`` (None: the
    whole tensor is one row).

    The row's root mean square is the scale of a dot product's rounding error (about
    u·‖a‖‖b‖, ``grads/arithmetic.py``), which an element that is a small sum of large
    cancelling terms does not show; the last term, the probe's former absolute floor, keeps
    a row of zeros (a dead ReLU row) from being judged on its own tiny scale. Computed in
    float32 at least, one pass per term."""
    x = full.movedim(dim, 0) if dim is not None else full.unsqueeze(0)
    y = part.movedim(dim, 0) if dim is not None else part.unsqueeze(0)
    wide = torch.promote_types(full.dtype, torch.float32)
    # detached: a comparison, never part of a graph (a stage's input may require grad)
    x = x.detach().reshape(x.shape[0], -1).to(wide)
    y = y.detach().reshape(y.shape[0], -1).to(wide)
    size = x.shape[1]
    rms = torch.linalg.vector_norm(x, dim=1, keepdim=True).div_(max(size, 1) ** 0.5)  # (R, 1)
    bound = x.abs()
    floor = 0.1 * rtol * float(bound.max())
    bound.add_(rms).mul_(rtol).add_(floor)
    return bool((y - x).abs_().gt_(bound).any())


Dims = Any  # a rule layer's batch dimension (None: shared), or a vmap layer's (arg, kwarg) dims


def call_differs(full: Any, part: Any, index: torch.Tensor, dims: Dims) -> str | None:
    """What differs between a layer call's inputs in the two probe forwards (None: nothing).

    ``dims`` is the engine's batch dimension for that call: an int or None (shared) for a rule
    layer's one batch input, a tuple (per argument) and a dict (per keyword) for a vmap layer.
    """
    if not isinstance(dims, tuple):
        return "its rows" if rows_differ(full, part, index, dims) else None
    (fa, fk), (pa, pk) = full, part
    if len(fa) != len(pa) or set(fk) != set(pk):
        return "its arguments"
    named = [
        *((f"argument {i}", fa[i], pa[i], d) for i, d in enumerate(dims[0])),
        *((f"keyword argument {k!r}", fk[k], pk[k], dims[1].get(k)) for k in fk),
    ]
    for name, f, p, d in named:
        if rows_differ(f, p, index, d):
            return f"its {name}"
    return None


def differing_calls(
    full: RowProbe,
    part: RowProbe,
    index: torch.Tensor,
    dims: Callable[[int, int], tuple[Dims] | None],
) -> list[tuple[int, int, str]]:
    """The layer calls whose inputs differ between the two probe forwards, in call order:
    (layer id, call, what differs). ``dims(layer id, call)`` gives the call's batch dimension(s)
    as a 1-tuple, or None for a call not to check (the training forward did not make it, or
    already refused it)."""
    out = []
    for uid, j in full.order:
        d = dims(uid, j)
        if d is None:
            continue
        got = part.inputs.get(uid, [])
        what = (
            f"called {len(full.inputs[uid])} time(s) on the batch and {len(got)} without "
            f"one example"
            if j >= len(got)
            else call_differs(full.inputs[uid][j], got[j], index, d[0])
        )
        if what is not None:
            out.append((uid, j, what))
    return out


def is_randomness(
    full: RowProbe,
    out_full: Any,
    again: tuple[RowProbe, Any],
    differing: list[tuple[int, int, str]],
    rows: int,
    dims: Callable[[int, int], tuple[Dims] | None],
) -> bool:
    """Whether the first difference (a call's inputs, else the output) shows between two
    forwards on the same batch from different seeds (``full`` and ``again``): randomness that
    eval() does not switch off, not mixing."""
    same, (rec, out_again) = torch.arange(rows, device=_device_of(out_full)), again
    if not differing:
        return output_differs(out_full, out_again, rows, same)
    uid, j, _ = differing[0]
    got = rec.inputs.get(uid, [])
    d = dims(uid, j)
    assert d is not None  # differing_calls lists only the calls that have dims
    return j >= len(got) or call_differs(full.inputs[uid][j], got[j], same, d[0]) is not None


def output_differs(full: Any, part: Any, rows: int, index: torch.Tensor) -> bool:
    """Whether the model's output rows (every tensor leaf with ``rows`` rows in dimension 0)
    on the second probe batch are not the full output's rows ``index``."""
    fl, pl = tree_flatten(full)[0], tree_flatten(part)[0]
    if len(fl) != len(pl):
        return True
    return any(
        rows_differ(f, p, index, 0)
        for f, p in zip(fl, pl)
        if torch.is_tensor(f) and f.dim() >= 1 and f.shape[0] == rows
    )


def mixing_problem(label: str | None, rows: int, detail: str) -> str:
    """The refusal: which layer (None: the model's output) and why, with the fix."""
    return rows_mixed_problem(
        label,
        f"rows that changed when one example was removed from the {rows} rows of the batch and "
        f"the rest reordered ({detail})",
        "batch statistics computed by hand, sorting or permuting rows, a reshape that moves "
        "the batch dimension",
        "output",
        "reordered",
    )


def rows_mixed_problem(label: str | None, got: str, causes: str, computed: str, never: str) -> str:
    """The refusal of a model whose rows mix across the batch, worded once for both probes:
    where (``label``'s input; None: the model's output), what the probe ``got``, the usual
    ``causes``, and the fix (each example's ``computed`` from that example alone; the batch
    in dimension 0, never ``never``)."""
    where = f"the input of {label}" if label is not None else "the model's output"
    return (
        f"{where} must keep each example's row computed from that example alone, got {got}: "
        f"the model mixes or moves examples across the batch ({causes}), so dpfy cannot bound "
        f"one example's contribution. Compute each example's {computed} from that example "
        f"alone: LayerNorm or GroupNorm instead of batch statistics, and keep the batch in "
        f"dimension 0, never {never}"
    )
