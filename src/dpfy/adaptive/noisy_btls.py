"""NoisyBTLS: a private backtracking (Armijo) line search along the noisy gradient (Chen & Lee;
Monir, Fauzan & Ghinita 2023, §3.1.2).

References: Chen & Lee 2020, "Stochastic adaptive line search for differentially private
optimization", as surveyed by Monir, Fauzan & Ghinita 2023, §3.1.2.

Why: an Armijo line search gives a step size that provably decreases the loss, without a tuned
learning rate. Chen & Lee run it privately with the sparse vector technique: try η_0, βη_0,
β²η_0, ... and stop at the first η whose noisy sufficient decrease
L(θ) − L(θ − η g̃) ≥ c·η·‖g̃‖² passes; if none does (η = 0), raise the gradient's budget.

dpfy's version (see :mod:`dpfy.adaptive._step_search` for the accounting and the budget):

- **A fixed number m of comparisons every step**: the search's length is data-dependent, so
  dpfy releases the losses at θ and at all m candidates η_j = η_0 β^j (j < m) every step,
  each clipped to ±R with Gaussian noise, and runs the backtracking test on these noisy values
  (post-processing). This pays for every comparison (the SVT saving is not claimed): the
  documented conservative choice, accounted exactly by dp_accounting.
- **On failure** (no candidate passes, η = 0) no step is taken and the gradient's noise is
  lowered from the next step on (σ_t = σ_0 (1 + γ)^(−r/2)), as NoisyMax's noise reduction;
  the paper's angle statistics (which of the gradient or the line-search budget to raise) and
  its clipping decrease are not built: only the gradient budget is raised.
- The Armijo test uses ‖g̃‖² of the released gradient (noisy: it over-estimates ‖∇L‖², so the
  test is stricter than the noiseless one; c = 1e-4 by default).

Releases per step: the gradient sum at σ_t = σ_0 (1 + γ)^(−r/2) (r: failed searches so far,
at most L); m + 1 loss sums (θ and θ − η_j g̃) on the same batch, each clipped to ±R at noise
multiplier σ_l = ratio·σ_0, composed with the gradient into one step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from dpfy._require import require
from dpfy.adaptive._step_search import SearchState, StepSearch
from dpfy.adaptive.base import register

__all__ = ["NoisyBTLS", "SearchState"]


@register("noisy_btls")
@dataclass(frozen=True)
class NoisyBTLS(StepSearch):
    """Private backtracking line search with m comparisons released every step (Chen & Lee).

    Needs ``make_private(loss_fn=..., target_epsilon=...)`` (or a noise multiplier) and a plain
    ``torch.optim.SGD(lr=...)``; every logical batch must be one physical batch.

    Args:
      initial: m_0, the first candidate is η_0 = lr·m_0.
      shrink: β in (0, 1), η_{j+1} = β η_j.
      comparisons: m, candidates released every step (the search never tries more).
      armijo: c, the sufficient-decrease constant.
      loss_clip, probe_noise_ratio, reduction, max_reductions: see
        :class:`dpfy.adaptive._step_search.StepSearch` (R = 3, σ_l = 4σ_0, γ = 0.1, L = 10).

    Releases per step: the gradient sum at σ_t = σ_0 (1 + γ)^(−r/2); m + 1 loss sums on the
    same batch (sensitivity R each, noise multiplier σ_l), composed into one step.
    """

    initial: float = 4.0
    shrink: float = 0.5
    comparisons: int = 4
    armijo: float = 1e-4

    def __post_init__(self) -> None:
        require(self.initial > 0, "initial", self.initial, "> 0")
        require(0 < self.shrink < 1, "shrink", self.shrink, "in (0, 1)")
        require(
            isinstance(self.comparisons, int) and self.comparisons >= 1,
            "comparisons",
            self.comparisons,
            "an integer >= 1",
        )
        require(self.armijo >= 0, "armijo", self.armijo, ">= 0")
        super().__post_init__()

    def multipliers(self) -> tuple[float, ...]:
        return (0.0,) + tuple(self.initial * self.shrink**j for j in range(self.comparisons))

    def choose(self, losses: Sequence[float], gradient_sq: float) -> int:
        """The first (largest) candidate with L̃_0 − L̃_j ≥ c·η_j·‖g̃‖², else 0 (no step)."""
        lr = self.base_lr
        assert lr is not None  # init refused an uncalibrated method
        for j, m in enumerate(self.multipliers()[1:], start=1):
            if losses[0] - losses[j] >= self.armijo * lr * m * gradient_sq:
                return j
        return 0
