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
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from dpfy._require import require
from dpfy.types import ReleaseSpec, RunFacts, StepPlan
from dpfy.privacy import gdp
from dpfy.privacy.accountants import (
    DEFAULT_RESOLUTION,
    PLD_COARSE,
    PLD_FINE,
    check_accountant,
    epsilon,
    epsilon_from_form,
    pld_discretization,
    pld_min_noise_multiplier,
    prepare,
    rdp_integer_orders_epsilon,
)
from dpfy.privacy.ledger import Ledger, Release, Sampling
from dpfy.privacy.releases import step_releases
from dpfy.privacy.split import (
    combine_noise_multipliers,
    gaussian_remainder,
    quantile_noise_split,
    split_noise_multiplier,
)

__all__ = [
    "calibrate_noise_multiplier",
    "calibrate_run_noise_multiplier",
    "calibrate_sample_rate",
    "calibrate_steps",
    "calibrate_schedule_scale",
    "hyfree_noise_split",
    "gaussian_remainder",
    "split_noise_multiplier",
    "quantile_noise_split",
    "combine_noise_multipliers",
    "MAX_TARGET_EPSILON",
    "MIN_TARGET_EPSILON",
    "MAX_NOISE_MULTIPLIER",
    "PLD_SEARCH_DISCRETIZATION",
    "check_rigorous",
]

MAX_NOISE_MULTIPLIER = 1e4
MAX_TARGET_EPSILON = 100.0
# Below this, σ is so large that the accountants' ε underflows (dp_accounting's RDP returns 0
# for "negative Rényi divergence" at σ ~ 1e6): a calibration there would trust a rounding error.
MIN_TARGET_EPSILON = 1e-3
# The PLD grid a σ search evaluates ε on (module docstring, "Speed"): coarser than the run's
# 1e-4, pessimistic, so the σ found is safe on the run's grid too.
PLD_SEARCH_DISCRETIZATION = PLD_COARSE


def check_rigorous(accountant: str, approximate: bool) -> None:
    """Refuse the GDP approximation for a calibration unless ``approximate=True`` opts in."""
    check_accountant(accountant)
    require(
        accountant != "gdp" or approximate is True,
        "accountant",
        accountant,
        "'pld' or 'rdp' for a calibration (GDP is a CLT approximation that can under-report ε)",
        "Use accountant='pld'; to reproduce a paper's GDP calibration pass "
        "approximate=True (CLI: --approximate) and state the rigorous PLD ε next to it",
    )


def _check_common(
    target_epsilon: float, delta: float, accountant: str, approximate: bool = False
) -> None:
    require(
        isinstance(target_epsilon, (int, float)) and 0 < target_epsilon < math.inf,
        "target_epsilon",
        target_epsilon,
        "> 0 and finite",
    )
    require(
        target_epsilon <= MAX_TARGET_EPSILON,
        "target_epsilon",
        target_epsilon,
        f"<= {MAX_TARGET_EPSILON:g} (larger ε is no meaningful guarantee and drives σ to 0)",
        "Lower the target ε, or give a fixed noise multiplier instead of a target",
    )
    require(
        target_epsilon >= MIN_TARGET_EPSILON,
        "target_epsilon",
        target_epsilon,
        f">= {MIN_TARGET_EPSILON:g} (below it the accountants' ε underflows to 0 and a "
        f"calibration would rest on rounding error)",
        "Raise the target ε; ε < 0.001 is indistinguishable from not training",
    )
    require(
        isinstance(delta, (int, float)) and 0 < delta < 1,
        "delta",
        delta,
        "in (0, 1)",
        "The guide's convention is δ ≪ 1/N, e.g. 1/N^1.1",
    )
    check_rigorous(accountant, approximate)


def _sigma_floor(accountant: str, sampling: Sampling) -> float:
    """Smallest σ a calibration may try: PLD's grid floor for sampled steps, else 0."""
    if accountant == "pld" and sampling is not Sampling.NONE:
        return pld_min_noise_multiplier(PLD_FINE)
    return 0.0


