"""Whether one example reaches other examples' rows in training mode, forward *or* backward:
the perturbation probe.

The engine clips, for each i, the gradient formed from row i of every captured layer's input
and row i of that layer's output gradient. Both must come from example i alone. The
row-identity probe (``grads/row_identity.py``) checks the inputs in ``eval()`` mode on a batch
with one row removed, which misses three ways of breaking it (reproduced, each accepted with a
sensitivity far above C): mixing that only a training forward does (a batch norm written by
hand under ``if self.training:``), mixing in the backward pass (a custom autograd Function whose
forward is the identity and whose backward centres the gradients over the batch), and a model
that cannot run on a shortened batch (attention across rows through a ``reshape``), which that
probe leaves unchecked.

The check. At the same place (the end of the first training forward on a bound private batch of
at least :data:`~dpfy.grads.row_identity.MIN_ROWS` rows, and in :func:`dpfy.validate`'s
pre-flight), the model is run twice more, *in the modes the training forward ran in*, each time
followed by a backward from the model's output:

- A: on the batch, with fixed output cotangents V (standard normal, one per output element);
- B: on the batch with row ``r`` = 0 replaced (:func:`perturb_rows`: a float row gets another
  row's values plus noise, an integer or boolean row gets another row's values), and V with its
  row ``r`` replaced too (a different loss for that example). Where the model cannot run on
  that batch because integers carry a structure (``EmbeddingBag`` offsets), B changes the
  float rows and the cotangent only.
- B': when the rows differ in their count of padding-like integer entries (≤ 0: ignored labels
  such as −100, attention-mask zeros, pad id 0; :func:`probe_rows`), B again with the row that
  has the most of them replaced by the row that has the fewest. A loss inside the model that
  divides by a count over the batch (Hugging Face's causal-LM token mean over the non-ignored
  labels) changes the other rows' output gradients only when the changed row's count changes;
  B alone misses it when rows 0 and 1 have the same count (the padded example sitting last).

Both start from the same global RNG state (forked, so the training run's stream is unchanged),
and the batch keeps its shape, so dropout masks and every other draw line up row by row. For
every captured layer call, the inputs *and* the output gradients of every row other than ``r``,
and the model's output rows other than ``r``, must be identical in A and B. A difference means
that example ``r`` reached another example's row: the calls concerned get the refusal (raised
when their gradient is used), as the row-identity probe's do.

Why bit-identical. A and B run the same operations on tensors of the same shapes from the same
RNG state, so a row-wise model computes every row other than ``r`` with the same arithmetic in
the same order: the rows are equal bit for bit on a deterministic kernel. A tolerance would
only let a small leak through (a mixing weight of 1e-4 on each of 255 other rows adds
2.55e-2·C). Some kernels are not deterministic run to run (atomic additions on a GPU): when A
and B differ, A is run a third time, and only if A and its repetition A' differ too are A and
B compared again, tensor by tensor: bit for bit where A' repeated A exactly, else within
:data:`JITTER_FACTOR` times the largest |A' - A| of that tensor. The jitter the kernels
showed is the yardstick, not a tolerance of the arithmetic (a TF32 tolerance of 1.6 % of the
tensor's scale let a batch mean over 256 rows, 1.9·C of leak, through).

When the probe cannot run (the forward or backward raises on the perturbed batch): the model is
refused, naming the error, unless the user declared it row-wise
(``make_private(..., declare_row_wise=True)``): then a warning says that it was not checked.
What it cannot see: a loss computed outside the model (the backward starts from the model's
output with fixed cotangents: mixing in the loss remains the user's contract), mixing that the
perturbation of this one row on this one batch does not trigger (data-dependent control flow),
and randomness that depends on the data. State outside tensors that a forward changes (a Python
counter) is changed by the probe's two forwards too.

Cost: two training forwards and two backwards (without parameter gradients), once per engine;
one more pair when the rows' padding counts differ (B'), and one more when rows differ.
Measured in ``docs/guide/per_example_contract.md``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from dpfy.errors import PrivacyRefusal
from dpfy.grads.held import autograd_requires_grad
from dpfy.grads.row_identity import (
    ProbedForward,
    RowProbe,
    forked_rng,
    reseed,
    rows_mixed_problem,
)

__all__ = [
    "PerturbProbe",
    "perturb_rows",
    "find_cross_row",
    "PERTURBED_ROW",
    "probe_rows",
    "cross_row_problem",
    "not_checked_problem",
]

PERTURBED_ROW = 0  # the example whose input and loss the probe changes


@dataclass
class PerturbProbe(RowProbe):
    """A :class:`RowProbe` that also keeps each call's output gradients: ``grads[(layer id,
    call)][k]`` for the call's k-th floating output leaf (None until its gradient arrives)."""

    grads: dict[tuple[int, int], list[torch.Tensor | None]] = field(default_factory=dict)

    def keeper(self, layer_id: int, k: int, n: int) -> Callable[[torch.Tensor], None]:
        """The hook that keeps output leaf ``k`` (of ``n``) of the call just recorded."""
        key = (layer_id, len(self.inputs[layer_id]) - 1)
        slots = self.grads.setdefault(key, [None] * n)

        def keep(grad: torch.Tensor) -> None:
            kept = slots[k]
            slots[k] = grad.detach() if kept is None else kept + grad.detach()

        return keep


