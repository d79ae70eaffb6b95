"""Schedules planned in advance: σ_t and C_t are pure functions of the step (STYLE.md R5).

A :class:`PlannedSchedule` knows, before training starts, every step's noise multiplier
σ_t (noise std / C_t) and clip C_t for ``t = 0 .. total_steps-1``. Because nothing depends on
data, the ledger the run will write is known in advance too: :meth:`PlannedSchedule.ledger`
builds it, and the accountants (never this module) turn it into ε. That is what makes
"calibrate the whole run to a target ε" and "stop early when ε reaches a target" searches over
ledgers (STYLE.md R9) instead of formulas.

Steps are 0-based, like :class:`dpfy.types.plan.StepPlan`. A step at or beyond ``total_steps`` is
refused: the budget was planned for ``total_steps`` steps only (seed 001 §4: "steps beyond T
are not covered by the budget").
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from dpfy._require import require
from dpfy.adaptive.base import AdaptiveMethod
from dpfy.types.plan import StepPlan
from dpfy.privacy.ledger import Ledger, Sampling

__all__ = ["PlannedSchedule", "steps_within_budget"]


class PlannedSchedule(AdaptiveMethod[None]):
    """Base for data-independent schedules; subclasses define the per-step values.

    Subclasses are frozen dataclasses with a ``total_steps: int`` field and override
    :meth:`noise_multiplier` and, if they schedule the clip, :meth:`clip`.
    Releases per step: the clipped-gradient sum only, with noise multiplier σ_t.
    """

    total_steps: int
    sets = frozenset({"noise_multiplier"})

    # -- what a subclass defines -----------------------------------------------------------
    def noise_multiplier(self, step: int) -> float:
        """σ_t: noise std divided by the clip C_t at 0-based ``step``."""
        raise NotImplementedError

    def clip(self, step: int, base_clip: float) -> float:
        """C_t at ``step``; the default keeps the engine's ``max_grad_norm``."""
        return base_clip

    # -- derived ---------------------------------------------------------------------------
    def check_step(self, step: int) -> None:
        require(0 <= step < self.total_steps, "step", step, f"in [0, {self.total_steps})",
                "The schedule (and its privacy budget) covers total_steps steps only; build a "
                "new schedule with a larger total_steps to train longer")

    def plan(self, state: None, plan: StepPlan) -> StepPlan:
        self.check_step(plan.step)
        return replace(plan, noise_multiplier=self.noise_multiplier(plan.step),
                       clip=self.clip(plan.step, plan.clip))

    def noise_multipliers(self) -> np.ndarray:
        """σ_t for every step, shape (total_steps,)."""
        return np.array([self.noise_multiplier(t) for t in range(self.total_steps)])

    def ledger(self, *, sample_rate: float, sampling: Sampling = Sampling.POISSON,
               dataset_size: int | None = None) -> Ledger:
        """The ledger a full run of this schedule writes, by :func:`dpfy.step.planned_ledger`
        (the optimizer's own ``step_releases``; one gradient release per step)."""
        from dpfy.types import RunFacts
        from dpfy.privacy.releases import planned_ledger

        facts = RunFacts(sampling=sampling, sample_rate=sample_rate, steps=self.total_steps,
                         dataset_size=dataset_size)
        return planned_ledger(self, facts)


def steps_within_budget(schedule: PlannedSchedule, *, target_epsilon: float, delta: float,
                        sample_rate: float, accountant: str = "pld") -> int:
    """Largest T' ≤ total_steps whose first T' steps spend at most ``target_epsilon``.

    Early stopping at a target ε (review 000 §2.1.2, Table 8 "stopping criterion ε"): rather
    than checking ε after every step, the stopping step is found before training by
    bisection over prefixes of the ledger the run will write (ε grows with every step).
    Returns 0 if even one step spends more than the target.
    """
    from dpfy.privacy import epsilon  # the accountant is the only place ε is computed
    from dpfy.privacy.calibration import last_passing

    require(target_epsilon > 0, "target_epsilon", target_epsilon, "> 0")
    full = schedule.ledger(sample_rate=sample_rate)

    def spent(n: int) -> float:
        return epsilon(full.prefix(n), delta=delta, accountant=accountant)

    if spent(schedule.total_steps) <= target_epsilon:
        return schedule.total_steps
    # spent(0) = 0 <= target < spent(total_steps)
    return last_passing(lambda n: spent(n) <= target_epsilon, 0, schedule.total_steps)