def _below_pld_floor(target_epsilon: float, floor: float) -> None:
    require(
        False,
        "target_epsilon",
        target_epsilon,
        f"reachable with a noise multiplier >= {floor:.3g} (the PLD accountant's floor)",
        "Lower the target ε, or calibrate with accountant 'rdp' (--accountant rdp)",
    )


def _check_rate(sample_rate: float) -> None:
    require(
        isinstance(sample_rate, (int, float)) and 0 < sample_rate <= 1,
        "sample_rate",
        sample_rate,
        "in (0, 1]",
        "Use batch_size / dataset_size",
    )
    # (μ/q)² in the search's starting guess overflows below this; no dataset is that large
    require(
        sample_rate >= 1e-100,
        "sample_rate",
        sample_rate,
        ">= 1e-100",
        "Use batch_size / dataset_size",
    )


def _check_steps(steps: int) -> None:
    require(isinstance(steps, int) and steps >= 1, "steps", steps, "an integer >= 1")


def last_passing(ok: Callable[[int], bool], lo: int, hi: int) -> int:
    """Largest integer n in [lo, hi) with ok(n), by bisection.

    ``ok`` must hold up to some n and fail after it (e.g. "ε after n steps ≤ target"), with
    ok(lo) true and ok(hi) false, or taken as such: neither end is evaluated.
    """
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def _solve_decreasing(
    eps: Callable[[float], float],
    target: float,
    x0: float,
    *,
    rel_tol: float,
    x_max: float,
    fail: Callable[[], None],
    bracket: tuple[float, float] | None = None,
    x_min: float = 0.0,
    fail_low: Callable[[], None] | None = None,
    straddle: bool = False,
) -> float:
    """Smallest x > 0 (to relative ``rel_tol``, on the safe side) with eps(x) <= target.

    With ``x_min > 0`` no x below it is evaluated: if eps(x_min) already meets the target (the
    answer lies below x_min), ``fail_low`` is called (it must raise).

    ``straddle=True`` (for expensive ``eps``, PLD) moves each interpolated point by 0.45·rel_tol
    towards the bracket end that is farther from it: once the interpolation is accurate to
    about rel_tol/2, one evaluation then lands on that end's side and closes the bracket, where
    plain interpolation tends to land on the near side again (two more evaluations).

    ``eps`` must be non-increasing in x. The search brackets the root around ``x0`` and then
    runs the Illinois variant of regula falsi on log ε against log x (ε is close to a power law
    in σ, so this needs a handful of accountant calls instead of ~20 bisections), falling back to
    bisection whenever an interpolation step would not shrink the bracket enough.
    """

    def f(x: float) -> float:
        v = eps(x)
        if v <= 0:
            return -math.inf
        return math.inf if math.isinf(v) else math.log(v / target)

    lo, hi = bracket if bracket is not None else (x0 / 1.25, x0 * 1.25)
    lo = max(lo, x_min)
    hi = max(hi, lo * 1.25)
    f_lo, f_hi = f(lo), f(hi)
    while f_hi > 0:
        lo, f_lo, hi = hi, f_hi, hi * 2
        if hi > x_max:
            fail()
        f_hi = f(hi)
    while f_lo <= 0:
        if lo <= x_min:
            assert fail_low is not None, "x_min needs fail_low"
            fail_low()
        hi, f_hi, lo = lo, f_lo, max(lo / 2, x_min)
        if lo < 1e-12:
            return hi
        f_lo = f(lo)
    side = 0
    while hi / lo - 1 > rel_tol:
        u_lo, u_hi = math.log(lo), math.log(hi)
        width = u_hi - u_lo
        if math.isfinite(f_lo) and math.isfinite(f_hi) and f_lo != f_hi:
            u = u_hi - f_hi * width / (f_hi - f_lo)
            u = min(max(u, u_lo + 0.02 * width), u_hi - 0.02 * width)
        else:
            u = (u_lo + u_hi) / 2
        if straddle:
            nudge = 0.45 * math.log1p(rel_tol)
            u = u + nudge if u_hi - u > u - u_lo else u - nudge
            u = min(max(u, u_lo + 0.02 * width), u_hi - 0.02 * width)
        if side == 2 or side == -2:  # two steps on one side in a row: bisect instead
            u, side = (u_lo + u_hi) / 2, 0
        x = math.exp(u)
        fx = f(x)
        if fx <= 0:
            hi, f_hi = x, fx
            f_lo = f_lo / 2 if side > 0 else f_lo
            side = side + 1 if side > 0 else 1
        else:
            lo, f_lo = x, fx
            f_hi = f_hi / 2 if side < 0 else f_hi
            side = side - 1 if side < 0 else -1
    return hi


