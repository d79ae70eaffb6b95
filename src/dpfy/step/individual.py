"""Individualized privacy budgets as a piece of the private step: one ledger and one ε cap per
privacy group (the examples that share a budget ε_p), and each unit's share of the clipping
threshold (IDP-SGD "Scale"); plus the calibration ``make_private`` runs for them.

The step calls :meth:`IndividualBudgets.clip_fractions` while summing (each unit's
contribution is asserted against its group's threshold), :meth:`IndividualBudgets.check` in the
ε guard's place before the noise, and :meth:`IndividualBudgets.record` beside the run's ledger.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch

from dpfy._renamed import renamed_attribute
from dpfy._require import require
from dpfy.privacy import Release
from dpfy.privacy.group_ledger import GroupLedgers
from dpfy.privacy.individual import VARIANTS, assign_groups, calibrate_individual
from dpfy.privacy.releases import group_step_releases
from dpfy.sampling import PoissonSampler
from dpfy.sampling.sampler import Sampler
from dpfy.step.guard import GroupEpsilonGuard
from dpfy.types import ReleaseSpec, Sampling, StepPlan

__all__ = ["IndividualBudgets", "IndividualRun", "individualize"]


class IndividualBudgets:
    """The per-group ledgers and ε caps of an individualized run.

    Args:
      groups: the group ledgers (:class:`~dpfy.privacy.group_ledger.GroupLedgers`).
      guard: one ε cap per group.
      group_of: (N,) each example's group index (public: the budget assignment is not data).
    """

    def __init__(
        self, groups: GroupLedgers, guard: GroupEpsilonGuard, group_of: torch.Tensor
    ) -> None:
        self.group_ledgers, self.guard, self.group_of = groups, guard, group_of

    groups = renamed_attribute(
        "IndividualBudgets.groups", "group_ledgers", "IndividualBudgets.group_ledgers"
    )

    def clip_fractions(self, indices: torch.Tensor) -> torch.Tensor | None:
        """Each row's share f_i of the sensitivity (B,), public; None when every f_p = 1."""
        if min(self.group_ledgers.clip_fractions) >= 1:
            return None
        f = torch.tensor(self.group_ledgers.clip_fractions, dtype=torch.float64)  # (P,) public
        return f[self.group_of[indices.cpu()]]  # (B,) public

    def check(
        self, plan: StepPlan, specs: Mapping[str, ReleaseSpec], sampling: Sampling
    ) -> list[tuple[Release, ...]]:
        """Each group's releases for this step, refused if one would exceed its budget."""
        releases = group_step_releases(plan, specs, self.group_ledgers.clip_fractions)
        self.guard.check_release(self.group_ledgers, sampling=sampling, releases=releases)
        return releases

    def record(self, releases: list[tuple[Release, ...]], sampling: Sampling) -> None:
        self.group_ledgers.record_step(sampling=sampling, releases=releases)

    def state_dict(self) -> dict[str, Any]:
        return self.group_ledgers.to_dict()

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        require(
            state is not None,
            "the checkpoint's group ledgers",
            None,
            "saved (this run has individualized budgets)",
            "Resume from a checkpoint of the same individualized run",
        )
        assert state is not None, "required above"
        self.group_ledgers.ledgers = GroupLedgers.from_dict(state).ledgers
        self.guard.reset()


@dataclass(frozen=True)
class IndividualRun:
    """What ``make_private`` runs with for individualized budgets (see :func:`individualize`)."""

    sampler: Sampler
    noise_multiplier: float
    clipping: str
    max_grad_norm: float | torch.Tensor
    budgets: IndividualBudgets


def individualize(
    budgets: Any,
    variant: str | None,
    *,
    sampler: Sampler,
    max_steps: int | None,
    delta: float | None,
    accountant: str,
    max_grad_norm: Any,
    seed: int | None,
) -> IndividualRun:
    """Calibrate IDP-SGD Sample or Scale for the run and build its sampler and clipping.

    Its combinations (flat clipping, Poisson sampling, a rigorous accountant, nothing else that
    decides σ) were refused by :func:`dpfy.spec.check` before the sampler was built."""
    require(
        budgets is not None,
        "budgets",
        None,
        f"given with individual={variant!r}",
        "Pass one ε per training example",
    )
    require(
        variant in VARIANTS,
        "individual",
        variant,
        f"one of {list(VARIANTS)} with budgets",
        "Choose per-group sample rates ('sample') or clip thresholds ('scale')",
    )
    require(
        isinstance(max_grad_norm, (int, float)),
        "max_grad_norm",
        max_grad_norm,
        "a float (the base threshold c) with budgets",
    )
    require(
        delta is not None and 0 < delta < 1,
        "target_delta",
        delta,
        "in (0, 1) with budgets",
        "Every group's guarantee is (ε_p, δ): pass target_delta",
    )
    require(
        max_steps is not None,
        "epochs",
        None,
        "given with budgets",
        "The calibration keeps the run's steps fixed: pass epochs= or max_steps=",
    )
    assert variant is not None and delta is not None and max_steps is not None, "required above"
    n = sampler.dataset_size
    if torch.is_tensor(budgets):
        budgets = budgets.detach().cpu().numpy()
    assignment = assign_groups(budgets, n)
    cal = calibrate_individual(
        budgets=assignment.budgets,
        fractions=assignment.fractions,
        variant=variant,
        sample_rate=sampler.sample_rate,
        steps=max_steps,
        delta=delta,
        max_grad_norm=float(max_grad_norm),
        accountant=accountant,
    )
    group_of = torch.from_numpy(assignment.group_of)
    pieces = IndividualBudgets(
        GroupLedgers(cal.privacy_groups(assignment.sizes), len(assignment.group_of)),
        GroupEpsilonGuard(cal.budgets, delta=cal.delta, accountant=cal.accountant),
        group_of,
    )
    if variant == "sample":
        rates = torch.tensor(cal.sample_rates, dtype=torch.float64)[group_of]  # (N,)
        # b stays the uniform qN (Σ q_i is at most 0.2 % below it): same update scale and
        # steps per epoch as the uniform run the calibration assumed.
        new_sampler = PoissonSampler(
            n, sample_rates=rates, seed=seed, normalizer=sampler.normalizer
        )
        return IndividualRun(
            new_sampler, cal.plan_noise_multiplier, "flat", float(max_grad_norm), pieces
        )
    clips = torch.tensor(cal.clips, dtype=torch.float64)[group_of]  # (N,)
    return IndividualRun(sampler, cal.plan_noise_multiplier, "individual", clips, pieces)
