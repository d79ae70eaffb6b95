"""RDP / PLD / GDP accountants on ledgers.

Expected numbers come from the guide (Ponomareva et al. 2023, §4.2.2 footnote 19 and Appendix C),
from dp_accounting called directly, or from a derivation written in the test.
"""

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting import pld as dp_pld
from dp_accounting import rdp as dp_rdp

from dpfy.privacy import Ledger, Release, Sampling, delta, epsilon, epsilon_curve
from dpfy.privacy.canonical import shuffle_participations
from dpfy.privacy.split import quantile_noise_split

# The guide's running example: N = 1e6, B = 5000, σ = 1, δ = 1e-6, 200 steps per epoch.
Q, SIGMA, DELTA = 0.005, 1.0, 1e-6


@pytest.mark.parametrize("accountant, epochs, expected, tol", [
    ("rdp", 1, 1.2, 0.02), ("rdp", 100, 4.95, 0.01),       # guide footnote 19 / App. C.1
    ("pld", 1, 0.59, 0.01), ("pld", 100, 4.62, 0.015)])     # guide footnote 19 / App. C.2
def test_guide_running_example(accountant, epochs, expected, tol):
    ledger = Ledger.homogeneous(sample_rate=Q, noise_multiplier=SIGMA, steps=200 * epochs)
    assert epsilon(ledger, delta=DELTA, accountant=accountant) == pytest.approx(expected, abs=tol)


def _dp_rdp(event, delta, relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE):
    acc = dp_rdp.RdpAccountant(neighboring_relation=relation)
    acc.compose(event)
    return acc.get_epsilon(delta)


def _dp_pld(event, delta, disc=1e-4):
    acc = dp_pld.PLDAccountant(value_discretization_interval=disc)
    acc.compose(event)
    return acc.get_epsilon(delta)


def _poisson(q, sigma, steps):
    return dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)


@pytest.mark.parametrize("seed", range(4))
def test_homogeneous_equals_dp_accounting(seed):
    rng = np.random.default_rng(seed)
    q = float(rng.uniform(0.001, 0.05))
    sigma = float(rng.uniform(0.7, 3.0))
    steps = int(rng.integers(1, 3000))
    d = float(10 ** rng.uniform(-7, -4))
    ledger = Ledger.homogeneous(sample_rate=q, noise_multiplier=sigma, steps=steps)
    assert epsilon(ledger, delta=d, accountant="rdp") == pytest.approx(
        _dp_rdp(_poisson(q, sigma, steps), d), rel=1e-9)
    assert epsilon(ledger, delta=d, accountant="pld") == pytest.approx(
        _dp_pld(_poisson(q, sigma, steps), d), rel=1e-9)


def test_heterogeneous_equals_dp_accounting_and_order_does_not_matter():
    qs = [0.01, 0.02, 0.01, 0.005]
    sigmas = [1.0, 1.3, 0.9, 2.0]
    counts = [50, 20, 30, 100]
    ledger, reordered = Ledger(), Ledger()
    for q, s, c in zip(qs, sigmas, counts):
        ledger.record_step(sampling=Sampling.POISSON, sample_rate=q,
                           releases=[Release("gradient", s)], count=c)
    for q, s, c in reversed(list(zip(qs, sigmas, counts))):
        reordered.record_step(sampling=Sampling.POISSON, sample_rate=q,
                              releases=[Release("gradient", s)], count=c)
    direct = dp_accounting.ComposedDpEvent([_poisson(q, s, c) for q, s, c in
                                            zip(qs, sigmas, counts)])
    for acc, ref in (("rdp", _dp_rdp(direct, 1e-5)), ("pld", _dp_pld(direct, 1e-5))):
        a = epsilon(ledger, delta=1e-5, accountant=acc)
        b = epsilon(reordered, delta=1e-5, accountant=acc)
        assert a == pytest.approx(ref, rel=1e-3)
        assert a == pytest.approx(b, rel=1e-6)


