"""Fay et al.'s privacy–utility-ratio (PUR) schedule, data-independent variant.

References: Fay et al. 2023 (TMLR), "Adaptive hyperparameter selection for differentially
private gradient descent", as surveyed by Monir, Fauzan & Ghinita 2023, §3.1.3. Hong et al.
2022 (FAccT), the other budget allocation of that section, is not implemented: the review
gives its objective (an excess-risk upper bound under the PL condition) but not its schedule.

Fay et al. choose, at each step, the step size η and noise std that minimise the privacy cost
per unit of expected improvement. For an M-smooth objective F the descent lemma gives the
PUR-minimising choice η = 1/(2M) and a noise std proportional to ‖∇F(θ_t)‖ (data-dependent).
Their data-independent variant replaces ‖∇F(θ_t)‖ by an *upper bound* G_t that depends only on
t, so the whole σ schedule is public and is calibrated to the run's ε in advance:

- ``bound="convex"`` (F convex and M-smooth, noiseless GD at η = 1/(2M)): with D = ‖θ_0 − θ*‖,
  ‖∇F(θ_0)‖ ≤ M·D and F(θ_t) − F* ≤ D²/(2ηt) = M·D²/t, and ‖∇F‖² ≤ 2M(F − F*) gives
  ‖∇F(θ_t)‖ ≤ √2·M·D/√t. So G_u/G_0 = min(1, √(2/u)).
- ``bound="pl"`` (μ-PL and M-smooth, η = 1/(2M)): the descent lemma gives
  F(θ_{t+1}) − F* ≤ (1 − 3μ/(4M))(F(θ_t) − F*), and ‖∇F‖² ≤ 2M(F − F*), so
  G_u/G_0 = (1 − 3μ/(4M))^{u/2}.

The unit u is the epoch (``per="epoch"``, default: one pass plays the role of one GD
iteration) or the step. σ_t (noise std / C on the clipped sum) = σ_0 · G_u/G_0, and σ_0 is
solved so the run spends its target ε (the same one-scalar search as ``noise_decay``). The
step size: with ``step_size="pur"`` the inner optimizer's learning rate is scaled so that the
effective step is 1/(2M); ``"optimizer"`` keeps the optimizer's own.

The bounds hold for noiseless, unclipped gradient descent; under clipping and noise they are a
heuristic shape (as in the paper), but the privacy accounting does not depend on them: every
σ_t is public and recorded in the ledger.

The data-dependent variant (σ_t ∝ a noisy release of the gradient norm) is ``pur_data``
(``pur_data.py``); the step-size check and the η = 1/(2M) scale below are shared with it.

Releases per step: the clipped-gradient sum, noise multiplier σ_t.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from dpfy._require import require
from dpfy.adaptive._planned import ScaledSchedule, calibrate_scaled_schedule, check_calibration
from dpfy.adaptive.base import register
from dpfy.types import RunFacts, StepPlan

__all__ = ["PURSchedule", "BOUNDS", "check_step_size", "optimizer_lr", "with_pur_step"]

BOUNDS = ("convex", "pl")


@register("pur")
@dataclass(frozen=True)
class PURSchedule(ScaledSchedule):
    """Fay et al.'s data-independent PUR schedule: σ_t ∝ a gradient-norm bound, η = 1/(2M).

    Args:
      smoothness: M, the declared smoothness constant of the loss (the user's claim: for
        softmax regression on inputs of norm ≤ R, M ≤ R²/2 + 1/2 with a bias).
      bound: ``"convex"`` or ``"pl"`` (see the module docstring).
      pl_constant: μ for ``bound="pl"``, in (0, M].
      step_size: ``"pur"`` (lr scaled to give η = 1/(2M)) or ``"optimizer"``.
      per: ``"epoch"`` or ``"step"``, the unit u of the bound.
      initial: σ_0; None: solved so the run spends its target ε.
      total_steps, steps_per_epoch, calibration, approximate: as for ``noise_decay``.
    """

    smoothness: float = 1.0
    bound: str = "convex"
    pl_constant: float | None = None
    step_size: str = "pur"
    # keyword-only: it came after the shared options, which are keyword-only now (a positional
    # argument must never land in another field than it did)
    lr: float | None = field(default=None, kw_only=True)  # the inner optimizer's lr (calibrate)

    example_options = {"smoothness": 10.0}
    sets = frozenset({"noise_multiplier", "lr_scale"})

    def __post_init__(self) -> None:
        check_step_size(self.smoothness, self.step_size)
        require(self.bound in BOUNDS, "bound", self.bound, f"one of {list(BOUNDS)}")
        if self.bound == "pl":
            mu = self.pl_constant
            require(
                mu is not None and 0 < mu <= self.smoothness,
                "pl_constant",
                mu,
                f"in (0, smoothness = {self.smoothness}] for bound='pl'",
                "Declare μ of the PL condition (μ ≤ M always), or use bound='convex'",
            )
        else:
            require(
                self.pl_constant is None,
                "pl_constant",
                self.pl_constant,
                "unset for bound='convex'",
                "Drop pl_constant, or pass bound='pl'",
            )
        require(self.per in ("epoch", "step"), "per", self.per, "'epoch' or 'step'")
        if self.initial is not None:
            require(self.initial > 0, "initial", self.initial, "> 0", "Pass σ_0 or leave it unset")
        check_calibration(self.calibration, self.approximate)

    def calibrate(self, facts: RunFacts) -> "PURSchedule":
        """σ_0 for the run's target ε, and the optimizer's lr for the η = 1/(2M) scale."""
        lr = optimizer_lr(facts, self.step_size)
        return calibrate_scaled_schedule(replace(self, lr=lr), facts)

    def factor(self, u: int) -> float:
        """G_u / G_0, the gradient-norm bound at unit u relative to u = 0."""
        if self.bound == "convex":
            return 1.0 if u <= 2 else math.sqrt(2.0 / u)
        assert self.pl_constant is not None  # __post_init__ requires μ for bound='pl'
        return (1.0 - 0.75 * self.pl_constant / self.smoothness) ** (u / 2)

    def unit(self, step: int) -> int:
        return step if self.per == "step" else step // int(self.steps_per_epoch or 1)

    def plan(self, state: None, plan: StepPlan) -> StepPlan:
        return with_pur_step(super().plan(state, plan), self.smoothness, self.lr, self.step_size)


def check_step_size(smoothness: float, step_size: str) -> None:
    """Refuse a smoothness M that is not a positive finite number, or an unknown step rule."""
    require(
        isinstance(smoothness, (int, float)) and 0 < smoothness < math.inf,
        "smoothness",
        smoothness,
        "> 0 and finite",
        "Declare M, the loss's smoothness constant (e.g. R²/2 for softmax regression on "
        "inputs of norm ≤ R)",
    )
    require(step_size in ("pur", "optimizer"), "step_size", step_size, "'pur' or 'optimizer'")


def optimizer_lr(facts: RunFacts, step_size: str) -> float | None:
    """The inner optimizer's lr from the run's facts (required for ``step_size="pur"``)."""
    lr = (facts.inner_hyperparameters or {}).get("lr")
    if step_size == "pur":
        require(
            isinstance(lr, (int, float)) and lr > 0,
            "optimizer lr",
            lr,
            "a positive number for step_size='pur'",
            "Wrap an optimizer with a learning rate, or pass step_size='optimizer'",
        )
    return lr


def with_pur_step(plan: StepPlan, smoothness: float, lr: float | None, step_size: str) -> StepPlan:
    """``plan`` with the lr scale that makes the optimizer's step η = 1/(2M) (step_size="pur")."""
    if step_size == "optimizer" or lr is None:
        return plan
    return replace(plan, lr_scale=1.0 / (2.0 * smoothness * lr))
