"""Validation-plateau noise decay: multiply σ by k when a PUBLIC validation metric stalls.

References: Yu et al. 2019, §3.1.1, as surveyed by Monir, Fauzan & Ghinita 2023, §3.1.1; the
review's printed rule (σ_e = kσ_e when |S − S_{e−1}| ≤ δ) is read as σ_{e+1} = kσ_e.

Rule, evaluated each time the trainer feeds a validation result (a "validation epoch" e):

    S̄_e = mean of the last ``window`` metrics (S_0 = 0 before any evaluation)
    σ_{e+1} = max(k·σ_e, σ_min)   if S̄_e − S̄_{e−1} ≤ δ_val
    σ_{e+1} = σ_e                 otherwise

The moving average keeps noise in the metric from triggering decays, each of which costs
budget.

Privacy: the metric MUST come from a public validation set (data that is not part of the
private training set). Then the decisions are post-processing of public data and cost nothing,
but the ledger still depends on *when* decays happen, so a total ε cannot be calibrated in
advance: σ_0 (``initial``) is required, and the method names the budget guard when it is
missing. Use ``make_private(..., target_epsilon=...)``'s budget guard (it stops training when
the ledger's ε would exceed the target) or the data-independent bound
:meth:`worst_case_ledger` (every step at σ_min). A metric computed on private data would be an
unaccounted release: do not.

How the trainer drives it (the method keeps no hidden state, R4/R5)::

    state = schedule.init()
    for epoch in range(epochs):
        for batch in loader:
            plan = schedule.plan(state, base_plan)           # σ from the state
            ...                                               # the private step
        state = schedule.observe(state, val_metric=accuracy(model, public_val_loader))

With ``make_private(..., method=dpfy.adaptive.make("plateau", initial=2.0))`` the private
optimizer holds the state; after each public evaluation the trainer calls::

    optimizer.observe(val_metric=acc)

(the state is checkpointed with the optimizer; ``dpfy train --method plateau`` does this each
epoch once ``--public-validation test`` declares the split public). Pass ``target_epsilon`` /
``target_delta`` (or ``epsilon_cap``) to ``make_private`` so the budget guard stops the run at
the target.

Releases per step: the clipped-gradient sum, noise multiplier σ_e. The validation metric is
public (not a release).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from dpfy._require import require
from dpfy.adaptive.base import Method, bind_facts, register, run_steps
from dpfy.privacy.ledger import Ledger
from dpfy.types import RunFacts, Sampling, StepPlan

__all__ = ["PlateauNoiseDecay", "PlateauState"]


@dataclass(frozen=True)
class PlateauState:
    """σ now and the public validation metrics seen so far (oldest first)."""

    noise_multiplier: float
    metrics: tuple[float, ...] = ()
    decays: int = 0


@register("plateau")
@dataclass(frozen=True)
class PlateauNoiseDecay(Method[PlateauState]):
    """Noise decay triggered by a plateau of a public validation metric (higher = better).

    Args:
      initial: σ_0 > 0 (required: the ledger depends on the plateaus, so no σ_0 can be solved
        for a target ε in advance).
      factor: k in (0, 1), the decay applied at a plateau.
      threshold: δ_val ≥ 0; a moving-average gain ≤ δ_val is a plateau.
      min_noise_multiplier: σ_min in (0, initial]; the floor keeps every step private and
        bounds the worst case. None: initial / 4.
      window: moving-average window (number of evaluations), ≥ 1.
      total_steps: the most optimizer updates the run may make; None: the run's steps.
    """

    initial: float | None = None
    factor: float = 0.9
    threshold: float = 0.0
    min_noise_multiplier: float | None = None
    window: int = 1
    total_steps: int | None = None

    sets = frozenset({"noise_multiplier"})
    ledger_depends_on_data = True
    example_options = {"initial": 2.0}

    def __post_init__(self) -> None:
        require(
            self.initial is not None,
            "initial",
            None,
            "given for method 'plateau' (data-independent calibration to a total ε is impossible)",
            "Plateau decay reacts to validation results, so no σ_0 can be solved in "
            "advance. Give it explicitly (dpfy train: --method-options initial=2.0; "
            "Python: make('plateau', initial=2.0)) and let the budget guard "
            "(make_private(..., target_epsilon=...)) stop training at the target, or bound "
            "the run with worst_case_ledger()",
        )
        assert self.initial is not None  # the require above refused None
        require(self.initial > 0, "initial", self.initial, "> 0")
        require(
            0 < self.factor < 1,
            "factor",
            self.factor,
            "in (0, 1)",
            "k multiplies σ at each plateau",
        )
        require(self.threshold >= 0, "threshold", self.threshold, ">= 0")
        if self.min_noise_multiplier is None:
            object.__setattr__(self, "min_noise_multiplier", self.initial / 4)
        assert self.min_noise_multiplier is not None  # set just above
        require(
            0 < self.min_noise_multiplier <= self.initial,
            "min_noise_multiplier",
            self.min_noise_multiplier,
            f"in (0, initial = {self.initial}]",
        )
        require(self.window >= 1, "window", self.window, ">= 1")
        if self.total_steps is not None:
            require(self.total_steps >= 1, "total_steps", self.total_steps, ">= 1")

    def calibrate(self, facts: RunFacts) -> "PlateauNoiseDecay":
        """The run's steps as the horizon (σ_0 is the user's: nothing is solved)."""
        steps = run_steps(self.total_steps, facts, "plateau")
        return bind_facts(replace(self, total_steps=steps), facts)

    def init(self) -> PlateauState:
        assert self.initial is not None  # __post_init__ refused None
        return PlateauState(noise_multiplier=self.initial)

    def plan(self, state: PlateauState, plan: StepPlan) -> StepPlan:
        if self.total_steps is not None:
            require(
                plan.step < self.total_steps,
                "step",
                plan.step,
                f"< {self.total_steps}",
                "The run was planned for total_steps steps",
            )
        return replace(plan, noise_multiplier=state.noise_multiplier)

    def _average(self, metrics: tuple[float, ...]) -> float:
        recent = metrics[-self.window :]
        return sum(recent) / len(recent) if recent else 0.0  # S_0 = 0

    def observe(self, state: PlateauState, *, val_metric: float) -> PlateauState:
        """Feed one PUBLIC validation result; returns the state for the next steps."""
        require(val_metric == val_metric, "val_metric", val_metric, "a number (not NaN)")
        metrics = state.metrics + (float(val_metric),)
        gain = self._average(metrics) - self._average(state.metrics)
        if gain > self.threshold:
            return replace(state, metrics=metrics)
        assert self.min_noise_multiplier is not None  # __post_init__ fills it
        sigma = max(self.factor * state.noise_multiplier, self.min_noise_multiplier)
        return PlateauState(
            noise_multiplier=sigma,
            metrics=metrics,
            decays=state.decays + (sigma < state.noise_multiplier),
        )

    def worst_case_ledger(
        self, *, sample_rate: float, sampling: Sampling = Sampling.POISSON
    ) -> Ledger:
        """Data-independent upper bound: every step at σ_min (ε only grows as σ falls)."""
        require(
            self.total_steps is not None,
            "total_steps",
            None,
            "known",
            "Give total_steps= or calibrate the method for the run",
        )
        assert self.total_steps is not None and self.min_noise_multiplier is not None  # checked
        return Ledger.homogeneous(
            sample_rate=sample_rate,
            steps=self.total_steps,
            noise_multiplier=self.min_noise_multiplier,
            sampling=sampling,
        )
