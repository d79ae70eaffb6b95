"""The privacy cost of hyperparameter tuning, and group privacy.

Tuning on private data is a data access the guarantee must cover (Ponomareva et al. 2023, §5.4.2 and
Appendix C). dpfy offers the options the guide compares:

- :func:`composed_runs`: k runs composed (RDP or PLD composition of their ledgers). Always valid,
  also for adaptive (e.g. Bayesian) tuning.
- :func:`calibrate_grid_noise_multiplier`: the per-grid budget of Galli et al. 2024's protocol
(after
  Mohapatra et al. 2022): σ such that *all* ``runs`` runs of a grid, composed, spend the target
  ε; each run gets the budget of one run out of ``runs``. :func:`log_grid` is OSO-DPSGD's grid
  (``np.logspace`` with both endpoints included).
- :func:`repeat_and_select_epsilon`: Papernot & Steinke (2022): run a *random* number K of
  trials, each with a configuration drawn independently (with replacement) from a fixed list,
  and release only the best. K is logarithmic (η = 0), geometric (η = 1), truncated negative
  binomial (η > 0) or Poisson. Uses dp_accounting's ``RepeatAndSelectDpEvent`` (present in
  dp_accounting 0.6.0's ``dp_event`` module, not re-exported at its top level) in the RDP
  accountant. For Poisson, a PLD-derived δ̂ of the single run may replace the RDP one (PS22
  Theorem 6 needs any (ε̂, δ̂) guarantee of a run), which the guide found to be the best option.
- :func:`sample_num_trials`: draws K so that a tuner can actually follow the protocol.
- :func:`exponential_mechanism_epsilon`: the Abadi et al. (2016) selection as computed in the
  guide's Appendix C.3.

.. warning::
   The random-K and exponential-mechanism bounds assume the configurations are chosen
   non-adaptively. Adaptive or Bayesian tuning voids them; only composition still holds.

Group privacy: (ε, δ)-DP for one example implies (kε, δ·Σ_{i<k} e^{iε})-DP for groups of k
(induction on the DP inequality); the guide quotes the looser (kε, k·e^{kε}·δ) (Vadhan 2017).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal, Sequence, Unpack

import numpy as np

from dpfy._lazy import LazyModule
from dpfy._require import require
from dpfy.privacy import pld as _pld
from dpfy.privacy import rdp as _rdp
from dpfy.privacy.accountants import (
    epsilon_from_form,
    pld_discretization,
    prepare,
    prepare_form,
)
from dpfy.privacy.calibration_inputs import (
    SampledTargetKeywords,
    check_rate,
    check_steps,
    shows_keywords,
    target_from,
)
from dpfy.privacy.canonical import canonical_form, independent_runs, pass_length
from dpfy.privacy.ledger import Ledger, Sampling
from dpfy.privacy.sigma_calibration import kind_from, sigma_for

if TYPE_CHECKING:
    import dp_accounting
    from dp_accounting import dp_event as _events
    from dp_accounting.rdp import rdp_privacy_accountant as _rdp_acc
    from scipy import optimize, special, stats
else:  # imported on first read, for start-up time only (dpfy._lazy)
    dp_accounting = LazyModule("dp_accounting")
    _events = LazyModule("dp_accounting.dp_event")
    _rdp_acc = LazyModule("dp_accounting.rdp.rdp_privacy_accountant")
    optimize = LazyModule("scipy.optimize")
    special = LazyModule("scipy.special")
    stats = LazyModule("scipy.stats")

__all__ = [
    "DISTRIBUTIONS",
    "composed_runs",
    "grid_epsilon",
    "log_grid",
    "calibrate_grid_noise_multiplier",
    "repeat_and_select_epsilon",
    "tnb_gamma",
    "num_trials_pmf",
    "sample_num_trials",
    "exponential_mechanism_epsilon",
    "group_privacy",
]

Distribution = Literal["logarithmic", "geometric", "truncated_negative_binomial", "poisson"]
DISTRIBUTIONS = ("logarithmic", "geometric", "truncated_negative_binomial", "poisson")


def _shape(distribution: str, shape: float | None) -> float:
    require(
        distribution in DISTRIBUTIONS, "distribution", distribution, f"one of {list(DISTRIBUTIONS)}"
    )
    if distribution == "truncated_negative_binomial":
        require(
            shape is not None and 0 < shape < math.inf,
            "shape",
            shape,
            "a positive finite η for the truncated negative binomial",
            "η = 0 is 'logarithmic', η = 1 is 'geometric'",
        )
        return float(shape)  # type: ignore[arg-type]
    return {"logarithmic": 0.0, "geometric": 1.0, "poisson": math.inf}[distribution]


def composed_runs(single_run: Ledger, runs: int) -> Ledger:
    """The ledger of ``runs`` independent runs of ``single_run``, one after another.

    Exact for runs whose steps do not depend on where a pass or a tree starts (Poisson,
    user-level, fixed-size, unsampled steps). A shuffled or correlated run restarts its passes
    and its tree, which one ledger of the steps end to end cannot say: such a run is refused;
    :func:`grid_epsilon` accounts the runs as independent."""
    require(isinstance(runs, int) and runs >= 1, "runs", runs, "an integer >= 1")
    restarts = {g.sampling.value for g in single_run.step_groups if g.sampling is Sampling.SHUFFLE}
    restarts |= {
        r.noise for g in single_run.step_groups for r in g.releases if r.noise != "gaussian"
    }
    require(
        runs == 1 or not restarts,
        "single_run",
        f"a ledger with {sorted(restarts)} steps",
        "a ledger whose steps do not restart with each run (shuffled passes and correlated "
        "noise do)",
        "Use grid_epsilon([single_run] * runs, ...), which accounts each run on its own",
    )
    out = Ledger(single_run.dataset_size)
    for _ in range(runs):
        out.extend(single_run)
    return out


def grid_epsilon(ledgers: Sequence[Ledger], *, delta: float, accountant: str = "pld") -> float:
    """ε(δ) of a grid's runs: the accountant's ε of all their ledgers composed, one after another.

    This is what a per-grid budget (Galli et al. 2024) spends; it is never computed as k·ε_run
    (that is only a looser bound). The runs must be on the same private dataset (same N).
    """
    require(len(ledgers) >= 1, "ledgers", len(ledgers), "at least one run's ledger")
    sizes = {ledger.dataset_size for ledger in ledgers}
    require(
        len(sizes) == 1,
        "ledgers",
        sorted(sizes, key=str),
        "runs on one dataset (one dataset size)",
        "A grid's runs train on the same private examples",
    )
    units = {ledger.unit() for ledger in ledgers if ledger.step_groups}
    require(
        len(units) <= 1,
        "ledgers",
        sorted(units),
        "runs of one unit of privacy (examples or users)",
        "A grid's ε is stated for one unit: tune user-level and example-level runs apart",
    )
    # each run on its own (a grid's run restarts its sampler's passes and its tree), composed;
    # σ's rounded down as epsilon() rounds a long schedule's (safe side, and fast)
    form = independent_runs([canonical_form(ledger) for ledger in ledgers])
    form = prepare_form(form, accountant=accountant)
    return epsilon_from_form(form, delta=delta, accountant=accountant)


def log_grid(lo: float, hi: float, num: int) -> np.ndarray:
    """``num`` values log-uniformly spaced from 10**lo to 10**hi, both included (``np.logspace``).

    Galli et al. 2024: ``log_grid(-2.5, 1.5, 7)`` is its learning-rate grid (0.0031623 …
    31.6227766) and ``log_grid(-2, 2, 7)`` its clipping-threshold grid (0.01 … 100).
    """
    require(
        isinstance(lo, (int, float)) and math.isfinite(lo),
        "lo",
        lo,
        "a finite exponent (the grid starts at 10**lo)",
    )
    require(
        isinstance(hi, (int, float)) and math.isfinite(hi),
        "hi",
        hi,
        "a finite exponent (the grid ends at 10**hi)",
    )
    require(
        isinstance(num, int) and not isinstance(num, bool) and num >= 1,
        "num",
        num,
        "an integer >= 1",
    )
    return np.logspace(lo, hi, num)


@shows_keywords(SampledTargetKeywords)
def calibrate_grid_noise_multiplier(
    *,
    sample_rate: float,
    steps: int,
    runs: int,
    tol: float = 1e-3,
    **target: Unpack[SampledTargetKeywords],
) -> float:
    """Smallest σ (to relative ``tol``) such that ``runs`` runs of ``steps`` steps spend ≤ target.

    The per-grid budget of Galli et al. 2024 (Mohapatra et al. 2022): a grid of ``runs``
    configurations, each trained with noise multiplier σ for ``steps`` identical steps at
    ``sample_rate``, is one data access; its runs, each accounted on its own and composed
    (:func:`grid_epsilon`: a shuffled run restarts its passes), spend at most ``target_epsilon``
    at ``delta`` at the σ returned (the result is on the safe side, as in
    :func:`dpfy.privacy.calibration.calibrate_noise_multiplier`, whose other arguments this
    shares). ``runs=1`` is that function's answer. Seeds of one configuration are not charged by
    Galli et al.'s protocol; if they are released or selected on, count them in ``runs``.
    The target and the sampling are the keywords of
    :class:`~dpfy.privacy.calibration_inputs.SampledTargetKeywords`: ``target_epsilon``,
    ``delta``, ``accountant="rdp"``, ``approximate=False``, ``sampling=Sampling.POISSON``,
    ``dataset_size=None``.

    Galli et al. 2024's settings (ε = 3, δ = 1e-5, q = 0.008533, T = 1172, RDP): σ = 1.358 for 7
    runs, 2.683 for 35, 3.141 for 49 (one run: 0.837).
    """
    goal = target_from("calibrate_grid_noise_multiplier", SampledTargetKeywords, target)
    check_rate(sample_rate)
    check_steps(steps)
    require(
        isinstance(runs, int) and not isinstance(runs, bool) and runs >= 1,
        "runs",
        runs,
        "an integer >= 1 (the number of configurations in the grid)",
    )
    kind = kind_from(target, sample_rate)
    # ``runs`` runs of ``steps`` identical steps spend what runs·steps identical steps do
    # (Poisson, user-level, fixed-size: one atom of runs·steps releases), so the grid's σ is
    # the one σ search's for them. A shuffled run starts a fresh pass, so each run makes
    # ⌈steps/L⌉ participations: as many as one run of ⌈steps/L⌉ whole passes, runs times.
    total = steps * runs
    if kind.sampling is Sampling.SHUFFLE:
        length = pass_length(sample_rate)
        total = -(-steps // length) * length * runs
    return sigma_for(
        kind,
        total,
        goal,
        tol=tol,
        unreachable_fix="Raise the target ε or δ, use a smaller grid (fewer runs), or lower the "
        "sample rate or the number of steps",
    )


def tnb_gamma(mean: float, shape: float) -> float:
    """γ of the truncated negative binomial with shape η whose mean is ``mean``.

    E[K] = η(1 − γ)/(γ(1 − γ^η)) for η > 0 and (1/γ − 1)/ln(1/γ) for η = 0 (PS22 §2;
    Ponomareva et al. 2023, Appendix C). Mean 100: γ = 0.00154212 (η = 0), 0.01 (η = 1).
    """
    require(mean > 1, "mean", mean, "> 1")
    require(0 <= shape < math.inf, "shape", shape, ">= 0 and finite")

    def mean_of(gamma: float) -> float:
        if shape == 0:
            return (1 / gamma - 1) / math.log(1 / gamma)
        return shape * (1 - gamma) / (gamma * -math.expm1(shape * math.log(gamma)))

    return float(
        optimize.brentq(lambda g: mean_of(g) - mean, 1e-15, 1 - 1e-12, xtol=1e-16, rtol=1e-14)
    )


def num_trials_pmf(
    k: np.ndarray | int, *, mean: float, distribution: Distribution, shape: float | None = None
) -> np.ndarray:
    """P[K = k] of the number of trials (k ≥ 1; k = 0 is possible only for Poisson)."""
    eta = _shape(distribution, shape)
    k = np.asarray(k, dtype=float)
    if math.isinf(eta):
        return stats.poisson.pmf(k, mean)
    gamma = tnb_gamma(mean, eta)
    if eta == 0:
        return np.where(k >= 1, (1 - gamma) ** k / (np.maximum(k, 1) * math.log(1 / gamma)), 0.0)
    log_p = (
        special.gammaln(k + eta)
        - special.gammaln(k + 1)
        - special.gammaln(eta)
        + eta * math.log(gamma)
        + k * math.log1p(-gamma)
        - math.log1p(-(gamma**eta))
    )
    return np.where(k >= 1, np.exp(log_p), 0.0)


def sample_num_trials(
    rng: np.random.Generator, *, mean: float, distribution: Distribution, shape: float | None = None
) -> int:
    """Draw the number of tuning trials K (pass an explicitly seeded generator)."""
    require(
        isinstance(rng, np.random.Generator),
        "rng",
        type(rng).__name__,
        "a numpy Generator",
        "Use numpy.random.default_rng(seed)",
    )
    eta = _shape(distribution, shape)
    if math.isinf(eta):
        return int(rng.poisson(mean))
    gamma = tnb_gamma(mean, eta)
    if eta == 0:
        return int(rng.logseries(1 - gamma))
    while True:  # negative binomial conditioned on K >= 1
        k = int(rng.negative_binomial(eta, gamma))
        if k >= 1:
            return k


def repeat_and_select_epsilon(
    single_run: Ledger,
    *,
    delta: float,
    mean: float,
    distribution: Distribution,
    shape: float | None = None,
    single_run_delta: Literal["rdp", "pld"] = "rdp",
) -> float:
    """ε(δ) of running ``single_run`` a random number K of times and releasing only the best.

    Args:
      single_run: the ledger of one training run.
      delta: target δ.
      mean: E[K], the expected number of trials (> 1).
      distribution: law of K: ``"logarithmic"`` (η=0), ``"geometric"`` (η=1),
        ``"truncated_negative_binomial"`` (η = ``shape``) or ``"poisson"``.
      single_run_delta: for ``"poisson"`` only: where the single run's δ̂ at
        ε̂ = ln(1 + 1/(λ − 1)) comes from. "rdp" is dp_accounting's construction (guide: 4.18 in
        Appendix C); "pld" uses the tighter PLD δ̂ (guide: 2.63; dpfy gets ≈2.49, see docs).

    RDP of the result (PS22 Theorems 2 and 6): TNB: ε'_λ = ε_λ + (1+η)(1 − 1/λ̂)ε̂ +
    (1+η)ln(1/γ)/λ̂ + ln E[K]/(λ − 1), minimised over λ̂; Poisson: ε'_λ = ε_λ + E[K]·δ̂ +
    ln E[K]/(λ − 1). Then converted to (ε, δ).
    """
    eta = _shape(distribution, shape)
    require(mean > 1, "mean", mean, "> 1", "The expected number of trials must exceed one")
    require(0 < delta < 1, "delta", delta, "in (0, 1)")
    require(
        single_run_delta in ("rdp", "pld"), "single_run_delta", single_run_delta, "'rdp' or 'pld'"
    )
    form = prepare(single_run, accountant="rdp", sigma_resolution=None)
    if form.non_private:
        return math.inf
    if single_run_delta == "pld":
        require(
            math.isinf(eta),
            "single_run_delta",
            single_run_delta,
            "'rdp' unless the distribution is 'poisson'",
            "PS22's TNB theorem needs the single run's RDP curve, not an (ε̂, δ̂) pair",
        )
        orders = _rdp.ORDERS
        rdp = _rdp.rdp_curve(form)
        pld = _pld.build(form, pld_discretization(form))
        out = np.full_like(orders, np.inf)
        for i, lam in enumerate(orders):
            if lam <= 1:
                continue
            eps_hat = math.log1p(1 / (lam - 1))
            d_hat = float(pld.get_delta_for_epsilon(eps_hat))
            out[i] = rdp[i] + mean * d_hat + math.log(mean) / (lam - 1)
        eps, _ = _rdp_acc.compute_epsilon(orders, out, delta)
        return float(eps)
    relation = (
        dp_accounting.NeighboringRelation.REPLACE_ONE
        if form.adjacency == "replace_one"
        else dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
    )
    acc = _rdp_acc.RdpAccountant(orders=list(_rdp.ORDERS), neighboring_relation=relation)
    acc.compose(_events.RepeatAndSelectDpEvent(form.dp_event(), float(mean), eta))
    return float(acc.get_epsilon(delta))


def exponential_mechanism_epsilon(
    *, num_candidates: int = 100, tolerance_examples: float = 100, failure_probability: float = 0.01
) -> float:
    """ε of selecting the best of K trained candidates with the exponential mechanism.

    The guide's Appendix C.3 (after Abadi et al. 2016, App. D): the selected candidate is within
    ``tolerance_examples`` validation examples of the best with probability 1 − β when
    tolerance = (4/ε′)·ln(K/(β·ε′)); the tuning cost is ε_tuning = 8ε′, and the total is
    max(ε_single_run, ε_tuning). With K = 100, 100 examples (1 % of 10,000) and β = 0.01 it is
    3.24.
    """
    require(num_candidates >= 1, "num_candidates", num_candidates, ">= 1")
    require(tolerance_examples > 0, "tolerance_examples", tolerance_examples, "> 0")
    require(0 < failure_probability < 1, "failure_probability", failure_probability, "in (0, 1)")
    ratio = num_candidates / failure_probability

    def gap(e: float) -> float:
        return 4 / e * math.log(ratio / e) - tolerance_examples

    eps_prime = optimize.brentq(gap, 1e-9, ratio * (1 - 1e-12), xtol=1e-14)
    return 8 * float(eps_prime)


def group_privacy(epsilon: float, delta: float, *, group_size: int) -> tuple[float, float]:
    """(ε, δ) for groups of ``group_size`` examples: (kε, δ·(e^{kε} − 1)/(e^ε − 1)).

    This is δ·Σ_{i<k} e^{iε}, from applying the DP inequality k times; it is never above the
    guide's (kε, k·e^{kε}·δ) (Ponomareva et al. 2023, §2.2: k = 20, (2, 1e-24) → δ ≤ 4.7e-6; this
    gives
    3.7e-8). It degrades fast: prefer a user-level mechanism.
    """
    require(epsilon >= 0, "epsilon", epsilon, ">= 0")
    require(0 <= delta <= 1, "delta", delta, "in [0, 1]")
    require(
        isinstance(group_size, int) and group_size >= 1, "group_size", group_size, "an integer >= 1"
    )
    k = group_size
    if epsilon == 0:
        return 0.0, min(1.0, k * delta)
    if k * epsilon > 700:
        return k * epsilon, 1.0 if delta > 0 else 0.0
    return k * epsilon, min(1.0, delta * math.expm1(k * epsilon) / math.expm1(epsilon))