def _homogeneous_epsilon(
    *,
    sample_rate: float,
    noise_multiplier: float,
    steps: int,
    sampling: Sampling,
    dataset_size: int | None,
    delta: float,
    accountant: str,
    max_examples_per_user: int | None = None,
    noise: str = "gaussian",
    period: int | None = None,
    search_discretization: float | None = None,
) -> float:
    """ε of the ledger of ``steps`` identical steps that a run would write.

    With PLD and ``search_discretization``, ε is evaluated on that grid or on the run's own,
    whichever is coarser (both pessimistic: the coarser one bounds the finer one's ε from
    above, module docstring), so a search never relies on a grid finer than the run's.
    """
    ledger = Ledger.homogeneous(
        sample_rate=sample_rate,
        noise_multiplier=noise_multiplier,
        steps=steps,
        sampling=sampling,
        dataset_size=dataset_size,
        max_examples_per_user=max_examples_per_user,
        noise=noise,
        period=period,
    )
    if accountant != "pld" or search_discretization is None:
        return epsilon(ledger, delta=delta, accountant=accountant)
    form = prepare(ledger, accountant=accountant)
    grid = max(float(search_discretization), pld_discretization(form))
    return epsilon_from_form(form, delta=delta, accountant=accountant, value_discretization=grid)


def _gdp_sigma_guess(target_epsilon: float, delta: float, sample_rate: float, steps: int) -> float:
    """σ that the GDP CLT gives for homogeneous Poisson steps: a starting point, not a result."""
    try:
        mu = gdp.mu_for_epsilon(target_epsilon, delta)
    except ValueError:
        return 1.0
    ratio = (mu / sample_rate) ** 2 / steps
    return 1.0 / math.sqrt(math.log1p(ratio)) if ratio > 0 else 1.0


