"""Calibration of individualized privacy budgets: IDP-SGD Sample and Scale (Boenisch et al.).

Every training example belongs to a privacy group p with budget ε_p and fraction r_p of the data
(Boenisch et al. 2023; Monir, Fauzan & Ghinita 2023, §5). Both variants keep the run's steps T
and uniform rate q fixed and make each group spend exactly (at most) its own budget:

- **Sample** (§4.2): one noise multiplier σ_sample on the sum of flat-clipped gradients (clip c);
  group p is Poisson-sampled at its own rate q_p. The reference code's nested searches: start at
  the σ that gives the strictest group its ε at q; at a σ, q_p is the largest rate whose ledger
  (q_p, σ, T) spends ≤ ε_p; lower σ (which lowers every q_p) until Σ_p r_p·q_p ≤ q, so the
  expected batch size stays qN. Returned: the largest such σ (to ``tol``) and its q_p.
- **Scale** (§4.4): one rate q; group p is clipped to c_p = s_p·c and the noise std on the sum is
  σ_scale·c. σ_p is the σ whose ledger (q, σ_p, T) spends ≤ ε_p; σ_scale = Σ_p r_p·σ_p;
  s_p = σ_scale/σ_p. Group p's effective noise multiplier is σ_scale·c/c_p = σ_p.

Only PLD or RDP decide (the GDP CLT can under-report ε). Each group's ledger is written with
:func:`dpfy.privacy.releases.group_step_releases`, the function the optimizer records with, and
its ε read by :func:`dpfy.privacy.epsilon`; every group is checked to spend at most its budget.
The budgets themselves (checked, grouped per example, drawn at random or loaded from a file) are
:mod:`dpfy.privacy.individual_budgets`, re-exported here.

MNIST Case 1 (budgets {1, 2, 3}, fractions {0.34, 0.43, 0.23}, q = 512/60000, 30 epochs,
δ = 1e-5, c = 0.2, RDP) gives σ_sample ≈ 1.37, q_p ≈ {0.0048, 0.0091, 0.0131} and σ_scale ≈ 1.55,
c_p ≈ {0.141, 0.236, 0.300}, as the paper reports (§5.4, §6).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from dpfy._require import require
from dpfy.privacy.accountants import RIGOROUS, epsilon
from dpfy.privacy.calibration import MAX_NOISE_MULTIPLIER, sigma_for
from dpfy.privacy.calibration_inputs import Target, check_rate, check_steps
from dpfy.privacy.events import Poisson
from dpfy.privacy.search import solve_decreasing
from dpfy.privacy.group_ledger import GroupLedgers, PrivacyGroup
from dpfy.privacy.individual_budgets import (
    BudgetAssignment,
    assign_groups,
    check_groups,
    load_budgets,
    random_budgets,
)
from dpfy.privacy.ledger import Sampling
from dpfy.privacy.releases import group_step_releases
from dpfy.types import StepPlan

__all__ = [
    "VARIANTS",
    "IndividualCalibration",
    "calibrate_individual",
    "check_groups",
    "BudgetAssignment",
    "assign_groups",
    "random_budgets",
    "load_budgets",
]

VARIANTS = ("sample", "scale")


@dataclass(frozen=True)
class IndividualCalibration:
    """The result of :func:`calibrate_individual`; one entry per group in the input order.

    Attributes:
      variant: ``"sample"`` or ``"scale"``.
      budgets, fractions: ε_p and r_p as given.
      noise_multiplier: σ_sample or σ_scale: the noise std on the sum is this times
        ``max_grad_norm`` (c).
      sample_rates: q_p (Sample), or the uniform q for every group (Scale).
      clips: c_p (Scale), or c for every group (Sample); None when no c was given (Sample).
      clip_fractions: f_p = c_p / max_p c_p, the groups' share of the step's sensitivity.
      group_noise_multipliers: σ_p, each group's effective noise multiplier.
      epsilons: each group's ε at ``delta``, read from its ledger by ``accountant``.
      sample_rate, steps, delta, accountant, max_grad_norm: the run's facts.
    """

    variant: str
    budgets: tuple[float, ...]
    fractions: tuple[float, ...]
    noise_multiplier: float
    sample_rates: tuple[float, ...]
    clips: tuple[float, ...] | None
    clip_fractions: tuple[float, ...]
    group_noise_multipliers: tuple[float, ...]
    epsilons: tuple[float, ...]
    sample_rate: float
    steps: int
    delta: float
    accountant: str
    max_grad_norm: float | None

    @property
    def plan_noise_multiplier(self) -> float:
        """σ_t the optimizer runs with: the noise std σ·c over the step's sensitivity max_p c_p
        (σ_sample for Sample; for Scale it equals the smallest σ_p)."""
        if self.variant == "sample":
            return self.noise_multiplier
        assert self.max_grad_norm is not None and self.clips is not None, "Scale has c and c_p"
        return self.noise_multiplier * self.max_grad_norm / max(self.clips)

    def privacy_groups(self, sizes: Sequence[int]) -> list[PrivacyGroup]:
        """The groups as the optimizer's per-group ledgers record them (``sizes``: examples)."""
        return [
            PrivacyGroup(e, q, f, int(n))
            for e, q, f, n in zip(
                self.budgets, self.sample_rates, self.clip_fractions, sizes, strict=True
            )
        ]

    def group_ledgers(self, steps: int | None = None) -> GroupLedgers:
        """The per-group ledgers of ``steps`` (default: all) planned steps."""
        return _planned_group_ledgers(
            self.privacy_groups([1] * len(self.budgets)),
            self.plan_noise_multiplier,
            self.sample_rate,
            self.steps if steps is None else steps,
        )