def test_all_equal_schedule_equals_homogeneous():
    sched = Ledger.from_schedule(sample_rates=[0.01] * 300, noise_multipliers=[1.1] * 300)
    homo = Ledger.homogeneous(sample_rate=0.01, noise_multiplier=1.1, steps=300)
    assert len(sched.step_groups) == 1
    for acc in ("rdp", "pld", "gdp"):
        assert epsilon(sched, delta=1e-5, accountant=acc) == epsilon(homo, delta=1e-5,
                                                                     accountant=acc)


@pytest.mark.parametrize("accountant", ["rdp", "pld", "gdp"])
def test_monotone_in_q_steps_sigma(accountant):
    def eps(q=0.01, s=1.0, t=200):
        return epsilon(Ledger.homogeneous(sample_rate=q, noise_multiplier=s, steps=t),
                       delta=1e-5, accountant=accountant)
    base = eps()
    assert eps(q=0.02) > base and eps(t=400) > base and eps(s=1.5) < base


def test_coarsened_ledger_never_reports_less():
    # A decay schedule with 8 distinct σ's: exact vs rounded-down grids (each distinct σ is a
    # PLD to build; 20 took 2.5× the time and claim no more).
    sigmas = np.geomspace(2.0, 0.9, 8).repeat(25)
    ledger = Ledger.from_schedule(sample_rates=[0.01] * len(sigmas), noise_multipliers=sigmas)
    for acc in ("rdp", "pld"):
        exact = epsilon(ledger, delta=1e-5, accountant=acc, sigma_resolution=None,
                        value_discretization=1e-3)
        for r in (0.02, 0.2):
            coarse = epsilon(ledger, delta=1e-5, accountant=acc, sigma_resolution=r,
                             value_discretization=1e-3)
            assert coarse >= exact
        assert epsilon(ledger, delta=1e-5, accountant=acc, sigma_resolution=0.01,
                       value_discretization=1e-3) <= exact * 1.05


def test_composed_releases_equal_one_gaussian():
    # Two releases on one batch at σ_g and σ_q are one Gaussian at (σ_g⁻² + σ_q⁻²)^(-1/2)
    # (Galli et al. 2024, Proposition 1); dp_accounting's RDP of the recorded composed event agrees.
    sg, sq = 1.2, 4.0
    both = Ledger()
    both.record_step(sampling=Sampling.POISSON, sample_rate=0.01,
                     releases=[Release("gradient", sg), Release("threshold_gradient", sq)],
                     count=100)
    one = Ledger.homogeneous(sample_rate=0.01, noise_multiplier=(sg ** -2 + sq ** -2) ** -0.5,
                             steps=100)
    for acc in ("rdp", "pld", "gdp"):
        assert epsilon(both, delta=1e-5, accountant=acc) == pytest.approx(
            epsilon(one, delta=1e-5, accountant=acc), rel=1e-9)
    assert epsilon(both, delta=1e-5) == pytest.approx(
        _dp_rdp(both.dp_event(), 1e-5), rel=1e-9)


def test_quantile_split_spends_the_same_as_plain_dpsgd():
    # The split's contract: Poisson(q, Composed([G(σ_Δ), G(2σ_b)])) spends what Poisson(q, G(σ))
    # does.
    sigma, sigma_b = 1.0, 12.8
    sigma_grad = quantile_noise_split(sigma, sigma_b)
    split = dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
        0.01, dp_accounting.ComposedDpEvent([dp_accounting.GaussianDpEvent(sigma_grad),
                                             dp_accounting.GaussianDpEvent(2 * sigma_b)])), 500)
    assert _dp_rdp(split, 1e-5) == pytest.approx(_dp_rdp(_poisson(0.01, sigma, 500), 1e-5),
                                                 rel=1e-9)


