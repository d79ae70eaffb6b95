"""Per-grid budgets (issue 11; Galli, Palamidessi & Cucinotta 2024, Experiments: the grid-search
protocol, its k log-uniform grid points and a budget per grid): log_grid, grid σ, `--grid-runs`.

ε checks here use dp_accounting directly on the composed events, not dpfy's accountants.
`dpfy calibrate --grid-runs`: tests/cli/test_grid_budget_cli.py.
"""

import dp_accounting
import numpy as np
import pytest

from dpfy.privacy.calibration import calibrate_noise_multiplier
from dpfy.privacy.ledger import Ledger, Release, Sampling
from dpfy.privacy.tuning import calibrate_grid_noise_multiplier, grid_epsilon, log_grid

# Galli et al. 2024 Table 1, Fashion-MNIST (and MNIST): q = 512/60000, T = round(10·60000/512);
# δ = 1e-5 (the paper does not state δ), RDP.
Q, T, DELTA, EPS = 0.008533, 1172, 1e-5, 3.0
TOL = 1e-3      # calibrate_grid_noise_multiplier's default relative tolerance on σ


def _rdp_epsilon(sigma: float, total_steps: int, q: float = Q) -> float:
    """dp_accounting's RDP ε of ``total_steps`` Poisson-subsampled Gaussian steps."""
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)),
                total_steps)
    return acc.get_epsilon(DELTA)


def test_log_grid_matches_002_section_4_6():
    np.testing.assert_allclose(
        log_grid(-2.5, 1.5, 7),
        [0.0031623, 0.0146780, 0.0681292, 0.3162278, 1.4677993, 6.8129207, 31.6227766],
        rtol=0, atol=5.1e-8)
    np.testing.assert_allclose(
        log_grid(-2, 2, 7),
        [0.01, 0.0464159, 0.2154435, 1, 4.6415888, 21.5443469, 100], rtol=0, atol=5.1e-8)
    np.testing.assert_array_equal(log_grid(-2, 2, 5), np.logspace(-2, 2, 5))
    assert list(log_grid(0, 3, 1)) == [1.0]


@pytest.mark.parametrize("bad", [dict(lo=0, hi=1, num=0), dict(lo=0, hi=1, num=2.0),
                                 dict(lo=float("nan"), hi=1, num=3)])
def test_log_grid_refuses_bad_input(bad):
    with pytest.raises(ValueError):
        log_grid(**bad)


@pytest.mark.parametrize("runs, paper_sigma", [(7, 1.358), (35, 2.683), (49, 3.141)])
def test_grid_sigma_matches_002_derived_noise_multipliers(runs, paper_sigma):
    sigma = calibrate_grid_noise_multiplier(target_epsilon=EPS, delta=DELTA, sample_rate=Q,
                                            steps=T, runs=runs, accountant="rdp")
    assert sigma == pytest.approx(paper_sigma, rel=0.01)
    # The whole grid's ledger spends at most the target, and σ is the smallest such value to
    # within the search tolerance (σ/(1 + tol) overspends), both by dp_accounting directly.
    assert _rdp_epsilon(sigma, runs * T) <= EPS
    assert _rdp_epsilon(sigma / (1 + TOL), runs * T) > EPS
    assert _rdp_epsilon(sigma, runs * T) == pytest.approx(EPS, rel=2e-3)


def test_one_run_is_the_ordinary_calibration():
    kwargs = dict(target_epsilon=EPS, delta=DELTA, sample_rate=Q, steps=T)
    assert calibrate_grid_noise_multiplier(runs=1, **kwargs) == pytest.approx(
        calibrate_noise_multiplier(**kwargs), rel=TOL)
    assert calibrate_grid_noise_multiplier(runs=1, **kwargs) == pytest.approx(0.837, rel=0.01)


def test_pld_grid_sigma_is_safe_and_below_rdp():
    rdp = calibrate_grid_noise_multiplier(target_epsilon=EPS, delta=DELTA, sample_rate=Q,
                                          steps=T, runs=7, accountant="rdp")
    pld = calibrate_grid_noise_multiplier(target_epsilon=EPS, delta=DELTA, sample_rate=Q,
                                          steps=T, runs=7, accountant="pld")
    assert pld < rdp
    acc = dp_accounting.pld.PLDAccountant(dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
                                          value_discretization_interval=1e-4)
    acc.compose(dp_accounting.PoissonSampledDpEvent(Q, dp_accounting.GaussianDpEvent(pld)),
                7 * T)
    assert acc.get_epsilon(DELTA) <= EPS * (1 + 1e-3)


def test_gdp_is_refused_unless_approximate():
    kwargs = dict(target_epsilon=EPS, delta=DELTA, sample_rate=Q, steps=T, runs=7,
                  accountant="gdp")
    with pytest.raises(ValueError, match="approximate"):
        calibrate_grid_noise_multiplier(**kwargs)
    assert calibrate_grid_noise_multiplier(approximate=True, **kwargs) > 0


@pytest.mark.parametrize("runs", [0, 2.5, True])
def test_bad_runs_are_refused(runs):
    with pytest.raises(ValueError, match="runs"):
        calibrate_grid_noise_multiplier(target_epsilon=EPS, delta=DELTA, sample_rate=Q,
                                        steps=T, runs=runs)


def test_unreachable_target_says_what_to_change():
    with pytest.raises(ValueError, match="fewer runs"):
        calibrate_grid_noise_multiplier(target_epsilon=1e-3, delta=1e-12, sample_rate=1.0,
                                        steps=10 ** 6, runs=10, accountant="rdp")