def calibrate_noise_multiplier(
    *,
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    steps: int,
    accountant: str = "rdp",
    sampling: Sampling = Sampling.POISSON,
    dataset_size: int | None = None,
    tol: float = 1e-3,
    approximate: bool = False,
    max_examples_per_user: int | None = None,
    noise: str = "gaussian",
    period: int | None = None,
    search_discretization: float = PLD_SEARCH_DISCRETIZATION,
) -> float:
    """Smallest σ (to relative ``tol``) whose ledger of ``steps`` identical steps spends ≤ target.

    User-level runs: ``sampling=Sampling.ULS`` with the *user* rate (a Poisson-subsampled
    Gaussian at the user level), or ``Sampling.ELS`` with the example rate and
    ``max_examples_per_user=k`` (a mixture of Gaussians, :mod:`dpfy.privacy.mixture`; the
    target is then a user-level ε).

    Args:
      target_epsilon: ε to spend, > 0.
      delta: δ in (0, 1).
      sample_rate: q per step (batch_size / dataset_size).
      steps: number of optimizer updates (logical batches), >= 1.
      accountant: ``"rdp"``, ``"pld"``, or ``"gdp"`` with ``approximate=True`` only.
      sampling: the sampler the run will use (decides amplification and adjacency).
      dataset_size: N, required for ``Sampling.FIXED_SIZE``.
      tol: relative tolerance on σ; the returned σ is on the safe side.
      approximate: must be True to calibrate with ``accountant="gdp"`` (module docstring).
      noise, period: the mechanism's correlation (:class:`~dpfy.privacy.ledger.Release`):
        ``"tree"`` with its restart length, ``"bandmf"`` with its band count.
      search_discretization: PLD only: the grid the search evaluates ε on, or the run's own
        grid where that is coarser (module docstring, "Speed"). The default 1e-3 is about 8x
        faster than the run's 1e-4 and can only raise σ (by ~0.1 %); 1e-4 gives the tightest σ.
    """
    _check_common(target_epsilon, delta, accountant, approximate)
    _check_rate(sample_rate)
    _check_steps(steps)
    require(
        isinstance(search_discretization, float) and 0 < search_discretization <= 0.1,
        "search_discretization",
        search_discretization,
        "a float in (0, 0.1]",
    )

    def eps(sigma: float) -> float:
        return _homogeneous_epsilon(
            sample_rate=sample_rate,
            noise_multiplier=sigma,
            steps=steps,
            sampling=sampling,
            dataset_size=dataset_size,
            delta=delta,
            accountant=accountant,
            max_examples_per_user=max_examples_per_user,
            noise=noise,
            period=period,
            search_discretization=search_discretization,
        )

    def fail() -> None:
        require(
            False,
            "target_epsilon",
            target_epsilon,
            f"reachable with a noise multiplier below {MAX_NOISE_MULTIPLIER:g}",
            "Raise the target ε or δ, or lower the sample rate or the number of steps",
        )

    def eps_rdp_integer_orders(sigma: float) -> float:
        ledger = Ledger.homogeneous(
            sample_rate=sample_rate,
            noise_multiplier=sigma,
            steps=steps,
            sampling=sampling,
            dataset_size=dataset_size,
        )
        return rdp_integer_orders_epsilon(ledger, delta=delta)

    floor = _sigma_floor(accountant, sampling)
    guess = _gdp_sigma_guess(target_epsilon, delta, sample_rate, steps)
    bracket = None
    if sampling is Sampling.ELS:
        # σ/k is what the PLD grid sees (the dominating pair's noise multiplier); RDP's bound
        # (cheap) is a safe upper end for PLD's σ, which is never above it
        k = int(max_examples_per_user or 1)
        floor = pld_min_noise_multiplier(PLD_COARSE) * k if accountant == "pld" else 0.0
        guess = max(guess * k, floor * 1.01)
        if accountant == "pld":
            rdp_sigma = calibrate_noise_multiplier(
                target_epsilon=target_epsilon,
                delta=delta,
                sample_rate=sample_rate,
                steps=steps,
                accountant="rdp",
                sampling=sampling,
                tol=tol,
                max_examples_per_user=max_examples_per_user,
            )
            if rdp_sigma < floor:
                _below_pld_floor(target_epsilon, floor)
            bracket = (max(rdp_sigma / 2, floor), rdp_sigma)
    if accountant == "pld" and sampling in (Sampling.POISSON, Sampling.ULS):
        # PLD is tighter than RDP, so RDP's σ (cheap) is a safe upper end; the GDP CLT value is
        # usually just below PLD's. Both ends are checked by the search before they are used.
        rdp_sigma = _rdp_upper_end(eps_rdp_integer_orders, target_epsilon, guess, fail)
        if rdp_sigma < floor:  # PLD's σ is below RDP's, so below the floor too
            _below_pld_floor(target_epsilon, floor)
        bracket = (min(guess, rdp_sigma) * 0.98, rdp_sigma)
    return _solve_decreasing(
        eps,
        target_epsilon,
        guess,
        rel_tol=tol,
        x_max=MAX_NOISE_MULTIPLIER,
        fail=fail,
        bracket=bracket,
        x_min=floor,
        fail_low=lambda: _below_pld_floor(target_epsilon, floor),
        straddle=accountant == "pld",
    )


def _rdp_upper_end(
    eps_rdp: Callable[[float], float], target: float, guess: float, fail: Callable[[], None]
) -> float:
    """A σ whose RDP ε (integer orders, :data:`dpfy.privacy.rdp.INTEGER_ORDERS`) meets the
    target, to 2 %: the upper end of a PLD search's bracket. PLD is tighter, so it meets the
    target there too; the search checks that before using it. Integer orders and 2 % keep this
    to a few closed-form evaluations (~30 ms each), where the RDP accountant's fractional orders
    cost up to 0.3 s per σ at large σ or q."""
    return _solve_decreasing(
        eps_rdp, target, guess, rel_tol=0.02, x_max=MAX_NOISE_MULTIPLIER, fail=fail
    )