def test_fixed_size_sampling_is_replace_one_without_replacement():
    n, b, steps = 10_000, 100, 300
    # σ = 2 (not 1): the PLDs at σ/2 = 1 build ~3× quicker than at 0.5; the claim is any σ's
    ledger = Ledger.homogeneous(sample_rate=b / n, noise_multiplier=2.0, steps=steps,
                                sampling=Sampling.FIXED_SIZE, dataset_size=n)
    assert ledger.adjacency() == "replace_one"
    # dp_accounting's sampling-without-replacement RDP takes σ relative to the replace-one
    # sensitivity, which is twice the per-example clip: σ/2.
    ref = _dp_rdp(dp_accounting.SelfComposedDpEvent(dp_accounting.SampledWithoutReplacementDpEvent(
        n, b, dp_accounting.GaussianDpEvent(1.0)), steps), 1e-5,
        dp_accounting.NeighboringRelation.REPLACE_ONE)
    assert epsilon(ledger, delta=1e-5, accountant="rdp") == pytest.approx(ref, rel=1e-9)
    # PLD: the Poisson mixture pair at σ/2 (Balle et al. 2018 Thm 10), by derivation.
    assert epsilon(ledger, delta=1e-5, accountant="pld") == pytest.approx(
        _dp_pld(_poisson(b / n, 1.0, steps), 1e-5), rel=1e-9)
    with pytest.raises(ValueError, match="dataset_size"):
        epsilon(Ledger.homogeneous(sample_rate=0.01, noise_multiplier=1.0, steps=3,
                                   sampling=Sampling.FIXED_SIZE), delta=1e-5)


def test_shuffle_charges_one_unamplified_replace_one_release_per_epoch():
    # 3 epochs of shuffled batches (q = 0.01, 100 steps/epoch), σ = 1: each example is in one
    # batch per epoch; replace-one doubles the sensitivity -> 3 Gaussians at σ/2 = one
    # Gaussian at 0.5/√3 (by hand).
    ledger = Ledger.homogeneous(sample_rate=0.01, noise_multiplier=1.0, steps=300,
                                sampling=Sampling.SHUFFLE, dataset_size=10_000)
    ref = dp_accounting.GaussianDpEvent(0.5 / math.sqrt(3))
    assert epsilon(ledger, delta=1e-5, accountant="rdp") == pytest.approx(_dp_rdp(ref, 1e-5),
                                                                          rel=1e-9)
    assert epsilon(ledger, delta=1e-5, accountant="pld") == pytest.approx(_dp_pld(ref, 1e-5),
                                                                          rel=1e-3)
    # Heterogeneous σ: the 3 participations are charged at the 3 smallest σ's.
    sched = Ledger.from_schedule(sample_rates=[0.01] * 300,
                                 noise_multipliers=np.linspace(3.0, 1.0, 300),
                                 sampling=Sampling.SHUFFLE)
    smallest = sorted(np.linspace(3.0, 1.0, 300))[:3]
    ref = dp_accounting.GaussianDpEvent(sum((s / 2) ** -2 for s in smallest) ** -0.5)
    assert epsilon(sched, delta=1e-5) == pytest.approx(_dp_rdp(ref, 1e-5), rel=1e-9)


def test_shuffle_participation_count():
    # drop_last with N = 1000, b = 300: an epoch is 3 steps, so 7 steps touch 3 epochs.
    assert shuffle_participations([(0.3, 7)]) == 3
    assert shuffle_participations([(0.01, 100)]) == 1
    assert shuffle_participations([(0.01, 101)]) == 2
    # a change of batch size mid-run may start mid-epoch: one more
    assert shuffle_participations([(0.01, 100), (0.02, 50)]) == 3


def test_mixed_adjacencies_are_refused():
    ledger = Ledger()
    ledger.record_step(sampling=Sampling.POISSON, sample_rate=0.01,
                       releases=[Release("gradient", 1.0)])
    ledger.record_step(sampling=Sampling.SHUFFLE, sample_rate=0.01,
                       releases=[Release("gradient", 1.0)])
    with pytest.raises(ValueError, match="separately"):
        epsilon(ledger, delta=1e-5)


