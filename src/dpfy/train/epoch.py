"""One epoch of private training: the loop a user would write around the private optimizer.

It is the one training loop of dpfy: ``dpfy train`` and the paper reproductions
(``dpfy experiment``) both run their epochs through :func:`run_epoch`.

The train loss and accuracy it returns are computed on raw training examples: non-private
diagnostics for the person training, never fed back into training.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from dpfy.train.device import model_device

__all__ = ["EpochStats", "run_epoch", "EPS_UPDATES_PER_EPOCH"]

# How often per epoch the progress bar recomputes ε (a PLD accountant call costs ~0.1-0.2 s);
# the end-of-epoch value comes from the trainer's metrics.
EPS_UPDATES_PER_EPOCH = 2


@dataclass(frozen=True)
class EpochStats:
    """Mean training loss and accuracy over the examples seen this epoch (non-private)."""

    loss: float
    acc: float
    examples: int


def run_epoch(
    private, *, bar=None, delta: float, on_step: Callable[[Any], None] | None = None
) -> EpochStats:
    """One pass of ``private.loader`` (Poisson batches), one private step per logical batch.

    Args:
      private: a :class:`dpfy.train.private.PrivateRun`.
      bar: a tqdm-like progress bar, advanced per batch and shown ε every half epoch.
      delta: δ of the ε the bar shows.
      on_step: called with the optimizer after every ``optimizer.step()`` (the reproductions'
        per-step trace reads ``optimizer.last_step_info`` there). It must not feed anything
        back into training: ``last_step_info`` holds non-private debug statistics.
    """
    model, optimizer = private.model, private.optimizer
    device = model_device(model)  # each batch moves there once (a no-op for a held dataset)
    model.train()
    total_loss, correct, seen = 0.0, 0, 0
    per_epoch = private.steps_per_epoch
    every = max(1, -(-per_epoch // EPS_UPDATES_PER_EPOCH))  # ceil
    for x, y in private.loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        logits = model(x)  # (B, classes)
        # mean over the physical batch (the engine's loss_reduction="mean"); a Poisson batch
        # can be empty, and its step still happens (noise only), so keep the graph without NaN
        loss = nn.functional.cross_entropy(logits, y) if len(y) else logits.sum()
        loss.backward()
        optimizer.step()
        if on_step is not None:
            on_step(optimizer)
        with torch.no_grad():  # non-private diagnostics
            total_loss += float(loss) * len(y)
            correct += int((logits.argmax(1) == y).sum())
            seen += len(y)
        if bar is not None:
            bar.update(1)
            step = optimizer.step_count
            if step % per_epoch % every == 0 and step % per_epoch != 0:
                bar.set_postfix_str(
                    f"ε={optimizer.epsilon(delta, approximate=True):.3f}", refresh=False
                )
    return EpochStats(loss=total_loss / max(seen, 1), acc=correct / max(seen, 1), examples=seen)