def calibrate_run_noise_multiplier(facts: RunFacts) -> float:
    """σ that spends ``facts.target_epsilon`` at ``facts.delta`` over ``facts.steps`` identical
    steps of this run: its accountant, sampling, dataset size and k (ELS), as
    :func:`calibrate_noise_multiplier` computes it. The caller checks the budget is given."""
    assert facts.target_epsilon is not None and facts.delta is not None  # the caller checked
    assert facts.steps is not None  # the caller checked
    return calibrate_noise_multiplier(
        target_epsilon=facts.target_epsilon,
        delta=facts.delta,
        sample_rate=facts.sample_rate,
        steps=facts.steps,
        accountant=facts.accountant,
        sampling=facts.sampling,
        dataset_size=facts.dataset_size,
        max_examples_per_user=facts.max_examples_per_user,
    )


def calibrate_sample_rate(
    *,
    target_epsilon: float,
    delta: float,
    noise_multiplier: float,
    steps: int,
    accountant: str = "rdp",
    sampling: Sampling = Sampling.POISSON,
    dataset_size: int | None = None,
    tol: float = 1e-3,
    approximate: bool = False,
    max_examples_per_user: int | None = None,
) -> float:
    """Largest q in (0, 1] (to relative ``tol``) whose ledger spends ≤ target.

    Multiply by the dataset size and round *down* to get a batch size. Raises if even
    q = 1e-9 (or 1/N when ``dataset_size`` is given) overspends. ``approximate`` as in
    :func:`calibrate_noise_multiplier`.
    """
    _check_common(target_epsilon, delta, accountant, approximate)
    require(noise_multiplier > 0, "noise_multiplier", noise_multiplier, "> 0")
    _check_steps(steps)

    def eps(q: float) -> float:
        return _homogeneous_epsilon(
            sample_rate=q,
            noise_multiplier=noise_multiplier,
            steps=steps,
            sampling=sampling,
            dataset_size=dataset_size,
            delta=delta,
            accountant=accountant,
            max_examples_per_user=max_examples_per_user,
        )

    if eps(1.0) <= target_epsilon:
        return 1.0
    q_min = 1.0 / dataset_size if dataset_size else 1e-9
    require(
        eps(q_min) <= target_epsilon,
        "target_epsilon",
        target_epsilon,
        f"reachable with the smallest sample rate {q_min:.3g}",
        "Raise the noise multiplier or the target ε, or run fewer steps",
    )

    # ε grows with q, so it falls with y = 1/q: find the smallest safe y, i.e. the largest q.
    def eps_y(y: float) -> float:
        return eps(1.0 / y) if y >= 1 else math.inf

    y = _solve_decreasing(
        eps_y, target_epsilon, 100.0, rel_tol=tol, x_max=1 / q_min * 1.0001, fail=lambda: None
    )
    return 1.0 / y


def calibrate_steps(
    *,
    target_epsilon: float,
    delta: float,
    noise_multiplier: float,
    sample_rate: float,
    accountant: str = "rdp",
    sampling: Sampling = Sampling.POISSON,
    dataset_size: int | None = None,
    max_steps: int = 10**8,
    approximate: bool = False,
    max_examples_per_user: int | None = None,
) -> int:
    """Largest number of steps whose ledger spends ≤ target (exact integer bisection).

    ``approximate`` as in :func:`calibrate_noise_multiplier`.
    """
    _check_common(target_epsilon, delta, accountant, approximate)
    require(noise_multiplier > 0, "noise_multiplier", noise_multiplier, "> 0")
    _check_rate(sample_rate)

    def ok(steps: int) -> bool:
        return (
            _homogeneous_epsilon(
                sample_rate=sample_rate,
                noise_multiplier=noise_multiplier,
                steps=steps,
                sampling=sampling,
                dataset_size=dataset_size,
                delta=delta,
                accountant=accountant,
                max_examples_per_user=max_examples_per_user,
            )
            <= target_epsilon
        )

    require(
        ok(1),
        "target_epsilon",
        target_epsilon,
        "reachable by a single step",
        "One step already overspends: raise the noise multiplier or the target ε, or lower "
        "the sample rate",
    )
    lo, hi = 1, 2
    while ok(hi):
        lo, hi = hi, hi * 2
        if hi > max_steps:
            return max_steps
    return last_passing(ok, lo, hi)


