"""The step plan: everything fixed before a step, from public or already-privatized values.

Step 1 of the private step (docs/architecture.md). Schedules and adaptive controllers produce
plans; the engine executes them and
records the releases they imply in the ledger.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dpfy._require import require

__all__ = ["StepPlan", "PLAN_FIELDS"]


@dataclass(frozen=True)
class StepPlan:
    """What step ``step`` will do.

    Args:
      step: 0-based optimizer-update (logical batch) index.
      sample_rate: q_t, a fact of the sampler (read-only for controllers).
      noise_multiplier: σ_t on the gradient sum, relative to the sum's sensitivity.
      clip: C_t, a scalar or one threshold per parameter group (per-layer clipping).
      lr_scale: multiplies the optimizer's learning rate for this step.
    """

    step: int
    sample_rate: float
    noise_multiplier: float
    clip: float | torch.Tensor
    lr_scale: float = 1.0

    def __post_init__(self) -> None:
        require(self.step >= 0, "step", self.step, ">= 0")
        require(0 < self.sample_rate <= 1, "sample_rate", self.sample_rate, "in (0, 1]")
        require(self.noise_multiplier >= 0, "noise_multiplier", self.noise_multiplier, ">= 0")
        require(self.lr_scale > 0, "lr_scale", self.lr_scale, "> 0")


# The plan fields a method may write (it declares which in ``Method.sets``); q is the sampler's.
PLAN_FIELDS = ("noise_multiplier", "clip", "lr_scale")