def perturb_rows(
    tree: Any,
    rows: int,
    row: int,
    generator: torch.Generator,
    integers: bool = True,
    donor: int | None = None,
) -> Any:
    """``tree`` with row ``row`` of every tensor of ``rows`` rows (dimension 0) replaced: by row
    ``donor``'s values (default: the next row), plus standard normal noise at the tensor's scale
    for a float tensor (so that the row changes even where two rows are equal).
    ``integers=False`` leaves integer and boolean tensors as they are (ids, masks, offsets)."""
    donor = (row + 1) % rows if donor is None else donor

    def change(t: Any) -> Any:
        if not torch.is_tensor(t) or t.dim() == 0 or t.shape[0] != rows:
            return t
        if not integers and not t.is_floating_point():
            return t
        out = t.detach().clone()
        out[row] = out[donor]
        if out.is_floating_point():
            finite = out[torch.isfinite(out)]
            scale = float(finite.float().std()) if finite.numel() > 1 else 1.0
            noise = torch.randn(t.shape[1:], generator=generator, device="cpu").to(
                out
            )  # same draw on every device
            out[row] += noise * (scale if scale > 0 else 1.0)
        return out.requires_grad_(t.requires_grad) if t.is_leaf and t.requires_grad else out

    leaves, spec = tree_flatten(tree)
    return tree_unflatten([change(t) for t in leaves], spec)


def probe_rows(tree: Any, rows: int) -> list[tuple[int, int]]:
    """The (changed row, donor row) pairs the probe runs B with: (0, 1) always, and, when the
    rows' counts of padding-like integer entries (≤ 0: ignored labels such as −100, mask zeros,
    pad id 0) differ, the row with the most of them (the last such) given the values of the row
    with the fewest, so that a divisor counted over the batch changes wherever that row sits."""
    pairs = [(PERTURBED_ROW, (PERTURBED_ROW + 1) % rows)]
    ints = [
        t
        for t in tree_flatten(tree)[0]
        if torch.is_tensor(t)
        and t.dim() >= 2
        and t.shape[0] == rows
        and not t.is_floating_point()
        and not t.is_complex()
    ]
    if not ints or rows < 2 or any(t.is_meta for t in ints):  # meta: no values to count
        return pairs
    zero = torch.zeros(rows, device="cpu")  # explicit: torch's default device may be another
    counts = sum(((t <= 0).reshape(rows, -1).sum(1).cpu() for t in ints), zero)
    if bool((counts == counts[0]).all()):
        return pairs
    most = int(rows - 1 - torch.argmax(counts.flip(0)))  # the last row with the most
    fewest = int(torch.argmin(counts))
    if (most, fewest) != pairs[0]:
        pairs.append((most, fewest))
    return pairs


