"""Schedules planned in advance: σ_t and C_t are pure functions of the step.

A :class:`PlannedSchedule` knows, once calibrated, every step's noise multiplier σ_t (noise
std / C_t) and clip C_t for ``t = 0 .. total_steps-1``. Because nothing depends on data, the
ledger the run will write is known in advance too: :meth:`PlannedSchedule.ledger` builds it
with the run's own :func:`~dpfy.privacy.releases.planned_ledger`, and the accountants (never
this module) turn it into ε. That is what makes "calibrate the whole run to a target ε" and
"stop early when ε reaches a target" searches over ledgers (CONTRIBUTING.md, privacy rule 2)
instead of formulas.

Steps are 0-based, like :class:`dpfy.types.StepPlan`. A step at or beyond ``total_steps`` is
refused: the budget was planned for ``total_steps`` steps only (Du et al. 2021, §4.4: steps beyond T
are not covered by the budget).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TypeVar

import numpy as np
import torch

from dpfy._require import require
from dpfy.adaptive.base import Method, bind_facts, calibrated, method_name
from dpfy.privacy import epsilon
from dpfy.privacy.calibration import calibrate_schedule_scale, last_passing
from dpfy.privacy.ledger import Ledger
from dpfy.privacy.releases import planned_ledger
from dpfy.types import RunFacts, Sampling, StepPlan

__all__ = [
    "PlannedSchedule",
    "ScaledSchedule",
    "steps_within_budget",
    "CALIBRATIONS",
    "check_calibration",
    "require_budget",
    "calibrate_scaled_schedule",
]

# Accountants a schedule may be calibrated against; "gdp" (a paper's CLT) only when
# ``approximate=True`` opts in: it can under-report ε (the ledger and report stay rigorous).
CALIBRATIONS = ("pld", "rdp", "gdp")


def check_calibration(calibration: str | None, approximate: bool) -> None:
    """Validate a schedule's ``calibration`` / ``approximate`` options at construction."""
    require(
        calibration is None or calibration in CALIBRATIONS,
        "calibration",
        calibration,
        f"None (the run's accountant) or one of {list(CALIBRATIONS)}",
        "Use 'pld' for a tight rigorous guarantee; 'gdp' reproduces a paper's CLT calibration",
    )
    require(
        calibration != "gdp" or approximate is True,
        "calibration",
        calibration,
        "'pld' or 'rdp' unless approximate=True",
        "The GDP CLT can under-report ε; pass approximate=True only to reproduce a "
        "paper's GDP calibration (the report still gives the rigorous ε)",
    )
    require(isinstance(approximate, bool), "approximate", approximate, "a bool")


def require_budget(facts: RunFacts, name: str) -> None:
    """The facts a calibration to the run's target ε reads: the target, δ, the steps and
    Poisson sampling (the calibrations assume it)."""
    require(
        facts.target_epsilon is not None and facts.delta is not None,
        "target_epsilon",
        facts.target_epsilon,
        f"given for method {name!r} (with target_delta)",
        "It is calibrated to the run's budget: pass target_epsilon= and target_delta=, or "
        "give the method's initial noise explicitly",
    )
    require(
        facts.steps is not None,
        "steps",
        None,
        f"known for method {name!r}",
        "Pass epochs= or max_steps= to make_private",
    )
    require(
        facts.sampling == Sampling.POISSON,
        "sampling",
        facts.sampling.value,
        f"'poisson' for method {name!r}",
        "Its calibration assumes Poisson sampling; use poisson_sampling=True",
    )


@dataclass(frozen=True, kw_only=True)
class PlannedSchedule(Method[None]):
    """Base for data-independent schedules; subclasses define the per-step values.

    Subclasses are frozen dataclasses; they override :meth:`noise_multiplier` and, if they
    schedule the clip, :meth:`clip`. The fields here, keyword-only (after the subclass's own),
    are the options every planned schedule has: ``total_steps`` (T; None until ``calibrate``
    sets the run's steps), ``calibration`` (the accountant its scale is solved against, one of
    :data:`CALIBRATIONS`; None: the run's) and ``approximate`` (must be True with
    ``calibration="gdp"``); subclasses check them (:func:`check_calibration`).
    Releases per step: the clipped-gradient sum only, with noise multiplier σ_t.
    """

    total_steps: int | None = None
    calibration: str | None = None
    approximate: bool = False

    sets = frozenset({"noise_multiplier"})

    # -- what a subclass defines -----------------------------------------------------------
    def noise_multiplier(self, step: int) -> float:
        """σ_t: noise std divided by the clip C_t at 0-based ``step``."""
        raise NotImplementedError

    def clip(self, step: int, base_clip: float | torch.Tensor) -> float | torch.Tensor:
        """C_t at ``step``; the default keeps the run's ``max_grad_norm``."""
        return base_clip

    # -- derived ---------------------------------------------------------------------------
    def horizon(self) -> int:
        """T, the steps the schedule (and its budget) covers; refused before calibration."""
        method = f"method {method_name(self)!r}"
        return int(calibrated(self.total_steps, method, known="its total_steps"))

    def check_step(self, step: int) -> None:
        t = self.horizon()
        require(
            0 <= step < t,
            "step",
            step,
            f"in [0, {t})",
            "The schedule (and its privacy budget) covers total_steps steps only; build a "
            "new schedule with a larger total_steps to train longer",
        )

    def plan(self, state: None, plan: StepPlan) -> StepPlan:
        self.check_step(plan.step)
        return replace(
            plan,
            noise_multiplier=self.noise_multiplier(plan.step),
            clip=self.clip(plan.step, plan.clip),
        )

    def noise_multipliers(self) -> np.ndarray:
        """σ_t for every step, shape (total_steps,)."""
        return np.array([self.noise_multiplier(t) for t in range(self.horizon())])

    def ledger(
        self,
        *,
        sample_rate: float,
        sampling: Sampling = Sampling.POISSON,
        dataset_size: int | None = None,
    ) -> Ledger:
        """The ledger a full run of this schedule writes, by
        :func:`dpfy.privacy.releases.planned_ledger` (the step's own ``step_releases``)."""
        facts = RunFacts(
            sampling=sampling,
            sample_rate=sample_rate,
            steps=self.horizon(),
            dataset_size=dataset_size,
        )
        return planned_ledger(self, facts)


