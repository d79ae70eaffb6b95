"""Calibrations of runs that are not identical steps: a σ schedule's scale, HyFreeDP's split.

Both search with :func:`dpfy.privacy.search.solve_decreasing` over the ledger the run would
record, as every calibration does (:mod:`dpfy.privacy.calibration`).
"""

from __future__ import annotations

import math
from typing import Callable, Sequence, Unpack

import numpy as np

from dpfy._require import require
from dpfy.privacy.accountants import DEFAULT_RESOLUTION, epsilon
from dpfy.privacy.calibration_inputs import (
    MAX_NOISE_MULTIPLIER,
    SampledTargetKeywords,
    TargetKeywords,
    check_rate,
    check_steps,
    refuse_below_pld_floor,
    sigma_floor,
    shows_keywords,
    target_from,
    unreachable,
)
from dpfy.privacy.events import Poisson
from dpfy.privacy.ledger import Ledger, Release, Sampling
from dpfy.privacy.releases import step_releases
from dpfy.privacy.search import solve_decreasing
from dpfy.privacy.sigma_calibration import kind_from, sigma_for
from dpfy.types import ReleaseSpec, StepPlan

__all__ = ["calibrate_schedule_scale", "hyfree_noise_split"]


# the schedules' own default accountant (the other calibrators' is "rdp")
SCHEDULE_ACCOUNTANT = "pld"


@shows_keywords(SampledTargetKeywords, accountant=SCHEDULE_ACCOUNTANT)
def calibrate_schedule_scale(
    *,
    shape: Sequence[float] | np.ndarray,
    sample_rate: float,
    tol: float = 2e-3,
    **target: Unpack[SampledTargetKeywords],
) -> float:
    """Smallest s such that the ledger with σ_t = s·shape[t] (one step per entry) spends ≤ target.

    ``shape`` is the schedule's form f(t) (e.g. a decay k^t), one positive value per step. Big
    heterogeneous schedules (more than 16 distinct values) are searched with σ's rounded down to
    the accountant's grid (1 % RDP, 2 % PLD; see :mod:`dpfy.privacy.accountants`), so the
    returned s is an upper bound on the exact answer: within ~1–3 % of it, and always on the
    safe side (the ledger the run writes spends at most the target). With PLD every σ_t must
    stay above the PLD floor (module docstring). The target and the sampling are the keywords
    of :class:`~dpfy.privacy.calibration_inputs.SampledTargetKeywords`: ``target_epsilon``,
    ``delta``, ``accountant="pld"`` (here, where the others default to ``"rdp"``),
    ``approximate=False`` (as in :func:`calibrate_noise_multiplier`),
    ``sampling=Sampling.POISSON``, ``dataset_size=None``.
    """
    goal = target_from(
        "calibrate_schedule_scale",
        SampledTargetKeywords,
        target,
        default_accountant=SCHEDULE_ACCOUNTANT,
    )
    target_epsilon, delta, accountant = goal.epsilon, goal.delta, goal.accountant
    check_rate(sample_rate)
    sampled = kind_from(target, sample_rate)
    sampling, dataset_size = sampled.sampling, sampled.dataset_size
    values = [float(v) for v in shape]
    require(len(values) >= 1, "shape", shape, "a non-empty sequence (one value per step)")
    require(
        all(v > 0 and math.isfinite(v) for v in values),
        "shape",
        min(values),
        "positive and finite at every step",
    )

    # Searching over s makes every σ new, so exact accounting would recompute every step's
    # RDP curve / PLD at each trial. On the rounded-down grid the σ's repeat between trials
    # (cached) and ε stays an upper bound, so the answer stays on the safe side.
    resolution = None if len(set(values)) <= 16 else DEFAULT_RESOLUTION.get(accountant)

    def eps_for(name: str) -> Callable[[float], float]:
        def eps(s: float) -> float:
            ledger = Ledger.from_schedule(
                sample_rates=[sample_rate] * len(values),
                noise_multipliers=[s * v for v in values],
                sampling=sampling,
                dataset_size=dataset_size,
            )
            return epsilon(
                ledger,
                delta=delta,
                accountant=name,
                sigma_resolution=resolution if name == accountant else None,
            )

        return eps

    fail = unreachable(
        target_epsilon,
        "reachable by scaling the schedule",
        "Raise the target ε or δ, or shorten the run",
    )

    top = MAX_NOISE_MULTIPLIER / max(values)
    # Start where the (fast, closed-form) GDP CLT puts the answer; only the accountant's own
    # ε decides the result.
    guess = solve_decreasing(
        eps_for("gdp"), target_epsilon, 1.0 / _mean(values), rel_tol=0.02, x_max=top, fail=fail
    )
    floor = sigma_floor(accountant, sampling)
    if (
        floor
        and _rdp_epsilon_at(floor / min(values), values, sample_rate, sampling, dataset_size, delta)
        <= target_epsilon
    ):
        # RDP's ε bounds PLD's from above, so PLD meets the target below the floor too: refuse
        # now instead of building PLD grids at the floor.
        refuse_below_pld_floor(target_epsilon, floor)
    return solve_decreasing(
        eps_for(accountant),
        target_epsilon,
        guess,
        rel_tol=tol,
        x_max=top,
        fail=fail,
        x_min=floor / min(values),
        fail_low=lambda: refuse_below_pld_floor(target_epsilon, floor),
    )


