"""Validation-plateau noise decay: multiply σ by k when a PUBLIC validation metric stalls.

References: Yu et al. 2019 via ``shared/reference/000-review-adaptive-dpsgd.md`` §2.1.1 (paper
§3.1.1), with the digest's erratum 2 (§7) applied.

Rule, evaluated each time the trainer feeds a validation result (a "validation epoch" e):

    S̄_e = mean of the last ``window`` metrics (S_0 = 0 before any evaluation)
    σ_{e+1} = max(k·σ_e, σ_min)   if S̄_e − S̄_{e−1} ≤ δ_val
    σ_{e+1} = σ_e                 otherwise

The moving average keeps noise in the metric from triggering decays, each of which costs
budget.

Privacy: the metric MUST come from a public validation set (data that is not part of the
private training set). Then the decisions are post-processing of public data and cost nothing,
but the ledger still depends on *when* decays happen, so a total ε cannot be calibrated in
advance: :meth:`PlateauNoiseDecay.calibrate_to_epsilon` raises and names the budget guard. Use
``make_private(..., target_epsilon=...)``'s budget guard (it stops training when the ledger's ε
would exceed the target) or the data-independent bound :meth:`worst_case_ledger` (every step
at σ_min). A metric computed on private data would be an unaccounted release: do not.

How the trainer drives it (the method keeps no hidden state, R4/R5)::

    state = schedule.init()
    for epoch in range(epochs):
        for batch in loader:
            plan = schedule.plan(state, base_plan)           # σ from the state
            ...                                               # the engine's private step
        state = schedule.observe(state, val_metric=accuracy(model, public_val_loader))

With ``make_private(..., method=plateau)`` the private optimizer holds the state as
``optimizer.method_state``; after each public evaluation the trainer calls::

    optimizer.observe(val_metric=acc)

(the state is checkpointed with the optimizer; ``dpfy train --method plateau`` does this each
epoch once ``--public-validation test`` declares the split public). Pass ``target_epsilon``/``target_delta`` (or
``epsilon_cap``) to ``make_private`` so the budget guard stops the run at the target.

Releases per step: the clipped-gradient sum, noise multiplier σ_e. The validation metric is
public (not a release).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from dpfy._require import require
from dpfy.adaptive.base import AdaptiveMethod, Needs, register
from dpfy.types.plan import StepPlan
from dpfy.privacy.ledger import Ledger, Sampling

__all__ = ["PlateauNoiseDecay", "PlateauState"]


@dataclass(frozen=True)
class PlateauState:
    """σ now and the public validation metrics seen so far (oldest first)."""

    noise_multiplier: float
    metrics: tuple[float, ...] = ()
    decays: int = 0


@register("plateau")
@dataclass(frozen=True)
class PlateauNoiseDecay(AdaptiveMethod[PlateauState]):
    """Noise decay triggered by a plateau of a public validation metric (higher = better).

    Args:
      initial: σ_0 > 0.
      factor: k in (0, 1), the decay applied at a plateau.
      threshold: δ_val ≥ 0; a moving-average gain ≤ δ_val is a plateau.
      min_noise_multiplier: σ_min in (0, initial]; the floor keeps every step private and
        bounds the worst case.
      window: moving-average window (number of evaluations), ≥ 1.
      total_steps: the most optimizer updates the run may make (for the engine's budget guard).
    """

    initial: float
    factor: float
    threshold: float
    min_noise_multiplier: float
    total_steps: int
    window: int = 1

    def __post_init__(self) -> None:
        require(self.initial > 0, "initial", self.initial, "> 0")
        require(0 < self.factor < 1, "factor", self.factor, "in (0, 1)",
                "k multiplies σ at each plateau")
        require(self.threshold >= 0, "threshold", self.threshold, ">= 0")
        require(0 < self.min_noise_multiplier <= self.initial, "min_noise_multiplier",
                self.min_noise_multiplier, f"in (0, initial = {self.initial}]")
        require(self.window >= 1, "window", self.window, ">= 1")
        require(self.total_steps >= 1, "total_steps", self.total_steps, ">= 1")

    sets = frozenset({"noise_multiplier"})
    needs = Needs(validation="public")
    ledger_depends_on_data = True

    @classmethod
    def from_options(cls, **options):
        """``make("plateau", initial=σ_0, ...)``: built by make_private for the run's steps."""
        from dpfy.adaptive.factory import deferred_schedule
        return deferred_schedule("plateau", "plateau", **options)

    def init(self) -> PlateauState:
        return PlateauState(noise_multiplier=self.initial)

    def plan(self, state: PlateauState, plan: StepPlan) -> StepPlan:
        require(plan.step < self.total_steps, "step", plan.step, f"< {self.total_steps}",
                "The run was planned for total_steps steps")
        return replace(plan, noise_multiplier=state.noise_multiplier)

    def _average(self, metrics: tuple[float, ...]) -> float:
        recent = metrics[-self.window:]
        return sum(recent) / len(recent) if recent else 0.0       # S_0 = 0

    def observe(self, state: PlateauState, *, val_metric: float) -> PlateauState:
        """Feed one PUBLIC validation result; returns the state for the next steps."""
        require(val_metric == val_metric, "val_metric", val_metric, "a number (not NaN)")
        metrics = state.metrics + (float(val_metric),)
        gain = self._average(metrics) - self._average(state.metrics)
        if gain > self.threshold:
            return replace(state, metrics=metrics)
        sigma = max(self.factor * state.noise_multiplier, self.min_noise_multiplier)
        return PlateauState(noise_multiplier=sigma, metrics=metrics,
                            decays=state.decays + (sigma < state.noise_multiplier))

    @classmethod
    def calibrate_to_epsilon(cls, **_: object) -> None:
        """Always raises: the ledger depends on when plateaus happen (STYLE.md R9)."""
        require(False, "schedule", "plateau", "data-independent to be calibrated to a total ε",
                "Plateau decay reacts to validation results, so no ε can be solved in advance. "
                "Give initial σ explicitly (dpfy train: --method-options initial=2.0; Python: "
                "make_schedule('plateau', ..., initial=2.0)) and let the engine's budget guard "
                "(make_private(..., target_epsilon=...)) stop training at the target, or bound "
                "the run with worst_case_ledger()")

    def worst_case_ledger(self, *, sample_rate: float,
                          sampling: Sampling = Sampling.POISSON) -> Ledger:
        """Data-independent upper bound: every step at σ_min (ε only grows as σ falls)."""
        return Ledger.homogeneous(sample_rate=sample_rate, steps=self.total_steps,
                                  noise_multiplier=self.min_noise_multiplier, sampling=sampling)