def _planned_group_ledgers(
    groups: Sequence[PrivacyGroup], plan_sigma: float, q: float, steps: int
) -> GroupLedgers:
    """Per-group ledgers of ``steps`` steps at σ_t = ``plan_sigma``, written with the
    optimizer's own statement of what a step releases."""

    out = GroupLedgers(groups)
    plan = StepPlan(
        step=0,
        sample_rate=max(g.sample_rate for g in groups),
        noise_multiplier=plan_sigma,
        clip=1.0,
    )
    releases = group_step_releases(plan, {}, [g.clip_fraction for g in groups])
    for group, ledger, rs in zip(groups, out.ledgers, releases):
        ledger.record_step(
            sampling=Sampling.POISSON, sample_rate=group.sample_rate, releases=rs, count=steps
        )
    return out


def _sample_variant(
    budgets: Sequence[float],
    fractions: Sequence[float],
    q: float,
    steps: int,
    delta: float,
    accountant: str,
    tol: float,
) -> tuple[float, tuple[float, ...]]:
    """σ_sample and q_p (module docstring): the reference code's nested searches.

    The outer search is a safeguarded secant on log Σ r_p q_p against log σ (close to a power
    law), aiming just below q; each q_p search starts from a log-log extrapolation of the rates
    already found, so a calibration needs a few dozen accountant calls instead of hundreds.
    """
    strictest = min(budgets)
    sigma0 = sigma_for(Poisson(q), steps, Target(strictest, delta, accountant), tol=tol / 4)
    found: list[tuple[float, tuple[float, ...]]] = []  # (σ, q_p) evaluated so far

    def guesses(sigma: float) -> list[float]:
        if not found:
            return [q * (e / strictest) ** 0.5 for e in budgets]
        near = sorted(found, key=lambda f: abs(math.log(f[0] / sigma)))[:2]
        (s_a, r_a), (s_b, r_b) = near[0], near[-1]
        out = []
        for qa, qb in zip(r_a, r_b):
            k = math.log(qa / qb) / math.log(s_a / s_b) if s_a != s_b and qa != qb else 1.5
            out.append(min(1.0, qa * (sigma / s_a) ** k))
        return out

    def mean_rate(sigma: float) -> float:
        """Σ r_p q_p at σ; 0 if some q_p is unreachable (too little noise for any rate)."""
        try:
            rates = tuple(
                _rate_for(e, sigma, g, steps, delta, accountant, tol / 10)
                for e, g in zip(budgets, guesses(sigma))
            )
        except ValueError:
            return 0.0
        found.append((sigma, rates))
        return math.fsum(r * qp for r, qp in zip(fractions, rates))

    m_prev, s_prev = mean_rate(sigma0), sigma0
    if m_prev <= q:
        return sigma0, found[-1][1]
    sigma = sigma0 * (q / m_prev) ** (1 / 1.5)
    aim = q * (1 - tol / 2)
    for _ in range(40):
        m = mean_rate(sigma)
        if q * (1 - 2 * tol) <= m <= q:
            return sigma, found[-1][1]
        if m <= 0:
            sigma, s_prev = math.sqrt(sigma * s_prev), sigma
            continue
        k = math.log(m / m_prev) / math.log(sigma / s_prev) if sigma != s_prev else 0.0
        k = k if 0.2 < k < 10 else 1.5
        s_prev, m_prev = sigma, m
        sigma = sigma * (aim / m) ** (1 / k)
        require(
            sigma > 1 / MAX_NOISE_MULTIPLIER,
            "budgets",
            list(budgets),
            f"reachable with a mean sample rate of q = {q:.4g}",
            "Raise the budgets or lower q",
        )
    raise ValueError(
        f"the IDP Sample calibration must converge, got no σ with Σ r_p q_p in "
        f"[{q * (1 - 2 * tol):.6g}, {q:.6g}] after 40 tries. Raise tol"
    )


def _rate_for(
    budget: float, sigma: float, guess: float, steps: int, delta: float, accountant: str, tol: float
) -> float:
    """Largest q_p (to ``tol``, safe side) whose ledger (q_p, σ, T) spends ≤ ``budget``.

    :func:`~dpfy.privacy.calibration.calibrate_sample_rate`'s search, started around ``guess``
    (the rate at the previous σ of the outer search), which saves most accountant calls.
    """

    def eps(inv_rate: float) -> float:
        if inv_rate < 1:
            return math.inf
        ledger = Poisson(1.0 / inv_rate).ledger(sigma, steps)
        return epsilon(ledger, delta=delta, accountant=accountant)

    if eps(1.0) <= budget:
        return 1.0

    def fail() -> None:
        require(
            False,
            "budget",
            budget,
            f"reachable at noise multiplier {sigma:.4g} with a sample rate above 1e-9",
            "Raise the budget or run fewer steps",
        )

    inv = solve_decreasing(
        eps,
        budget,
        1.0 / guess,
        rel_tol=tol,
        x_max=1e9,
        fail=fail,
        bracket=(0.98 / guess, 1.02 / guess),
    )
    return 1.0 / inv