def _rdp_epsilon_at(
    scale: float,
    values: Sequence[float],
    sample_rate: float,
    sampling: Sampling,
    dataset_size: int | None,
    delta: float,
) -> float:
    """RDP ε (cheap, an upper bound of PLD's) of the schedule scaled by ``scale``."""
    ledger = Ledger.from_schedule(
        sample_rates=[sample_rate] * len(values),
        noise_multipliers=[scale * v for v in values],
        sampling=sampling,
        dataset_size=dataset_size,
    )
    return epsilon(ledger, delta=delta, accountant="rdp")


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


@shows_keywords(TargetKeywords)
def hyfree_noise_split(
    *,
    sample_rate: float,
    steps: int,
    probe_every: int,
    probes_per_round: int = 3,
    gamma: float = 1.01,
    probes_share_batch: bool = True,
    tol: float = 1e-3,
    **target: Unpack[TargetKeywords],
) -> tuple[float, float]:
    """HyFreeDP's end-to-end split (Bu & Liu 2025, Algorithm 2, §4.3 and Appendix C): (σ_g, σ_l).

    1. σ = the noise multiplier plain DP-SGD would need for (ε, δ) over ``steps``;
    2. σ_g = γ·σ (γ slightly above 1: the gradient gets ~1 % more noise);
    3. σ_l = the smallest loss-probe σ such that the whole ledger (``steps`` gradient releases
       plus ``probes_per_round`` loss releases every ``probe_every`` steps) spends ≤ ε.

    Args:
      probes_share_batch: True (the paper's Algorithm 1, and the conservative choice) records
        the probes as releases of the gradient step's batch, so they compose with it into one
        step (they reuse its batch). False records them as separately Poisson-sampled steps, which
        is
        the paper's own accounting (Theorem 2, 3T/K extra mechanisms) and is only valid if the
        probes use a fresh Poisson sample.
      **target: the keywords of :class:`~dpfy.privacy.calibration_inputs.TargetKeywords`:
        ``target_epsilon`` and ``delta``, ``accountant="rdp"``, and ``approximate=False``,
        which must be True with ``accountant="gdp"`` (the paper's own GDP accounting).
    """
    goal = target_from("hyfree_noise_split", TargetKeywords, target)
    check_rate(sample_rate)
    check_steps(steps)
    require(
        isinstance(probe_every, int) and probe_every >= 1,
        "probe_every",
        probe_every,
        "an integer >= 1 (K: steps between learning-rate updates)",
    )
    require(probes_per_round >= 1, "probes_per_round", probes_per_round, ">= 1")
    require(gamma > 1, "gamma", gamma, "> 1", "The paper uses γ = 1.01")
    sigma = sigma_for(Poisson(sample_rate), steps, goal, tol=tol / 4)
    sigma_g = gamma * sigma

    def ledger_for(sigma_l: float) -> Ledger:
        ledger = Ledger()
        grad = Release("gradient", sigma_g)
        probes = [Release("loss_probe", sigma_l)] * probes_per_round
        # Loss probes of bound 1 with noise std σ_l: noise multiplier σ_l, as the step records.
        specs = {
            f"loss_probe_{k}": ReleaseSpec(1.0, sigma_l, kind="loss", offsets={})
            for k in range(probes_per_round)
        }
        for t in range(steps):
            probe_round = t % probe_every == 0
            if probes_share_batch:
                plan = StepPlan(step=t, sample_rate=sample_rate, noise_multiplier=sigma_g, clip=1.0)
                ledger.record_step(
                    sampling=Sampling.POISSON,
                    sample_rate=sample_rate,
                    releases=step_releases(plan, specs if probe_round else {}),
                )
            else:
                ledger.record_step(
                    sampling=Sampling.POISSON, sample_rate=sample_rate, releases=[grad]
                )
                for p in probes if probe_round else []:
                    ledger.record_step(
                        sampling=Sampling.POISSON, sample_rate=sample_rate, releases=[p]
                    )
        return ledger

    def eps(sigma_l: float) -> float:
        return epsilon(ledger_for(sigma_l), delta=goal.delta, accountant=goal.accountant)

    def fail() -> None:
        require(
            False,
            "gamma",
            gamma,
            "large enough to leave budget for the loss probes",
            "Raise γ, probe less often (larger probe_every) or raise the target ε",
        )

    sigma_l = solve_decreasing(
        eps, goal.epsilon, sigma_g * 2, rel_tol=tol, x_max=MAX_NOISE_MULTIPLIER, fail=fail
    )
    return sigma_g, sigma_l
