"""Noise decay: σ_t falls over training by a pre-defined, data-independent rule.

References: Yu et al. 2019, as surveyed by Monir, Fauzan & Ghinita 2023, §3.1.1 and §6.1
(Table 8).

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
the accountant (``calibrate_schedule_scale(shape=...)``), in :meth:`NoiseDecay.calibrate` for
the run's facts: with ``initial`` unset, σ_0 is solved so the whole run spends the run's target
ε (rigorously, by the run's accountant; ``calibration="gdp", approximate=True`` is the explicit
opt-in to a paper's CLT calibration); with ``initial`` given and a target ε, the schedule is
stopped early at the last step within the target (review Table 8 "stopping criterion ε");
with ``initial`` and no target, it runs as given and the budget guard watches the ledger.

``dpfy.adaptive.make("noise_decay", kind="time", rate=0.5)``; ``dpfy train --method
noise_decay --method-options kind=time rate=0.5``.

Releases per step: the clipped-gradient sum, noise multiplier σ_t.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from dpfy._require import require
from dpfy.adaptive._planned import ScaledSchedule, calibrate_scaled_schedule, check_calibration
from dpfy.adaptive.base import register
from dpfy.types import RunFacts

__all__ = ["NoiseDecay", "KINDS", "PER"]

KINDS = ("constant", "time", "exponential", "step", "polynomial")
PER = ("epoch", "step")


@register("noise_decay")
@dataclass(frozen=True)
class NoiseDecay(ScaledSchedule):
    """σ_t by one of the decay rules above, stepped per epoch or per step.

    The defaults run as they are: ``polynomial`` decay with k = 1, i.e. σ falls linearly from
    σ_0 to ``final_ratio``·σ_0 = σ_0/2 over the run, whatever its length (an exponential or
    time decay with a fixed k would fall by a factor that depends on the number of epochs).
    They are a neutral starting point, not tuned on any data.

    Args:
      kind: one of ``KINDS`` (default ``"polynomial"``).
      rate: k (meaning depends on ``kind``, see the module docstring; default 1: linear);
        unused for constant.
      period: in units of ``per``; the step length (step) or the decay horizon (polynomial).
        None: 1, or for polynomial the run's last unit (σ_end reached at the end).
      final_ratio: σ_end/σ_0 for polynomial decay, in (0, 1].
      per: ``"epoch"`` (the review's unit; short ledger) or ``"step"``.
      initial: σ_0 > 0, the noise multiplier at u = 0. None: solved in ``calibrate`` so the
        run spends its target ε.
      total_steps: optimizer updates the schedule (and its budget) covers; None: the run's.
      steps_per_epoch: optimizer updates per epoch (for ``per="epoch"``); None: the run's.
      calibration: the accountant σ_0 (or the early stop) is solved against; None: the run's.
      approximate: must be True with ``calibration="gdp"`` (a paper's CLT; reproductions).

    Note:
      Calibrating per-step schedules with PLD composes one distinct event per step: slow for
      thousands of steps. Per-epoch decay keeps the ledger to one group per epoch.
    """

    kind: str = "polynomial"
    rate: float = 1.0
    period: int | None = None
    final_ratio: float = 0.5

    example_options = {"kind": "exponential", "rate": 0.3}

    def __post_init__(self) -> None:
        require(self.kind in KINDS, "kind", self.kind, f"one of {list(KINDS)}")
        if self.initial is not None:
            require(
                self.initial > 0,
                "initial",
                self.initial,
                "> 0",
                "Pass σ_0, the noise multiplier at the start of training, or leave it "
                "unset to calibrate it to the run's target ε",
            )
        if self.total_steps is not None:
            require(self.total_steps >= 1, "total_steps", self.total_steps, ">= 1")
        require(self.per in PER, "per", self.per, f"one of {list(PER)}")
        if self.steps_per_epoch is not None:
            require(self.steps_per_epoch >= 1, "steps_per_epoch", self.steps_per_epoch, ">= 1")
        if self.period is not None:
            require(self.period >= 1, "period", self.period, ">= 1 (in units of `per`)")
        if self.kind in ("time", "exponential", "polynomial"):
            require(
                self.rate > 0,
                "rate",
                self.rate,
                f"> 0 for {self.kind} decay",
                "k is the decay rate: give rate=K > 0 (dpfy train: --method-options "
                "rate=K), or kind=constant for no decay",
            )
        if self.kind == "step":
            require(
                0 < self.rate < 1,
                "rate",
                self.rate,
                "in (0, 1) for step decay",
                "k multiplies σ once every `period` units: give rate=K in (0, 1) "
                "(dpfy train: --method-options rate=K)",
            )
        if self.kind == "polynomial":
            require(
                0 < self.final_ratio <= 1,
                "final_ratio",
                self.final_ratio,
                "in (0, 1]",
                "σ_end/σ_0 must not exceed 1 (σ_end > σ_0 is growth, not decay) and must "
                "stay > 0 to keep the last steps private",
            )
        check_calibration(self.calibration, self.approximate)
        if (
            self.period is None
            and self.total_steps is not None
            and (self.per == "step" or self.steps_per_epoch is not None)
        ):
            units = self.unit(self.total_steps - 1) + 1
            object.__setattr__(
                self, "period", max(units - 1, 1) if self.kind == "polynomial" else 1
            )

    def calibrate(self, facts: RunFacts) -> "NoiseDecay":
        """σ_0 for the run's target ε (``initial`` unset), or the early stop (``initial`` and a
        target), for the run's steps and steps per epoch."""
        return calibrate_scaled_schedule(self, facts)

    def unit(self, step: int) -> int:
        """u: the schedule's time at 0-based ``step`` (epochs completed, or the step)."""
        if self.per == "step":
            return step
        require(
            self.steps_per_epoch is not None,
            "steps_per_epoch",
            None,
            "known for per='epoch'",
            "Give steps_per_epoch= or let make_private calibrate the schedule for the run",
        )
        assert self.steps_per_epoch is not None  # the require above refused None
        return step // self.steps_per_epoch

    def factor(self, u: int) -> float:
        """σ_u / σ_0 at schedule time u (independent of ``initial``)."""
        k = self.rate
        if self.kind == "constant":
            return 1.0
        if self.kind == "time":
            return 1.0 / (1.0 + k * u)
        if self.kind == "exponential":
            return math.exp(-k * u)
        assert self.period is not None  # __post_init__ fills it once total_steps is known
        if self.kind == "step":
            return k ** (u // self.period)
        end = self.final_ratio  # polynomial
        return (1.0 - end) * (1.0 - min(u, self.period) / self.period) ** k + end

    def scaled(self, scale: float) -> "NoiseDecay":
        """The same shape with σ_0 multiplied by ``scale``."""
        require(scale > 0, "scale", scale, "> 0")
        require(self.initial is not None, "initial", None, "set to be scaled")
        assert self.initial is not None  # the require above refused None
        return replace(self, initial=self.initial * scale)
