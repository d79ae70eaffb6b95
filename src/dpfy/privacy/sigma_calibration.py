"""The noise multiplier a run of identical steps needs for a target ε.

How the search is bracketed and why its σ is safe on the run's own PLD grid is told in
:mod:`dpfy.privacy.calibration` ("Speed"); the search itself is
:func:`dpfy.privacy.search.calibrate` over the ledgers that :mod:`dpfy.privacy.events` builds.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Unpack

from dpfy._require import require
from dpfy.privacy.accountants import PLD_COARSE, pld_min_noise_multiplier
from dpfy.privacy.accountants import (
    epsilon_from_form,
    pld_discretization,
    prepare,
    rdp_integer_orders_epsilon,
)
from dpfy.privacy.calibration_inputs import (
    KEYWORD_DEFAULTS,
    MAX_NOISE_MULTIPLIER,
    PLD_SEARCH_DISCRETIZATION,
    SampledTargetKeywords,
    Target,
    TargetKeywords,
    UserTargetKeywords,
    check_rate,
    check_steps,
    gdp_sigma_guess,
    pld_bracket,
    refuse_below_pld_floor,
    sigma_floor,
    shows_keywords,
    target_from,
    unreachable,
)
from dpfy.privacy.events import SamplingKind, sampling_kind
from dpfy.privacy.ledger import Sampling
from dpfy.privacy.search import Search, calibrate, solve_decreasing
from dpfy.types import RunFacts

__all__ = [
    "calibrate_noise_multiplier",
    "calibrate_sigma",
    "calibrate_run_noise_multiplier",
    "kind_from",
    "sigma_for",
]


@shows_keywords(UserTargetKeywords)
def calibrate_noise_multiplier(
    *,
    sample_rate: float,
    steps: int,
    tol: float = 1e-3,
    noise: str = "gaussian",
    period: int | None = None,
    search_discretization: float = PLD_SEARCH_DISCRETIZATION,
    **target: Unpack[UserTargetKeywords],
) -> float:
    """Smallest σ (to relative ``tol``) whose ledger of ``steps`` identical steps spends ≤ target.

    User-level runs: ``sampling=Sampling.ULS`` with the *user* rate (a Poisson-subsampled
    Gaussian at the user level), or ``Sampling.ELS`` with the example rate and
    ``max_examples_per_user=k`` (a mixture of Gaussians, :mod:`dpfy.privacy.mixture`; the
    target is then a user-level ε).

    Args:
      sample_rate: q per step (batch_size / dataset_size).
      steps: number of optimizer updates (logical batches), >= 1.
      tol: relative tolerance on σ; the returned σ is on the safe side.
      noise, period: the mechanism's correlation (:class:`~dpfy.privacy.ledger.Release`):
        ``"tree"`` with its restart length, ``"bandmf"`` with its band count.
      search_discretization: PLD only: the grid the search evaluates ε on, or the run's own
        grid where that is coarser (module docstring, "Speed"). The default 1e-3 is about 8x
        faster than the run's 1e-4; where its σ leaves more than 2·tol of the target unspent on
        the run's grid, the search is refined on that grid. 1e-4 searches on it throughout.
      **target: the target and the sampling (:class:`UserTargetKeywords`):
        ``target_epsilon`` (ε to spend, > 0) and ``delta`` (δ in (0, 1)), required;
        ``accountant="rdp"`` (``"pld"``, or ``"gdp"`` with ``approximate=True`` only);
        ``approximate=False`` (True to calibrate with ``"gdp"``, module docstring);
        ``sampling=Sampling.POISSON``, the sampler the run will use (decides amplification and
        adjacency); ``dataset_size=None`` (N, required for ``Sampling.FIXED_SIZE``);
        ``max_examples_per_user=None`` (k, for ``Sampling.ELS``).
    """
    goal = target_from("calibrate_noise_multiplier", UserTargetKeywords, target)
    return sigma_for(
        kind_from(target, sample_rate),
        steps,
        goal,
        tol=tol,
        noise=noise,
        period=period,
        search_discretization=search_discretization,
    )


@shows_keywords(TargetKeywords)
def calibrate_sigma(
    kind: SamplingKind,
    steps: int,
    *,
    tol: float = 1e-3,
    noise: str = "gaussian",
    period: int | None = None,
    search_discretization: float = PLD_SEARCH_DISCRETIZATION,
    **target: Unpack[TargetKeywords],
) -> float:
    """Smallest σ (to relative ``tol``) whose ledger of ``steps`` identical steps sampled as
    ``kind`` (:mod:`dpfy.privacy.events`) spends ≤ target: what
    :func:`calibrate_noise_multiplier` computes, with the sampling as one value. The target is
    given by the keywords of :class:`TargetKeywords`: ``target_epsilon`` and ``delta``,
    ``accountant="rdp"``, ``approximate=False``."""
    goal = target_from("calibrate_sigma", TargetKeywords, target)
    return sigma_for(
        kind,
        steps,
        goal,
        tol=tol,
        noise=noise,
        period=period,
        search_discretization=search_discretization,
    )


def kind_from(given: SampledTargetKeywords, sample_rate: float) -> SamplingKind:
    """The sampling kind at rate ``sample_rate`` that a calibrator's keyword group names, with
    its defaults: Poisson sampling, no dataset size, no cap on a user's examples (a group
    without ``max_examples_per_user``, :class:`SampledTargetKeywords`, has none)."""
    keywords = {**KEYWORD_DEFAULTS, **given}
    return sampling_kind(
        keywords["sampling"],
        sample_rate,
        dataset_size=keywords["dataset_size"],
        max_examples_per_user=keywords["max_examples_per_user"],
    )


# what to change when no σ up to MAX_NOISE_MULTIPLIER meets the target
UNREACHABLE_FIX = "Raise the target ε or δ, or lower the sample rate or the number of steps"


def sigma_for(
    kind: SamplingKind,
    steps: int,
    target: Target,
    *,
    tol: float = 1e-3,
    noise: str = "gaussian",
    period: int | None = None,
    search_discretization: float = PLD_SEARCH_DISCRETIZATION,
    unreachable_fix: str = UNREACHABLE_FIX,
) -> float:
    """The one σ search: smallest σ (to relative ``tol``) whose ledger of ``steps`` identical
    steps sampled as ``kind`` spends at most ``target`` (:class:`Target`); ``unreachable_fix``
    is the refusal's fix when no σ up to the bound meets it, in the caller's terms. The keyword
    calibrators (:func:`calibrate_noise_multiplier`, :func:`calibrate_sigma`) and every caller
    inside dpfy that needs a σ for identical steps end here."""
    target_epsilon, delta, accountant = target.epsilon, target.delta, target.accountant
    sampling, sample_rate = kind.sampling, kind.sample_rate
    target.check()
    check_rate(sample_rate)
    check_steps(steps)
    require(
        isinstance(search_discretization, float) and 0 < search_discretization <= 0.1,
        "search_discretization",
        search_discretization,
        "a float in (0, 0.1]",
    )

    fail = unreachable(
        target_epsilon,
        f"reachable with a noise multiplier below {MAX_NOISE_MULTIPLIER:g}",
        unreachable_fix,
    )

    def eps_rdp_integer_orders(sigma: float) -> float:
        plain = sampling_kind(sampling, sample_rate, dataset_size=kind.dataset_size)
        return rdp_integer_orders_epsilon(plain.ledger(sigma, steps), delta=delta)

    floor = sigma_floor(accountant, sampling)
    guess = gdp_sigma_guess(target_epsilon, delta, sample_rate, steps)
    bracket = None
    if sampling is Sampling.ELS:
        # σ/k is what the PLD grid sees (the dominating pair's noise multiplier); RDP's bound
        # (cheap) is a safe upper end for PLD's σ, which is never above it
        k = int(kind.max_examples_per_user or 1)
        floor = pld_min_noise_multiplier(PLD_COARSE) * k if accountant == "pld" else 0.0
        guess = max(guess * k, floor * 1.01)
        if accountant == "pld":
            rdp = Target(target_epsilon, delta, "rdp")
            rdp_sigma = sigma_for(replace(kind, dataset_size=None), steps, rdp, tol=tol)
            if rdp_sigma < floor:
                refuse_below_pld_floor(target_epsilon, floor)
            bracket = (max(rdp_sigma / 2, floor), rdp_sigma)
    if accountant == "pld" and sampling in (Sampling.POISSON, Sampling.ULS):
        rdp_sigma = _rdp_upper_end(eps_rdp_integer_orders, target_epsilon, guess, fail)
        bracket = pld_bracket(target_epsilon, guess, rdp_sigma, floor)

    def search(bracket: tuple[float, float] | None, discretization: float | None) -> float:
        return calibrate(
            lambda sigma: kind.ledger(sigma, steps, noise=noise, period=period),
            target_epsilon,
            delta,
            accountant,
            search=Search(
                guess=guess if bracket is None else bracket[1],
                tol=tol,
                bracket=bracket,
                lower=floor,
                upper=MAX_NOISE_MULTIPLIER,
                straddle=accountant == "pld",
                discretization=discretization,
            ),
            fail=fail,
            fail_low=lambda: refuse_below_pld_floor(target_epsilon, floor),
        )

    sigma = search(bracket, search_discretization)
    if accountant != "pld":
        return sigma
    # The coarse grid's pessimism grows with the number of steps and weighs more at small ε
    # (q = 0.004, 20,000 steps, target 1: its σ spends 0.974 on the run's grid, 1 % more noise
    # than needed). When the run's own grid shows more slack than the tolerance, search again
    # on that grid below the coarse σ (safe: it meets the target there).
    form = prepare(kind.ledger(sigma, steps, noise=noise, period=period), accountant=accountant)
    grid = pld_discretization(form)
    if grid >= search_discretization:
        return sigma  # the search already read the run's own grid
    fine = epsilon_from_form(form, delta=delta, accountant=accountant, value_discretization=grid)
    if fine < target_epsilon * (1 - 2 * tol):
        sigma = search((max(sigma * 0.9, floor), sigma), None)
    return sigma


def _rdp_upper_end(
    eps_rdp: Callable[[float], float], target: float, guess: float, fail: Callable[[], None]
) -> float:
    """A σ whose RDP ε (integer orders, :data:`dpfy.privacy.rdp.INTEGER_ORDERS`) meets the
    target, to 2 %: the upper end of a PLD search's bracket. PLD is tighter, so it meets the
    target there too; the search checks that before using it. Integer orders and 2 % keep this
    to a few closed-form evaluations (~30 ms each), where the RDP accountant's fractional orders
    cost up to 0.3 s per σ at large σ or q."""
    return solve_decreasing(
        eps_rdp, target, guess, rel_tol=0.02, x_max=MAX_NOISE_MULTIPLIER, fail=fail
    )


def calibrate_run_noise_multiplier(facts: RunFacts) -> float:
    """σ that spends ``facts.target_epsilon`` at ``facts.delta`` over ``facts.steps`` identical
    steps of this run: its accountant, sampling, dataset size and k (ELS), as
    :func:`calibrate_noise_multiplier` computes it. The caller checks the budget is given."""
    assert facts.target_epsilon is not None and facts.delta is not None  # the caller checked
    assert facts.steps is not None  # the caller checked
    kind = sampling_kind(
        facts.sampling,
        facts.sample_rate,
        dataset_size=facts.dataset_size,
        max_examples_per_user=facts.max_examples_per_user,
    )
    return sigma_for(kind, facts.steps, Target(facts.target_epsilon, facts.delta, facts.accountant))
