"""Calibration: searches over ledgers that a run would write.

Every function here builds the ledger the run would record (``Ledger.homogeneous`` /
``Ledger.from_schedule``, the same constructors the engine's ledger is compared with) and asks
the accountant for its ε, then bisects a monotone parameter (CONTRIBUTING.md, privacy rule 2: no
second formula for
"the ε this run will spend"). Each search is bracketed first; a target that no admissible value
reaches raises a ValueError that says what to change.

Monotonicity used: ε falls as σ grows (or a schedule's scale s grows), and rises with q and with
the number of steps. Every result is on the safe side: its ledger spends at most the target.

Rigorous accountants only: noise that training uses is calibrated with PLD or RDP. The GDP CLT
(``accountant="gdp"``) can under-report ε (at q = 256/60000, 40 epochs, target 3 it gives a σ
whose PLD ε is 4.7), so every function here refuses it unless ``approximate=True`` is passed:
an explicit opt-in for reproducing a paper's GDP calibration, whose rigorous ε the caller must
then state next to it (``dpfy calibrate --accountant gdp --approximate`` prints the PLD ε).

Bounded inputs (checked before any accountant runs, so a mistyped target fails in
milliseconds instead of allocating terabytes):

- ``target_epsilon <= MAX_TARGET_EPSILON`` (100). Above the guide's tiers (ε > 10 is "weak to
  no guarantee"), ε = 100 already allows a likelihood ratio of e^100; larger targets only drive
  σ towards 0, where PLD's grid explodes (``dpfy calibrate --target-epsilon 200 --accountant
  pld`` took over a minute, ``dpfy train --epsilon 1e9`` asked for 3.6 TiB). Give a fixed σ
  instead if such a run is really wanted.
- with ``accountant="pld"``, σ (or every σ of a scaled schedule) must stay above the PLD floor
  :func:`dpfy.privacy.accountants.pld_min_noise_multiplier` (0.293 at the 1e-4 grid); a target
  only reachable below it raises and points to RDP.

Speed (PLD): :func:`calibrate_noise_multiplier` brackets σ with RDP over the integer orders (closed
form, ~30 ms per σ; RDP's σ is an upper end, PLD being tighter), then searches on the coarse PLD
grid (:data:`PLD_SEARCH_DISCRETIZATION` = 1e-3, about 8x faster per evaluation than the 1e-4 grid
the run's ε is stated on), stepping just past each interpolated σ so that one evaluation closes the
bracket (4-6 PLD evaluations). The search stays on the safe side: dp_accounting's pessimistic
"connect the dots" PLD (Doroshenko et al. 2022, Algorithm 1) matches the mechanism's privacy
profile δ(ε) at the grid points, multiples of the interval, and interpolates it linearly in e^ε
between them; δ(ε) is convex in e^ε, so interpolating through fewer points (every 1e-3 is also a
1e-4 point) lies above interpolating through more. The coarse PLD therefore dominates the fine one
step by step, hence also after composition, and the σ whose coarse ε meets the target has a fine ε
(and a true ε) at most the target. The price is a σ up to ~0.2 % larger than a fine-grid search
gives (q = 256/60000, 9,400 steps, ε = 3: 0.8726 against 0.8720). Each evaluation is cached per
(q, σ) (:mod:`dpfy.privacy.pld`) and per ledger (:mod:`dpfy.privacy.accountants`).

The searches live beside this module along their seams, and are re-exported here: the bounds on
their inputs and the keywords that name their target in :mod:`dpfy.privacy.calibration_inputs`,
the one search over ``parameter → ledger`` in :mod:`dpfy.privacy.search`, the sampling kinds
that build those ledgers in :mod:`dpfy.privacy.events`, σ for identical steps in
:mod:`dpfy.privacy.sigma_calibration`, schedules and HyFreeDP in
:mod:`dpfy.privacy.calibration_schedule`; the sample rate and the number of steps below.
"""

from __future__ import annotations

from typing import Callable, Unpack