def find_cross_row(
    probed: ProbedForward, anchor: torch.Tensor, declared: bool = False
) -> tuple[str, list[Any]] | None:
    """The perturbation check of one training forward (see the module docstring).

    ``probed`` is the forward (:class:`dpfy.grads.row_identity.ProbedForward`); ``anchor`` is
    the capture's leaf that its taps hang on (the backward is taken with respect to it and to
    every leaf that requires a gradient, so that no parameter's ``.grad`` is written);
    ``declared``: the user declared the model row-wise (a probe that cannot run then warns
    instead of refusing).

    Returns:
      None when no other row changed, else the refusal and the calls it belongs to.
    """
    root_call, rows, layers, device = probed.root_call, probed.rows, probed.layers, probed.device
    shared = probed.shared()
    # autograd's own flag: a parameter the private step trains is held (its requires_grad reads
    # True for user code, grads/held.py) and must not be differentiated here
    params: list[torch.Tensor] = [p for p in probed.model.parameters() if autograd_requires_grad(p)]

    def run(call: tuple[tuple, dict], change_row: int | None) -> tuple[PerturbProbe, Any]:
        # the leaves of *this* call: a perturbed input that requires grad (a pipeline stage's
        # received activations) is a new leaf, and the hooks on its path fire only if it is
        # among the tensors differentiated
        leaves = params + [
            t
            for t in tree_flatten(call)[0]
            if torch.is_tensor(t) and autograd_requires_grad(t) and t.is_leaf
        ]
        probe = PerturbProbe(rows, shared=shared)
        with forked_rng(device), torch.enable_grad():
            reseed(0)
            out = probed.rerun(probe, *call)
            outs = [
                t
                for t in tree_flatten(out)[0]
                if torch.is_tensor(t) and t.is_floating_point() and t.requires_grad
            ]
            cot = _cotangents(outs, rows, change_row)
            if outs:
                torch.autograd.grad(outs, [anchor, *leaves], cot, allow_unused=True)
        return probe, _detached(out)

    def perturbed(row: int, donor: int) -> tuple[PerturbProbe, Any]:
        try:
            changed = perturb_rows(
                root_call, rows, row, torch.Generator().manual_seed(0), True, donor
            )
            return run(changed, row)
        except PrivacyRefusal:
            raise
        except Exception:  # noqa: BLE001 - integers with a structure (EmbeddingBag offsets):
            changed = perturb_rows(  # change floats and the loss only
                root_call, rows, row, torch.Generator().manual_seed(0), False, donor
            )
            return run(changed, row)

    try:
        a, out_a = run(root_call, None)
        runs = [(row, *perturbed(row, donor)) for row, donor in probe_rows(root_call, rows)]
    except PrivacyRefusal:
        raise
    except Exception as e:  # noqa: BLE001 - a model the probe cannot run: refused or declared
        problem = not_checked_problem(
            f"{type(e).__name__}: {str(e).splitlines()[0]}" if str(e) else type(e).__name__
        )
        if declared:
            warnings.warn(
                f"{problem}; declared row-wise by the user (declare_row_wise=True), "
                f"so it was not refused",
                stacklevel=2,
            )
            return None
        return problem, probed.calls()

    def dims(uid: int, j: int) -> tuple[Any, int | None] | None:
        real = probed.to_check(uid, j)
        if real is None:
            return None
        grad_dim = 0 if (layers[uid].rule is None or real.shared) else real.batch_dim
        return real.row_dims(layers[uid]), grad_dim

    found: list[tuple[int | None, int, str]] = []
    again: tuple[PerturbProbe, Any] | None = None
    for row, b, out_b in runs:
        found = _differences(a, out_a, b, out_b, rows, row, dims, None)
        if found:
            again = again or run(root_call, None)
            if _differences(a, out_a, *again, rows, row, dims, None):  # not deterministic
                # judged against the run-to-run jitter A' - A that the kernels showed on the
                # same input, never against a tolerance of the arithmetic: B's other rows
                # had the same inputs, so they may differ from A only as much as A' does
                found = _differences(a, out_a, b, out_b, rows, row, dims, again)
        if found:
            break
    if not found:
        return None
    uid, j, what = found[0]
    where = layers[uid].label if uid is not None else None
    problem = cross_row_problem(where, rows, what)
    targets = (
        probed.calls()
        if uid is None
        else [probed.now[lid][k] for lid, k, _ in found if lid is not None]
    )
    return problem, targets