def test_grid_epsilon_composes_every_run_as_dp_accounting_does():
    # Three runs with different ledgers (one with two releases per step, as OSO writes): the
    # grid's ε is dp_accounting's on all their events composed, here built by hand: a step
    # releasing σ₁ and σ₂ on one Poisson sample is one Gaussian with σ = (σ₁⁻² + σ₂⁻²)^(−1/2)
    # (tests/ledger_events.py).
    runs = [Ledger.homogeneous(sample_rate=0.01, noise_multiplier=1.1, steps=300,
                               dataset_size=5000),
            Ledger.homogeneous(sample_rate=0.02, noise_multiplier=1.5, steps=200,
                               dataset_size=5000)]
    oso = Ledger(5000)
    oso.record_step(sampling=Sampling.POISSON, sample_rate=0.01, count=250,
                    releases=(Release("gradient", 1.2), Release("threshold_gradient", 8.0)))
    runs.append(oso)
    sigma_oso = (1.2 ** -2 + 8.0 ** -2) ** -0.5
    acc = dp_accounting.rdp.RdpAccountant()
    for q, sigma, steps in ((0.01, 1.1, 300), (0.02, 1.5, 200), (0.01, sigma_oso, 250)):
        acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)),
                    steps)
    assert grid_epsilon(runs, delta=DELTA, accountant="rdp") == pytest.approx(
        acc.get_epsilon(DELTA), rel=1e-6)
    # Composition, not k·ε_run: three copies of a run spend less than three times its ε.
    one = grid_epsilon(runs[:1], delta=DELTA, accountant="rdp")
    assert one < grid_epsilon(runs[:1] * 3, delta=DELTA, accountant="rdp") < 3 * one


def test_grid_epsilon_refuses_runs_on_different_datasets():
    a = Ledger.homogeneous(sample_rate=0.01, noise_multiplier=1.0, steps=5, dataset_size=100)
    b = Ledger.homogeneous(sample_rate=0.01, noise_multiplier=1.0, steps=5, dataset_size=200)
    with pytest.raises(ValueError, match="one dataset"):
        grid_epsilon([a, b], delta=DELTA)
    with pytest.raises(ValueError, match="at least one"):
        grid_epsilon([], delta=DELTA)


def _gaussian_rdp_epsilon(sigma: float, count: int, delta: float) -> float:
    """dp_accounting's RDP ε of ``count`` unsampled Gaussian releases at noise multiplier σ."""
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.GaussianDpEvent(sigma), count)
    return acc.get_epsilon(delta)


@pytest.mark.parametrize("runs", [3, 10])
def test_a_shuffled_grid_counts_a_pass_per_run(runs):
    # q = 0.01: a pass is L = 100 steps; each of the grid's runs of T = 50 steps starts a fresh
    # pass, so one example can take part once in every run: `runs` participations, each an
    # unsampled Gaussian at σ/2 (replace-one adjacency: sensitivity 2C). The runs' steps end to
    # end read as ⌈runs·50/100⌉ participations (5 for 10 runs), which undercounted ε (4.44 at
    # the σ it gave, against a target of 3).
    from dpfy.privacy.tuning import composed_runs

    q, steps, delta, target = 0.01, 50, 1e-5, 3.0
    sigma = calibrate_grid_noise_multiplier(
        target_epsilon=target, delta=delta, sample_rate=q, steps=steps, runs=runs,
        accountant="rdp", sampling=Sampling.SHUFFLE)
    spent = _gaussian_rdp_epsilon(sigma / 2, runs, delta)
    assert spent <= target
    assert _gaussian_rdp_epsilon(sigma / (1 + TOL) / 2, runs, delta) > target  # the smallest σ
    one = Ledger.homogeneous(sample_rate=q, noise_multiplier=sigma, steps=steps,
                             sampling=Sampling.SHUFFLE)
    assert grid_epsilon([one] * runs, delta=delta, accountant="rdp") == pytest.approx(
        spent, rel=1e-9)
    with pytest.raises(ValueError, match=r"Use grid_epsilon"):
        composed_runs(one, runs)  # one ledger cannot say where a shuffled run restarts


def test_runs_of_whole_passes_are_the_same_either_way():
    # T a multiple of L: every run ends at a pass boundary, so the runs' steps end to end make
    # as many participations as the runs do apart
    q, delta = 0.01, 1e-5
    one = Ledger.homogeneous(sample_rate=q, noise_multiplier=2.0, steps=300,
                             sampling=Sampling.SHUFFLE)
    assert grid_epsilon([one] * 4, delta=delta, accountant="rdp") == pytest.approx(
        _gaussian_rdp_epsilon(1.0, 12, delta), rel=1e-9)


def test_one_run_grid_is_the_run_even_for_a_long_schedule():
    # a schedule of 100 distinct σ's: epsilon() rounds them down to its grid (safe side, fast);
    # the grid's ε of that one run must be the same number, not a slower exact one
    from dpfy.privacy import epsilon

    sigmas = np.linspace(1.0, 2.0, 100)
    run = Ledger.from_schedule(sample_rates=[0.01] * 100, noise_multipliers=list(sigmas))
    for accountant in ("rdp", "pld"):
        assert grid_epsilon([run], delta=DELTA, accountant=accountant) == pytest.approx(
            epsilon(run, delta=DELTA, accountant=accountant), rel=1e-12)


def test_a_grid_of_two_units_is_refused():
    # one ε for user-level and example-level runs together states neither guarantee
    users = Ledger.homogeneous(sample_rate=0.1, noise_multiplier=1.0, steps=10,
                               sampling=Sampling.ULS)
    examples = Ledger.homogeneous(sample_rate=0.1, noise_multiplier=1.0, steps=10)
    with pytest.raises(ValueError, match="one unit of privacy"):
        grid_epsilon([users, examples], delta=DELTA, accountant="rdp")