def calibrate_schedule_scale(
    *,
    shape: Sequence[float] | np.ndarray,
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    accountant: str = "pld",
    sampling: Sampling = Sampling.POISSON,
    dataset_size: int | None = None,
    tol: float = 2e-3,
    approximate: bool = False,
) -> float:
    """Smallest s such that the ledger with σ_t = s·shape[t] (one step per entry) spends ≤ target.

    ``shape`` is the schedule's form f(t) (e.g. a decay k^t), one positive value per step. Big
    heterogeneous schedules (more than 16 distinct values) are searched with σ's rounded down to
    the accountant's grid (1 % RDP, 2 % PLD; see :mod:`dpfy.privacy.accountants`), so the
    returned s is an upper bound on the exact answer: within ~1–3 % of it, and always on the
    safe side (the ledger the run writes spends at most the target). With PLD every σ_t must
    stay above the PLD floor (module docstring). ``approximate`` as in
    :func:`calibrate_noise_multiplier`.
    """
    _check_common(target_epsilon, delta, accountant, approximate)
    _check_rate(sample_rate)
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

    def fail() -> None:
        require(
            False,
            "target_epsilon",
            target_epsilon,
            "reachable by scaling the schedule",
            "Raise the target ε or δ, or shorten the run",
        )

    top = MAX_NOISE_MULTIPLIER / max(values)
    # Start where the (fast, closed-form) GDP CLT puts the answer; only the accountant's own
    # ε decides the result.
    guess = _solve_decreasing(
        eps_for("gdp"), target_epsilon, 1.0 / _mean(values), rel_tol=0.02, x_max=top, fail=fail
    )
    floor = _sigma_floor(accountant, sampling)
    if (
        floor
        and _rdp_epsilon_at(floor / min(values), values, sample_rate, sampling, dataset_size, delta)
        <= target_epsilon
    ):
        # RDP's ε bounds PLD's from above, so PLD meets the target below the floor too: refuse
        # now instead of building PLD grids at the floor.
        _below_pld_floor(target_epsilon, floor)
    return _solve_decreasing(
        eps_for(accountant),
        target_epsilon,
        guess,
        rel_tol=tol,
        x_max=top,
        fail=fail,
        x_min=floor / min(values),
        fail_low=lambda: _below_pld_floor(target_epsilon, floor),
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


def hyfree_noise_split(
    *,
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    steps: int,
    probe_every: int,
    probes_per_round: int = 3,
    gamma: float = 1.01,
    accountant: str = "rdp",
    probes_share_batch: bool = True,
    tol: float = 1e-3,
    approximate: bool = False,
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
      approximate: must be True with ``accountant="gdp"`` (the paper's own GDP accounting).
    """
    _check_common(target_epsilon, delta, accountant, approximate)
    _check_rate(sample_rate)
    _check_steps(steps)
    require(
        isinstance(probe_every, int) and probe_every >= 1,
        "probe_every",
        probe_every,
        "an integer >= 1 (K: steps between learning-rate updates)",
    )
    require(probes_per_round >= 1, "probes_per_round", probes_per_round, ">= 1")
    require(gamma > 1, "gamma", gamma, "> 1", "The paper uses γ = 1.01")
    sigma = calibrate_noise_multiplier(
        target_epsilon=target_epsilon,
        delta=delta,
        sample_rate=sample_rate,
        steps=steps,
        accountant=accountant,
        tol=tol / 4,
        approximate=approximate,
    )
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
        return epsilon(ledger_for(sigma_l), delta=delta, accountant=accountant)

    def fail() -> None:
        require(
            False,
            "gamma",
            gamma,
            "large enough to leave budget for the loss probes",
            "Raise γ, probe less often (larger probe_every) or raise the target ε",
        )

    sigma_l = _solve_decreasing(
        eps, target_epsilon, sigma_g * 2, rel_tol=tol, x_max=MAX_NOISE_MULTIPLIER, fail=fail
    )
    return sigma_g, sigma_l
