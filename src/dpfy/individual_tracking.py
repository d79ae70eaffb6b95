"""``make_private(individual_accounting=K)``: record every example's clipped norm during training.

:class:`~dpfy.norm_tracker.NormTracker` needs a call before every optimizer step; this module
attaches one to the private optimizer so that the user's loop (and ``dpfy train``) need not
change. Before the first physical batch of logical steps 0, K, 2K, … the tracker computes every
training example's gradient norm on a deep copy of the model (eval mode), divides it by the
clipping threshold C and caps it at 1: ρ_i = ‖clip(g_i)‖ / C. ``dpfy account --individual RUN``
composes them into per-example ε_i (:mod:`dpfy.privacy.per_example_accounting`).

Privacy: the recorded norms and losses are functions of the private examples, computed outside
the mechanism and never noised. They are an analysis for the data holder only: they are never
read by training (the copy's gradients feed nothing; the step, its noise and its ledger are
those of the run without tracking), they are written only to the run directory
(``per_example_norms.npz``, by :func:`save_norms`), and they must never be part of anything
released (the model and the run's single ε are the release).
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn
from torch.func import functional_call
from torch.utils.data import Dataset, TensorDataset

from dpfy._require import require
from dpfy.norm_tracker import NormTracker

__all__ = ["NORMS_FILE", "attach_norm_tracker", "save_norms"]

NORMS_FILE = "per_example_norms.npz"

BatchLoss = Callable[[nn.Module, Any], torch.Tensor]


class _Bound(nn.Module):
    """``loss_fn(model, (x, y))`` as a module of (x, y), so ``functional_call`` can swap in
    its parameters; its output is the summed loss of the (one-example) batch."""

    def __init__(self, model: nn.Module, loss_fn: BatchLoss) -> None:
        super().__init__()
        self.m, self.loss_fn = model, loss_fn

    def forward(self, xy: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return self.loss_fn(self.m, xy).sum()


class _BatchLossTracker(NormTracker):
    """A :class:`NormTracker` whose loss is make_private's ``loss_fn(model, batch)``."""

    def _loss_one(
        self, model: nn.Module, state: tuple[dict, dict], x: torch.Tensor, y: torch.Tensor
    ) -> torch.Tensor:
        return functional_call(model, state, ((x.unsqueeze(0), y.unsqueeze(0)),))


def _features_and_labels(data: Dataset) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole training set as (features, labels): every example is tracked."""
    if isinstance(data, TensorDataset) and len(data.tensors) == 2:
        return data.tensors[0], data.tensors[1]
    rows = [data[i] for i in range(len(data))]  # type: ignore[arg-type]
    require(
        all(isinstance(r, (tuple, list)) and len(r) == 2 for r in rows[:1]),
        "the training set's examples",
        type(rows[0]).__name__ if rows else "none",
        "(features, label) pairs for individual_accounting",
        "Pass a dataset of (x, y) pairs, or record the norms with NormTracker yourself",
    )
    return torch.stack([torch.as_tensor(r[0]) for r in rows]), torch.stack(
        [torch.as_tensor(r[1]) for r in rows]
    )


def attach_norm_tracker(
    optimizer: Any,
    model: nn.Module,
    data: Dataset,
    *,
    refresh_every: int,
    loss_fn: BatchLoss | None,
    max_grad_norm: Any,
    clipping: str,
    augmult: int,
    user_level: bool,
) -> NormTracker:
    """Attach a tracker refreshing every ``refresh_every`` logical steps to ``optimizer``
    (``optimizer.norm_tracker``); refuses what the per-example accounting cannot describe."""
    require(
        isinstance(refresh_every, int)
        and not isinstance(refresh_every, bool)
        and refresh_every >= 1,
        "individual_accounting",
        refresh_every,
        "an integer K >= 1 (refresh every K steps)",
    )
    require(
        loss_fn is not None,
        "loss_fn",
        None,
        "given with individual_accounting",
        "Pass loss_fn=fn(model, batch) -> per-example losses, the loss you train with",
    )
    require(
        clipping == "flat" and isinstance(max_grad_norm, (int, float)),
        "clipping",
        clipping,
        "'flat' with one max_grad_norm for individual_accounting",
        "Per-layer or group thresholds have no single ρ_i = ‖clip(g_i)‖ / C; use flat clipping",
    )
    require(
        augmult == 1,
        "augmult",
        augmult,
        "1 with individual_accounting",
        "The clipped unit is the mean over augmentations, which the tracker does not see",
    )
    require(
        not user_level,
        "user_ids",
        "given",
        "None with individual_accounting",
        "Per-example accounting is example-level; drop user_ids",
    )
    assert loss_fn is not None
    features, labels = _features_and_labels(data)
    tracker = _BatchLossTracker(
        _Bound(model, loss_fn),
        _unused_loss,
        features,
        labels,
        clip=float(max_grad_norm),
        refresh_every=refresh_every,
    )
    step = optimizer.step  # an instance wrapper, as torch's LR schedulers wrap step

    @functools.wraps(step)
    def tracked_step(*args: Any, **kwargs: Any) -> Any:
        # once per logical step, before its first physical batch is taken (the model is the
        # one of that step); a refused step taken again is not counted twice
        if tracker.step == optimizer.step_count:
            tracker.before_step()
        return step(*args, **kwargs)

    optimizer.step = tracked_step
    optimizer.norm_tracker = tracker
    return tracker


def _unused_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    raise AssertionError("_BatchLossTracker computes its loss with loss_fn(model, batch)")


def save_norms(optimizer: Any, run_dir: str | Path) -> Path | None:
    """Write the attached tracker's norms to ``run_dir/per_example_norms.npz`` (private data:
    only into the run directory, for the data holder); None without a tracker. Rows are cut
    to the ⌈T/K⌉ refreshes of the ledger's T steps (a refused last step recorded none)."""
    tracker: NormTracker | None = getattr(optimizer, "norm_tracker", None)
    if tracker is None:
        return None
    steps = optimizer.ledger.num_steps
    rows = math.ceil(steps / tracker.refresh_every)
    tracker.ratios, tracker.losses = tracker.ratios[:rows], tracker.losses[:rows]
    tracker.step = steps
    path = Path(run_dir) / NORMS_FILE
    tracker.save(path)
    return path