@dataclass(frozen=True, kw_only=True)
class ScaledSchedule(PlannedSchedule):
    """Base for schedules whose σ_t is ``initial`` (σ_0) times a shape that does not depend on
    it, ``factor(unit(t))`` (``noise_decay``, ``pur``), calibrated by
    :func:`calibrate_scaled_schedule`.

    Its fields, keyword-only like :class:`PlannedSchedule`'s, are the options those schedules
    add: ``per`` (the unit u, ``"epoch"`` or ``"step"``), ``initial`` (σ_0; None: solved in
    ``calibrate`` for the run's target ε) and ``steps_per_epoch`` (None: the run's). Each
    subclass checks them in its ``__post_init__`` and defines :meth:`unit` and :meth:`factor`.
    """

    per: str = "epoch"
    initial: float | None = None
    steps_per_epoch: int | None = None

    def unit(self, step: int) -> int:
        """u: the schedule's time at 0-based ``step``."""
        raise NotImplementedError

    def factor(self, u: int) -> float:
        """σ_u / σ_0 at schedule time u (independent of ``initial``)."""
        raise NotImplementedError

    def shape(self) -> np.ndarray:
        """σ_t / σ_0 for every step, shape (total_steps,): what calibration scales."""
        return np.array([self.factor(self.unit(t)) for t in range(self.horizon())])

    def noise_multiplier(self, step: int) -> float:
        self.check_step(step)
        fix = "Pass it to make_private(method=...), which solves σ_0, or give initial="
        sigma0 = calibrated(self.initial, f"method {method_name(self)!r}", fix, known="σ_0")
        return sigma0 * self.factor(self.unit(step))


def steps_within_budget(
    schedule: PlannedSchedule,
    *,
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    accountant: str = "pld",
) -> int:
    """Largest T' ≤ total_steps whose first T' steps spend at most ``target_epsilon``.

    Early stopping at a target ε (Monir et al. 2023, §6.1, Table 8 "stopping criterion ε"): rather
    than checking ε after every step, the stopping step is found before training by
    bisection over prefixes of the ledger the run will write (ε grows with every step).
    Returns 0 if even one step spends more than the target.
    """
    require(target_epsilon > 0, "target_epsilon", target_epsilon, "> 0")
    full = schedule.ledger(sample_rate=sample_rate)

    def spent(n: int) -> float:
        return epsilon(full.prefix(n), delta=delta, accountant=accountant)

    total = schedule.horizon()
    if spent(total) <= target_epsilon:
        return total
    # spent(0) = 0 <= target < spent(total)
    return last_passing(lambda n: spent(n) <= target_epsilon, 0, total)


S = TypeVar("S", bound=ScaledSchedule)


def calibrate_scaled_schedule(schedule: S, facts: RunFacts) -> S:
    """Calibrate a :class:`ScaledSchedule` (σ_t = ``initial`` × its ``shape()``) for the run's
    facts. ``initial`` unset: σ_0 solved so the whole run spends the target ε (one scalar
    search by the accountant); ``initial`` and a target: stopped early at the last step within
    the target; ``initial`` and no target: run as given (the budget guard watches the ledger).
    """
    name = method_name(schedule)
    steps = schedule.total_steps if schedule.total_steps is not None else facts.steps
    require(
        steps is not None,
        "steps",
        None,
        f"known for method {name!r}",
        "Pass epochs= or max_steps= to make_private",
    )
    out = replace(
        schedule,
        total_steps=steps,
        steps_per_epoch=schedule.steps_per_epoch or facts.steps_per_epoch or 1,
    )
    accountant = schedule.calibration or facts.accountant
    if out.initial is None:
        require_budget(facts, name)
        assert facts.target_epsilon is not None and facts.delta is not None  # require_budget
        scale = calibrate_schedule_scale(
            shape=out.shape(),
            target_epsilon=facts.target_epsilon,
            delta=facts.delta,
            sample_rate=facts.sample_rate,
            accountant=accountant,
            approximate=schedule.approximate,
        )
        out = replace(out, initial=scale)
    elif facts.target_epsilon is not None:  # early stopping at the target
        require_budget(facts, name)
        assert facts.delta is not None  # require_budget refused None
        stop = steps_within_budget(
            out,
            target_epsilon=facts.target_epsilon,
            delta=facts.delta,
            sample_rate=facts.sample_rate,
            accountant=accountant,
        )
        require(
            stop >= 1,
            "initial",
            schedule.initial,
            "large enough that one step fits the budget",
            "Raise σ_0 or the target ε",
        )
        out = replace(out, total_steps=stop)
    return bind_facts(out, facts)
