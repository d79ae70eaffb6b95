"""NoisyMax step-size selection with adaptive noise reduction (Lee & Kifer 2018).

References: Lee & Kifer 2018, "Concentrated differentially private gradient descent with adaptive
per-iteration privacy budget"; Monir, Fauzan & Ghinita 2023, §3.1.2.

Why: a fixed learning rate is either too small early or too large late, and tuning it on
private data costs privacy. Each step, NoisyMax evaluates the batch loss at a few step sizes
along the step's own noisy gradient g̃, Φ = {0, lr·m_1, ..., lr·m_{k−1}}, and takes the one with
the smallest *privatized* loss; if the winner is η = 0 (no candidate improves on the current
point) the gradient was too noisy to give a descent direction, so no step is taken and the
gradient's noise is lowered from the next step on (adaptive noise reduction).

dpfy's version (see :mod:`dpfy.adaptive._step_search` for the accounting and the budget):

- **Gaussian noisy max on the same batch** instead of the paper's Laplace report-noisy-max:
  the k candidates' loss sums (clipped to ±R) are released with Gaussian noise (the vector has
  L2 sensitivity √k·R) and the argmin of the noisy vector is post-processing. The ledger
  composes them with the gradient into one subsampled Gaussian step.
- **Noise reduction on the next batch** (σ_t = σ_0 (1 + γ)^(−r/2)) instead of re-measuring and
  averaging on the same full batch; the run is calibrated to its worst case (a reduction at
  every step until the cap L), so its ε never exceeds the target.
- Default candidates m = (0, 0.25, 0.5, 1, 2, 4) × the SGD learning rate.

Releases per step: the gradient sum at σ_t = σ_0 (1 + γ)^(−r/2) (r: no-progress steps so far,
at most L); k candidate mean-loss sums on the same batch, each clipped to ±R at noise multiplier
σ_l = ratio·σ_0, composed with the gradient into one step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from dpfy._require import require
from dpfy.adaptive._step_search import SearchState, StepSearch
from dpfy.adaptive.base import register

__all__ = ["NoisyMax", "SearchState"]


@register("noisy_max")
@dataclass(frozen=True)
class NoisyMax(StepSearch):
    """NoisyMax step-size selection with adaptive noise reduction (Lee & Kifer).

    Needs ``make_private(loss_fn=..., target_epsilon=...)`` (or a noise multiplier) and a plain
    ``torch.optim.SGD(lr=...)``; every logical batch must be one physical batch.

    Args:
      step_multipliers: m_1 < ... (all > 0): candidate step sizes lr·m_j; 0 is always added
        first (the current point).
      loss_clip, probe_noise_ratio, reduction, max_reductions: see
        :class:`dpfy.adaptive._step_search.StepSearch` (R = 3, σ_l = 4σ_0, γ = 0.1, L = 10).

    Releases per step: the gradient sum at σ_t = σ_0 (1 + γ)^(−r/2); the k candidate loss sums
    on the same batch (sensitivity R each, noise multiplier σ_l), composed into one step.
    """

    step_multipliers: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 4.0)

    def __post_init__(self) -> None:
        require(
            len(self.step_multipliers) >= 1 and all(m > 0 for m in self.step_multipliers),
            "step_multipliers",
            self.step_multipliers,
            "at least one, each > 0",
            "0 (no step) is always a candidate; list the others",
        )
        object.__setattr__(self, "step_multipliers", tuple(float(m) for m in self.step_multipliers))
        super().__post_init__()

    def multipliers(self) -> tuple[float, ...]:
        return (0.0,) + self.step_multipliers

    def choose(self, losses: Sequence[float], gradient_sq: float) -> int:
        """The argmin of the noisy mean losses (report-noisy-max on −L̃); ties: the smaller η."""
        return min(range(len(losses)), key=lambda j: (losses[j], j))