def cross_row_problem(label: str | None, rows: int, detail: str) -> str:
    """The refusal: which layer (None: the model's output), what changed, and the fix."""
    return rows_mixed_problem(
        label,
        f"other examples' rows that changed when one example's input and loss were changed, "
        f"in training mode, among the {rows} rows of the batch ({detail})",
        "batch statistics, in training mode only too; a custom autograd Function mixing "
        "gradients; rows reshaped into a sequence that attention or a layer mixes; a loss "
        "computed inside the model that divides by a count over the batch, such as a token "
        "mean over padded labels: sum per-example losses instead",
        "output and gradient",
        "reordered or mixed",
    )


def not_checked_problem(error: str) -> str:
    """The refusal of a model the perturbation probe cannot run.

    Reentrant activation checkpointing (``torch.utils.checkpoint(..., use_reentrant=True)``,
    Hugging Face's default for ``gradient_checkpointing_enable()``) cannot be differentiated by
    the probe's ``torch.autograd.grad``: the fix is the non-reentrant variant, named first.
    """
    if "use_reentrant" in error:
        return (
            f"activation checkpointing must be non-reentrant (use_reentrant=False) for dpfy "
            f"to check that each example's rows come from that example alone, got the "
            f"per-example probe failing ({error}). Use "
            f"model.gradient_checkpointing_enable(gradient_checkpointing_kwargs="
            f"{{'use_reentrant': False}}) (or torch.utils.checkpoint(..., "
            f"use_reentrant=False))"
        )
    return (
        f"the model must let dpfy check that each example's rows come from that example "
        f"alone, got the per-example probe failing on the batch with one example changed "
        f"({error}), so the model is not checked. Make the forward run on any batch of the "
        f"same shape, or, if every row of every layer's input and gradient depends only on "
        f"its own example, declare it: make_private(..., declare_row_wise=True)"
    )


def _cotangents(outs: list[torch.Tensor], rows: int, change_row: int | None) -> list[torch.Tensor]:
    """Fixed standard normal cotangents for the output leaves; row ``change_row``'s (None:
    none) are drawn afresh (that example's loss changes)."""
    gen = torch.Generator().manual_seed(1)  # on the CPU: the same cotangents on every device
    cot = [
        torch.randn(t.shape, generator=gen, dtype=torch.float64, device="cpu").to(t) for t in outs
    ]
    if change_row is not None:
        for c in cot:
            if c.dim() >= 1 and c.shape[0] == rows:
                c[change_row] = torch.randn(
                    c.shape[1:], generator=gen, dtype=torch.float64, device="cpu"
                ).to(c)
    return cot


def _detached(out: Any) -> Any:
    leaves, spec = tree_flatten(out)
    return tree_unflatten([t.detach() if torch.is_tensor(t) else t for t in leaves], spec)


def _others(t: torch.Tensor, dim: int, rows: int, row: int) -> torch.Tensor | None:
    """``t``'s rows other than the perturbed ``row`` along ``dim`` (None: no such dimension)."""
    if t.dim() <= dim or t.shape[dim] != rows:
        return None
    keep = torch.tensor([i for i in range(rows) if i != row], device=t.device)
    return t.index_select(dim, keep)


JITTER_FACTOR = 16.0
"""How far beyond the run-to-run jitter another row may move when one example changes.

With non-deterministic kernels (atomics, a cuDNN backward algorithm) two runs on the same input
differ, A' - A; the rows other than the changed one had the same inputs in B, so B - A there is
another draw of the same jitter. Its largest element over a tensor can exceed the first draw's
by a small factor (both are maxima of many similar roundings); 16 leaves room for that, while a
batch statistic moves every other row by about ‖change‖/B, orders of magnitude above one-ulp
jitter for any batch a step uses. A tensor that repeated bit for bit is still compared bit for
bit."""