def test_non_private_and_empty():
    ledger = Ledger.homogeneous(sample_rate=0.01, noise_multiplier=0.0, steps=5)
    for acc in ("rdp", "pld", "gdp"):
        assert epsilon(ledger, delta=1e-5, accountant=acc) == math.inf
        assert epsilon(Ledger(), delta=1e-5, accountant=acc) == 0.0
        assert delta(ledger, epsilon=1.0, accountant=acc) == 1.0


@pytest.mark.parametrize("accountant", ["rdp", "pld", "gdp"])
def test_delta_inverts_epsilon(accountant):
    ledger = Ledger.homogeneous(sample_rate=0.01, noise_multiplier=1.0, steps=500)
    eps = epsilon(ledger, delta=1e-5, accountant=accountant)
    assert delta(ledger, epsilon=eps, accountant=accountant) == pytest.approx(1e-5, rel=0.05)


@pytest.mark.parametrize("accountant", ["rdp", "pld", "gdp"])
def test_epsilon_curve(accountant):
    ledger = Ledger.from_schedule(sample_rates=[0.01] * 200,
                                  noise_multipliers=np.linspace(1.5, 1.0, 200))
    curve = epsilon_curve(ledger, delta=1e-5, accountant=accountant, num_points=8)
    steps = [t for t, _ in curve]
    values = [e for _, e in curve]
    assert steps[-1] == 200 and len(curve) == 8
    assert all(b >= a for a, b in zip(values, values[1:]))
    final = epsilon(ledger, delta=1e-5, accountant=accountant)
    assert values[-1] == pytest.approx(final, rel=0.01)   # PLD curves use 1e-3 discretization
    assert values[-1] >= final * (1 - 1e-9)
    mid = epsilon(ledger.prefix(steps[3]), delta=1e-5, accountant=accountant)
    assert values[3] == pytest.approx(mid, rel=0.01)


@pytest.mark.parametrize("call", [
    lambda: epsilon(Ledger(), delta=1.0), lambda: epsilon(Ledger(), delta=0.0),
    lambda: delta(Ledger(), epsilon=0.0), lambda: epsilon(Ledger(), delta=1e-5, accountant="x"),
    lambda: Ledger.homogeneous(sample_rate=1.5, noise_multiplier=1.0, steps=1),
    lambda: Ledger.homogeneous(sample_rate=0.0, noise_multiplier=1.0, steps=1),
    lambda: Ledger.homogeneous(sample_rate=0.1, noise_multiplier=-1.0, steps=1),
    lambda: Ledger.homogeneous(sample_rate=0.1, noise_multiplier=1.0, steps=0)])
def test_bad_input_names_the_problem(call):
    with pytest.raises(ValueError, match=r"must be .*, got"):
        call()


@pytest.mark.parametrize("sampling, epochs, expected, tol", [
    # reference points computed with dp_accounting 0.6 (RDP; not in the guide) in the guide's
    # Appendix C setting N = 1e6, B = 5000, δ = 1e-6, with σ = 1 relative to the replace-one
    # sensitivity 2C, i.e. noise std 2C: in dpfy's convention (σ relative to C) that is σ = 2.
    (Sampling.FIXED_SIZE, 1, 1.347, 0.001), (Sampling.FIXED_SIZE, 100, 9.427, 0.001),
    # no amplification, one participation per epoch at σ = 1 per participation
    (Sampling.SHUFFLE, 1, 5.22, 0.01), (Sampling.SHUFFLE, 100, 100.7, 0.1)])
def test_digest_reference_points_without_poisson(sampling, epochs, expected, tol):
    ledger = Ledger.homogeneous(sample_rate=0.005, noise_multiplier=2.0, steps=200 * epochs,
                                sampling=sampling, dataset_size=1_000_000)
    assert epsilon(ledger, delta=1e-6, accountant="rdp") == pytest.approx(expected, abs=tol)