def calibrate_individual(
    *,
    budgets: Sequence[float],
    fractions: Sequence[float],
    variant: str,
    sample_rate: float,
    steps: int,
    delta: float,
    max_grad_norm: float | None = None,
    accountant: str = "rdp",
    tol: float = 1e-3,
) -> IndividualCalibration:
    """σ and the per-group rates (Sample) or thresholds (Scale) that give each group its ε.

    Args:
      budgets: ε_p per privacy group (distinct, > 0).
      fractions: r_p, each group's share of the training set (sum to 1).
      variant: ``"sample"`` (per-group Poisson rates) or ``"scale"`` (per-group thresholds).
      sample_rate: q, the uniform rate of the run (expected batch size / N).
      steps: T, the run's optimizer updates (fixed: both variants keep DP-SGD's step count).
      delta: δ of every group's guarantee.
      max_grad_norm: c, the base clip threshold (required for Scale: c_p = s_p·c).
      accountant: ``"rdp"`` (the paper's) or ``"pld"``; GDP is refused.
      tol: relative tolerance of the searches (each result is on the safe side).

    Raises:
      ValueError: bad budgets or fractions, an unknown variant, an approximate accountant, or
        a group whose budget cannot be met at (q, T) (the message names the group).

    References: Boenisch et al., "Have it your way: individualized privacy assignment for
    DP-SGD" (2023); Monir, Fauzan & Ghinita 2023, §5 and §6.
    """
    require(variant in VARIANTS, "variant", variant, f"one of {list(VARIANTS)}")
    budgets, fractions = tuple(float(e) for e in budgets), tuple(float(r) for r in fractions)
    check_groups(budgets, fractions)
    require(
        accountant in RIGOROUS,
        "accountant",
        accountant,
        f"one of {list(RIGOROUS)} for a calibration",
        "The GDP CLT can under-report ε: calibrate with 'rdp' or 'pld'",
    )
    check_rate(sample_rate)
    check_steps(steps)
    if variant == "scale" or max_grad_norm is not None:
        require(
            isinstance(max_grad_norm, (int, float)) and max_grad_norm > 0,
            "max_grad_norm",
            max_grad_norm,
            "> 0 (the base threshold c)",
            "IDP Scale clips group p to c_p = s_p·c: give c",
        )
    if variant == "sample":
        sigma, rates = _sample_variant(
            budgets, fractions, sample_rate, steps, delta, accountant, tol
        )
        group_sigmas = (sigma,) * len(budgets)
        clip_fractions = (1.0,) * len(budgets)
        clips = None if max_grad_norm is None else (float(max_grad_norm),) * len(budgets)
    else:
        group_sigmas = tuple(
            _group_sigma(e, sample_rate, steps, delta, accountant, tol) for e in budgets
        )
        sigma = math.fsum(r * s for r, s in zip(fractions, group_sigmas))
        assert max_grad_norm is not None, "required for Scale above"
        clips = tuple(float(max_grad_norm) * sigma / s for s in group_sigmas)
        clip_fractions = tuple(c / max(clips) for c in clips)
        rates = (float(sample_rate),) * len(budgets)
    cal = IndividualCalibration(
        variant=variant,
        budgets=budgets,
        fractions=fractions,
        noise_multiplier=sigma,
        sample_rates=tuple(rates),
        clips=clips,
        clip_fractions=clip_fractions,
        group_noise_multipliers=group_sigmas,
        epsilons=(),
        sample_rate=float(sample_rate),
        steps=steps,
        delta=delta,
        accountant=accountant,
        max_grad_norm=None if max_grad_norm is None else float(max_grad_norm),
    )
    eps = tuple(
        epsilon(ledger, delta=delta, accountant=accountant)
        for ledger in cal.group_ledgers().ledgers
    )
    for e, budget in zip(eps, budgets):
        require(
            e <= budget,
            f"group ε (budget {budget:g})",
            e,
            f"<= {budget:g}",
            "The calibration overspent a group: please report this as a dpfy bug",
        )
    return IndividualCalibration(**{**cal.__dict__, "epsilons": eps})


def _group_sigma(
    budget: float, q: float, steps: int, delta: float, accountant: str, tol: float
) -> float:
    """σ_p of one group (Scale), with the group named if its budget cannot be met."""
    try:
        return sigma_for(Poisson(q), steps, Target(budget, delta, accountant), tol=tol)
    except ValueError as err:
        raise ValueError(
            f"The group with budget ε = {budget:g} cannot be calibrated: {err}"
        ) from None
