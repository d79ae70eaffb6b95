"""Noise decay: σ_t falls over training by a pre-defined, data-independent rule.

References: Yu et al. 2019 via the review digest
``shared/reference/000-review-adaptive-dpsgd.md`` §2.1.2 (paper §3.1.1) and §5.1 (Table 8).

Gradients shrink as a model converges, so the same noise hurts more late in training. Noise
decay spends little ε early (large σ) and more later (small σ). With ``u`` the schedule's time
unit (the epoch, or the step when ``per="step"``) and σ_0 = ``initial``:

- ``constant``:    σ_u = σ_0                                   (the DP-SGD baseline)
- ``time``:        σ_u = σ_0 / (1 + k·u),                       k > 0
- ``exponential``: σ_u = σ_0 · exp(−k·u),                       k > 0
- ``step``:        σ_u = σ_0 · k^⌊u / period⌋,                   0 < k < 1
- ``polynomial``:  σ_u = (σ_0 − σ_end)(1 − min(u, period)/period)^k + σ_end,  k > 0,
                   0 < σ_end ≤ σ_0 (held at σ_end once u ≥ period; k = 1 is linear decay)

The review writes ``t/period`` for the step schedule; we use ⌊u/period⌋ so it is a step
function, as its notes advise. σ here is the noise multiplier: noise std / C on the
clipped-gradient *sum*.

Every σ_u is ``initial`` times a shape that does not depend on ``initial``
(:meth:`NoiseDecay.shape`), so "spend exactly ε over the run" is one scalar search done by
the accountant: ``calibrate_schedule_scale(shape=...)`` (see :func:`dpfy.adaptive.make_schedule`).

Releases per step: the clipped-gradient sum, noise multiplier σ_t.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from dpfy._require import require
from dpfy.adaptive._planned import PlannedSchedule
from dpfy.adaptive.base import Method, register

__all__ = ["NoiseDecay", "KINDS", "PER"]

KINDS = ("constant", "time", "exponential", "step", "polynomial")
PER = ("epoch", "step")


@register("noise_decay")
@dataclass(frozen=True)
class NoiseDecay(PlannedSchedule):
    """σ_t by one of the decay rules above, stepped per epoch or per step.

    Args:
      kind: one of ``KINDS``.
      initial: σ_0 > 0, the noise multiplier at u = 0.
      total_steps: optimizer updates the run (and its budget) covers.
      rate: k (meaning depends on ``kind``, see the module docstring); unused for constant.
      period: in units of ``per``; the step length (step) or the decay horizon (polynomial).
      final: σ_end for polynomial decay, in (0, initial].
      per: ``"epoch"`` (the review's unit; short ledger) or ``"step"``.
      steps_per_epoch: optimizer updates per epoch (needed when ``per="epoch"``).

    Warnings:
      Calibrating per-step schedules with PLD composes one distinct event per step: slow for
      thousands of steps. Per-epoch decay keeps the ledger to one group per epoch.
    """

    kind: str
    initial: float
    total_steps: int
    rate: float = 0.0
    period: int = 1
    final: float = 0.0
    per: str = "epoch"
    steps_per_epoch: int = 1

    def __post_init__(self) -> None:
        require(self.kind in KINDS, "kind", self.kind, f"one of {list(KINDS)}")
        require(self.initial > 0, "initial", self.initial, "> 0",
                "Pass σ_0, the noise multiplier at the start of training")
        require(self.total_steps >= 1, "total_steps", self.total_steps, ">= 1")
        require(self.per in PER, "per", self.per, f"one of {list(PER)}")
        require(self.steps_per_epoch >= 1, "steps_per_epoch", self.steps_per_epoch, ">= 1")
        require(self.period >= 1, "period", self.period, ">= 1 (in units of `per`)")
        if self.kind in ("time", "exponential", "polynomial"):
            require(self.rate > 0, "rate", self.rate, f"> 0 for {self.kind} decay",
                    "k is the decay rate; use kind='constant' for no decay")
        if self.kind == "step":
            require(0 < self.rate < 1, "rate", self.rate, "in (0, 1) for step decay",
                    "k multiplies σ once every `period` units")
        if self.kind == "polynomial":
            require(0 < self.final <= self.initial, "final", self.final,
                    f"in (0, initial = {self.initial}] for polynomial decay",
                    "σ_end is the noise multiplier the decay ends at; it cannot exceed σ_0 "
                    "and must stay > 0 to keep the last steps private")

    @classmethod
    def from_options(cls, kind: str = "exponential", **options) -> "Method":
        """``make("noise_decay", kind=..., rate=..., ...)``: calibrated by make_private."""
        from dpfy.adaptive.factory import deferred_schedule
        return deferred_schedule("noise_decay", kind, **options)

    def unit(self, step: int) -> int:
        """u: the schedule's time at 0-based ``step`` (epochs completed, or the step)."""
        return step if self.per == "step" else step // self.steps_per_epoch

    def factor(self, u: int) -> float:
        """σ_u / σ_0 at schedule time u (independent of ``initial``)."""
        k = self.rate
        if self.kind == "constant":
            return 1.0
        if self.kind == "time":
            return 1.0 / (1.0 + k * u)
        if self.kind == "exponential":
            return math.exp(-k * u)
        if self.kind == "step":
            return k ** (u // self.period)
        end = self.final / self.initial                     # polynomial
        return (1.0 - end) * (1.0 - min(u, self.period) / self.period) ** k + end

    def noise_multiplier(self, step: int) -> float:
        self.check_step(step)
        return self.initial * self.factor(self.unit(step))

    def shape(self) -> np.ndarray:
        """σ_t / σ_0 for every step, shape (total_steps,): what calibration scales."""
        return np.array([self.factor(self.unit(t)) for t in range(self.total_steps)])

    def scaled(self, scale: float) -> "NoiseDecay":
        """The same shape with σ_0 (and σ_end) multiplied by ``scale``."""
        require(scale > 0, "scale", scale, "> 0")
        return replace(self, initial=self.initial * scale, final=self.final * scale)