def _differs(x: Any, y: Any, dim: int | None, rows: int, row: int, ref: Any) -> bool:
    """Whether tensors ``x`` (run A) and ``y`` (run B) differ outside the perturbed ``row`` along
    ``dim`` (None: everywhere): bit for bit when ``ref`` is None or when ``ref`` (the repeat A'
    of run A) equals ``x`` bit for bit, else beyond :data:`JITTER_FACTOR` times the largest
    |A' - A| of this tensor (plus a few float32 ulps of its scale)."""
    if not torch.is_tensor(x) or not torch.is_tensor(y):
        return torch.is_tensor(x) != torch.is_tensor(y)
    if x.shape != y.shape or x.dtype != y.dtype:
        return True
    comparable = torch.is_tensor(ref) and ref.shape == x.shape and ref.dtype == x.dtype
    if dim is not None and _others(x, dim, rows, row) is not None:  # else: it must not change
        x, y = _others(x, dim, rows, row), _others(y, dim, rows, row)
        ref = _others(ref, dim, rows, row) if comparable else None
    if not comparable or torch.equal(_bits(x), _bits(ref)) or not x.is_floating_point():
        return not torch.equal(_bits(x), _bits(y))
    wide = torch.promote_types(x.dtype, torch.float32)
    x, y, ref = x.detach().to(wide), y.detach().to(wide), ref.detach().to(wide)
    jitter = float((ref - x).abs().max())
    floor = 4 * torch.finfo(torch.float32).eps * float(x.abs().max())
    return float((y - x).abs().max()) > JITTER_FACTOR * jitter + floor


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().contiguous()
    return t.reshape(-1).view(torch.uint8) if t.numel() and t.dtype != torch.bool else t


def _input_differs(x: Any, y: Any, dims: Any, rows: int, row: int, ref: Any) -> str | None:
    """What differs between one call's inputs in A and B outside ``row`` (None: nothing);
    ``ref``: the same call's inputs in the repeat A' (None: compare bit for bit)."""
    if not isinstance(dims, tuple):
        return "its rows" if _differs(x, y, dims, rows, row, ref) else None
    (xa, xk), (ya, yk) = x, y
    if len(xa) != len(ya) or set(xk) != set(yk):
        return "its arguments"
    ra, rk = ref if ref is not None else ((None,) * len(xa), {})
    named = [
        *((f"argument {i}", xa[i], ya[i], _at(ra, i), d) for i, d in enumerate(dims[0])),
        *((f"keyword argument {k!r}", xk[k], yk[k], rk.get(k), dims[1].get(k)) for k in xk),
    ]
    for name, f, p, r, d in named:
        if _differs(f, p, d, rows, row, r):
            return f"its {name}"
    return None


def _at(seq: Any, i: int) -> Any:
    return seq[i] if i < len(seq) else None


def _differences(
    a: PerturbProbe,
    out_a: Any,
    b: PerturbProbe,
    out_b: Any,
    rows: int,
    row: int,
    dims: Callable[[int, int], tuple[Any, int | None] | None],
    again: tuple[PerturbProbe, Any] | None,
) -> list[tuple[int | None, int, str]]:
    """The calls (layer id, call, what) whose rows other than ``row`` (the one B changed)
    differ between A and B, in call order; (None, 0, what) for the model's output. ``again``:
    the repeat A' of run A, whose jitter bounds the comparison (None: bit for bit)."""
    out: list[tuple[int | None, int, str]] = []
    rep = again[0] if again is not None else None
    for uid, j in a.order:
        d = dims(uid, j)
        if d is None:
            continue
        got = b.inputs.get(uid, [])
        if j >= len(got):
            out.append(
                (
                    uid,
                    j,
                    f"called {len(a.inputs[uid])} time(s) on the batch and "
                    f"{len(got)} with one example changed",
                )
            )
            continue
        ref = _at(rep.inputs.get(uid, []), j) if rep is not None else None
        what = _input_differs(a.inputs[uid][j], got[j], d[0], rows, row, ref)
        if what is None:
            ga, gb = a.grads.get((uid, j), []), b.grads.get((uid, j), [])
            gr = rep.grads.get((uid, j), []) if rep is not None else []
            if len(ga) != len(gb) or any(
                _differs(x, y, d[1], rows, row, _at(gr, k))
                for k, (x, y) in enumerate(zip(ga, gb))
                if x is not None or y is not None
            ):
                what = "its output gradient, in the backward pass"
        if what is not None:
            out.append((uid, j, what))
    la, lb = tree_flatten(out_a)[0], tree_flatten(out_b)[0]
    lr = tree_flatten(again[1])[0] if again is not None else []
    if len(la) != len(lb) or any(
        _differs(x, y, 0, rows, row, _at(lr, k))
        for k, (x, y) in enumerate(zip(la, lb))
        if torch.is_tensor(x) and x.dim() >= 1 and x.shape[0] == rows
    ):
        out.append((None, 0, "its rows"))
    return out
