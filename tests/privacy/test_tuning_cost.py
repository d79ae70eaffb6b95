"""Tuning cost and group privacy against the guide (Ponomareva et al. 2023): Appendix C and the
group-privacy example of §2.2."""

import numpy as np
import pytest

from dpfy.privacy import Ledger, epsilon
from dpfy.privacy.tuning import (composed_runs, exponential_mechanism_epsilon, group_privacy,
                                 num_trials_pmf, repeat_and_select_epsilon, sample_num_trials,
                                 tnb_gamma)

# One epoch of the guide's running example: N = 1e6, B = 5000, σ = 1, δ = 1e-6.
ONE_EPOCH = Ledger.homogeneous(sample_rate=0.005, noise_multiplier=1.0, steps=200)
DELTA = 1e-6


def test_exponential_mechanism_3_24():
    # App. C.3: 100 = (4/ε')·ln(100·100/ε'), ε_tuning = 8ε' = 3.24 (pure arithmetic, ±0.005)
    assert exponential_mechanism_epsilon(num_candidates=100, tolerance_examples=100,
                                         failure_probability=0.01) == pytest.approx(3.24,
                                                                                    abs=0.005)


@pytest.mark.parametrize("distribution, mean, expected, tol", [
    # The guide fixes λ̂ = 10.29 where dp_accounting optimises it, so dpfy is slightly lower;
    # tolerances cover the gap to dp_accounting 0.6 (2.4118, 2.7403, 3.4419, 4.1801).
    ("logarithmic", 100, 2.42, 0.02),     # App. C.4.1, TNB η = 0
    ("geometric", 100, 2.76, 0.03),       # App. C.4.2, η = 1, mean 100
    ("geometric", 1000, 3.45, 0.02),      # App. C.4.2, η = 1, mean 1000
    ("poisson", 100, 4.18, 0.01),         # App. C.4.3, RDP single run
])
def test_repeat_and_select_appendix_c(distribution, mean, expected, tol):
    got = repeat_and_select_epsilon(ONE_EPOCH, delta=DELTA, mean=mean, distribution=distribution)
    assert got == pytest.approx(expected, abs=tol)


def test_poisson_with_pld_single_run_is_much_better():
    # App. C.4.3 with a PLD single run: the guide reports 2.63; its construction is not fully
    # specified (an independent reconstruction with dp_accounting, RDP at each λ plus
    # μ·δ̂_PLD(ε̂ = ln(1 + 1/(λ−1))) + ln μ/(λ−1), gives 2.487, the method dpfy uses). Check the
    # method's properties: far below the RDP variant and not above the guide's value.
    rdp = repeat_and_select_epsilon(ONE_EPOCH, delta=DELTA, mean=100, distribution="poisson")
    pld = repeat_and_select_epsilon(ONE_EPOCH, delta=DELTA, mean=100, distribution="poisson",
                                    single_run_delta="pld")
    assert pld < 2.63 < rdp
    assert pld == pytest.approx(2.487, abs=0.02)


def test_trial_distributions():
    # App. C.4.1: γ = 0.00154212, P[K=1] = 0.154; P[K<50] ≈ 0.68 by the stated pmf (the guide's
    # "60 %" does not follow from its own pmf)
    assert tnb_gamma(100, 0) == pytest.approx(0.00154212, abs=1e-8)
    assert num_trials_pmf(1, mean=100, distribution="logarithmic") == pytest.approx(0.154,
                                                                                  abs=5e-4)
    assert num_trials_pmf(np.arange(1, 50), mean=100,
                          distribution="logarithmic").sum() == pytest.approx(0.68, abs=0.005)
    # App. C.4.2: geometric mean 100: γ = 0.01, P[K<50] = 0.39; mean 1000: P[K<100] = 0.094
    assert tnb_gamma(100, 1) == pytest.approx(0.01, rel=1e-9)
    assert num_trials_pmf(np.arange(1, 50), mean=100,
                          distribution="geometric").sum() == pytest.approx(0.39, abs=0.002)
    assert num_trials_pmf(np.arange(1, 100), mean=1000,
                          distribution="geometric").sum() == pytest.approx(0.094, abs=0.001)


@pytest.mark.parametrize("distribution, shape", [("logarithmic", None), ("geometric", None),
                                                 ("truncated_negative_binomial", 0.5),
                                                 ("poisson", None)])
def test_sampler_mean(distribution, shape):
    rng = np.random.default_rng(12345)
    draws = [sample_num_trials(rng, mean=20, distribution=distribution, shape=shape)
             for _ in range(20000)]
    assert np.mean(draws) == pytest.approx(20, rel=0.05)
    if distribution != "poisson":
        assert min(draws) >= 1


def test_composed_runs_equal_more_epochs():
    # 100 runs of one epoch compose to the 100-epoch ledger: RDP 4.95, PLD 4.62 (App. C.1, C.2)
    runs = composed_runs(ONE_EPOCH, 100)
    assert runs.num_steps == 20000 and len(runs.step_groups) == 1
    assert epsilon(runs, delta=DELTA, accountant="rdp") == pytest.approx(4.95, abs=0.01)


def test_group_privacy():
    # §1.4: k = 20, (2, 1e-24) → the guide's (40, 4.7e-6) via k·e^{kε}·δ; dpfy's bound is
    # δ·Σ_{i<k} e^{iε} (derivation: apply the DP inequality k times), never above it.
    eps, delta = group_privacy(2.0, 1e-24, group_size=20)
    assert eps == 40
    assert delta == pytest.approx(1e-24 * sum(np.exp(2.0 * i) for i in range(20)), rel=1e-9)
    assert delta <= 20 * np.exp(40) * 1e-24 == pytest.approx(4.708e-6, rel=1e-3)
    assert group_privacy(1.0, 1e-6, group_size=1) == (1.0, pytest.approx(1e-6))


def test_bad_tuning_input():
    with pytest.raises(ValueError, match="distribution"):
        repeat_and_select_epsilon(ONE_EPOCH, delta=DELTA, mean=10, distribution="uniform")
    with pytest.raises(ValueError, match="shape"):
        repeat_and_select_epsilon(ONE_EPOCH, delta=DELTA, mean=10,
                                  distribution="truncated_negative_binomial")
    with pytest.raises(ValueError, match="mean"):
        repeat_and_select_epsilon(ONE_EPOCH, delta=DELTA, mean=1, distribution="geometric")
    with pytest.raises(ValueError, match="group_size"):
        group_privacy(1.0, 1e-6, group_size=0)
