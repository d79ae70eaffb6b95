"""The released training loss's trend over probe rounds: is it rising beyond its noise?

Why: HyFreeDP's fit sees the loss along one direction within one step's reach. When the probes
are too noisy to resolve anything (small batches: at b = 128 on Fashion-MNIST the loss noise
u = σ_l·R_l/b is ≈ 16× that at b = 2048), the η rule holds whatever η the search left, and a
too-large η shows only over many steps: the loss at θ, released every round, climbs (0.6 → 1.2
over 40 rounds in docs/results/hyfree_fmnist.md) while every round's fit is "nothing seen".
This compares the mean released loss of the latest ``window`` rounds with that of the
``window`` rounds before; a rise beyond ``significance`` standard errors is a trend, not noise.
A divergence (the loss multiplying from one round to the next) is seen sooner by comparing the
last two rounds (:meth:`LossTrend.jumped`).

The standard error uses the larger of two per-round stds: the declared noise std of the
released losses (public: σ_l, R_l, b) and the spread of the released losses themselves within
the two windows (batch-to-batch sampling adds to the noise and is not declared). Everything
here is a function of released values (post-processing).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace

from dpfy._require import require

__all__ = ["LossTrend"]

MIN_SPREAD = 5      # held losses before a jump is judged


@dataclass(frozen=True)
class LossTrend:
    """The last 2·``window`` rounds' released losses at θ and their declared noise stds."""

    window: int
    losses: tuple[float, ...] = ()
    stds: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        require(isinstance(self.window, int) and self.window >= 2, "window", self.window,
                "an integer >= 2")

    def add(self, loss: float, std: float) -> "LossTrend":
        """The trend with one more round; a non-finite loss empties it."""
        if not math.isfinite(loss):
            return self.reset()
        keep = 2 * self.window
        return replace(self, losses=(self.losses + (loss,))[-keep:],
                       stds=(self.stds + (std,))[-keep:])

    def reset(self) -> "LossTrend":
        """No history: after η changed on this evidence, the windows start again."""
        return LossTrend(self.window)

    def rise(self) -> tuple[float, float]:
        """(mean of the latest window − mean of the one before, its standard error);
        (nan, inf) until 2·window rounds are held."""
        w = self.window
        if len(self.losses) < 2 * w:
            return math.nan, math.inf
        old, new = self.losses[:w], self.losses[w:]
        declared = math.sqrt(sum(s * s for s in self.stds) / len(self.stds))
        spread = math.sqrt((statistics.variance(old) + statistics.variance(new)) / 2)
        per_round = max(declared, spread)
        return statistics.fmean(new) - statistics.fmean(old), per_round * math.sqrt(2 / w)

    def jumped(self, significance: float) -> bool:
        """True when the latest released loss exceeds the one before by more than
        ``significance`` times the std of their difference: a divergence too fast for the
        windows (at b = 128 the loss went ×3 a round once the search passed η*). The per-round
        std is the larger of the declared one and the spread of the held losses before the
        latest; no verdict until ``MIN_SPREAD`` of those are held (a spread of fewer is too
        noisy to bound the undeclared batch-to-batch noise)."""
        if len(self.losses) < MIN_SPREAD + 1:
            return False
        before, now = self.losses[-2:]
        declared = math.sqrt(sum(s * s for s in self.stds[-2:]) / 2)
        spread = statistics.stdev(self.losses[:-1])
        return now - before > significance * math.sqrt(2) * max(declared, spread)

    def rising(self, significance: float) -> bool:
        """True when the latest window's mean exceeds the previous one's by more than
        ``significance`` standard errors."""
        diff, se = self.rise()
        return math.isfinite(diff) and diff > significance * se