from dpfy.privacy.calibration_inputs import (
    MAX_NOISE_MULTIPLIER,
    MAX_TARGET_EPSILON,
    MIN_TARGET_EPSILON,
    PLD_SEARCH_DISCRETIZATION,
    SampledTargetKeywords,
    Target,
    TargetKeywords,
    UserTargetKeywords,
    check_noise_multiplier,
    check_rate,
    check_rigorous,
    check_steps,
    shows_keywords,
    target_from,
    unreachable,
)
from dpfy.privacy.calibration_schedule import calibrate_schedule_scale, hyfree_noise_split
from dpfy.privacy.ledger import Ledger
from dpfy.privacy.search import Search, calibrate, last_passing
from dpfy.privacy.sigma_calibration import (
    calibrate_noise_multiplier,
    calibrate_run_noise_multiplier,
    calibrate_sigma,
    kind_from,
    sigma_for,
)
from dpfy.privacy.split import (
    combine_noise_multipliers,
    gaussian_remainder,
    quantile_noise_split,
    split_noise_multiplier,
)

__all__ = [
    "calibrate",
    "calibrate_noise_multiplier",
    "calibrate_sigma",
    "calibrate_run_noise_multiplier",
    "sigma_for",
    "Target",
    "TargetKeywords",
    "SampledTargetKeywords",
    "UserTargetKeywords",
    "calibrate_sample_rate",
    "calibrate_steps",
    "calibrate_schedule_scale",
    "hyfree_noise_split",
    "gaussian_remainder",
    "split_noise_multiplier",
    "quantile_noise_split",
    "combine_noise_multipliers",
    "last_passing",
    "MAX_TARGET_EPSILON",
    "MIN_TARGET_EPSILON",
    "MAX_NOISE_MULTIPLIER",
    "PLD_SEARCH_DISCRETIZATION",
    "check_rigorous",
]


@shows_keywords(UserTargetKeywords)
def calibrate_sample_rate(
    *,
    noise_multiplier: float,
    steps: int,
    tol: float = 1e-3,
    **target: Unpack[UserTargetKeywords],
) -> float:
    """Largest q in (0, 1] (to relative ``tol``) whose ledger spends ≤ target.

    Multiply by the dataset size and round *down* to get a batch size. Raises if even
    q = 1e-9 (or 1/N when ``dataset_size`` is given) overspends. The target and the sampling
    are the keywords of :class:`UserTargetKeywords`, as in :func:`calibrate_noise_multiplier`:
    ``target_epsilon``, ``delta``, ``accountant="rdp"``, ``approximate=False``,
    ``sampling=Sampling.POISSON``, ``dataset_size=None``, ``max_examples_per_user=None``.
    """
    goal = target_from("calibrate_sample_rate", UserTargetKeywords, target)
    check_noise_multiplier(noise_multiplier)
    check_steps(steps)
    dataset_size = target.get("dataset_size")
    q_min = 1.0 / dataset_size if dataset_size else 1e-9
    return _largest_within(
        goal,
        lambda q: kind_from(target, q).ledger(noise_multiplier, steps),
        Search(direction="increasing", guess=0.01, tol=tol, lower=q_min, upper=1.0),
        f"reachable with the smallest sample rate {q_min:.3g}",
        "Raise the noise multiplier or the target ε, or run fewer steps",
    )


@shows_keywords(UserTargetKeywords)
def calibrate_steps(
    *,
    noise_multiplier: float,
    sample_rate: float,
    max_steps: int = 10**8,
    **target: Unpack[UserTargetKeywords],
) -> int:
    """Largest number of steps (at most ``max_steps``) whose ledger spends ≤ target (exact
    integer search). The target and the sampling are the keywords of
    :class:`UserTargetKeywords`, with the defaults of :func:`calibrate_sample_rate`.
    """
    goal = target_from("calibrate_steps", UserTargetKeywords, target)
    check_noise_multiplier(noise_multiplier)
    check_rate(sample_rate)
    kind = kind_from(target, sample_rate)
    steps = _largest_within(
        goal,
        lambda n: kind.ledger(noise_multiplier, int(n)),
        Search(direction="steps", lower=1, upper=max_steps),
        "reachable by a single step",
        "One step already overspends: raise the noise multiplier or the target ε, or lower "
        "the sample rate",
    )
    return int(steps)


def _largest_within(
    goal: Target, ledger: Callable[[float], Ledger], search: Search, constraint: str, fix: str
) -> float:
    """The largest value ``search`` admits whose ``ledger`` spends at most ``goal`` (σ held
    fixed). Its one failure is that even the smallest value overspends: "target_epsilon must
    be <constraint>", with the fix."""
    fail_low = unreachable(goal.epsilon, constraint, fix)
    return calibrate(
        ledger,
        goal.epsilon,
        goal.delta,
        goal.accountant,
        search=search,
        fail=fail_low,
        fail_low=fail_low,
    )
