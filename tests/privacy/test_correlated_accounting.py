"""Accounting of correlated noise: amplified BandMF (b = 1 is DP-SGD exactly), tree
aggregation against dp_accounting's SingleEpochTreeAggregationDpEvent, monotonicity,
calibration and the ledger's record of both."""

import math

import dp_accounting
import pytest

from dpfy.errors import PrivacyRefusal
from dpfy.privacy import Ledger, calibrate_noise_multiplier
from dpfy.privacy.accountants import epsilon
from dpfy.privacy.ledger import Release, Sampling

DELTA = 1e-5


def _bandmf(sigma, q, steps, bands):
    return Ledger.homogeneous(sample_rate=q, noise_multiplier=sigma, steps=steps,
                              sampling=Sampling.CYCLIC_POISSON, noise="bandmf", period=bands)


def _tree(sigma, q, steps, period):
    return Ledger.homogeneous(sample_rate=q, noise_multiplier=sigma, steps=steps,
                              sampling=Sampling.SHUFFLE, dataset_size=60_000, noise="tree",
                              period=period)


def _dpsgd_epsilon(sigma, q, compositions, accountant):
    """DP-SGD by dp_accounting: Poisson-subsampled Gaussian, self-composed."""
    event = dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
        q, dp_accounting.GaussianDpEvent(sigma)), compositions)
    acc = (dp_accounting.rdp.RdpAccountant() if accountant == "rdp" else
           dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4))
    return acc.compose(event).get_epsilon(DELTA)


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_one_band_is_dp_sgd_exactly(accountant):
    ours = epsilon(_bandmf(1.1, 0.01, 700, 1), delta=DELTA, accountant=accountant)
    assert ours == pytest.approx(_dpsgd_epsilon(1.1, 0.01, 700, accountant), rel=1e-6)


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_b_bands_charge_ceil_T_over_b_participations(accountant):
    # Choquette-Choo et al. 2023: the worst group is visited ⌈T/b⌉ times, each a
    # Poisson-subsampled Gaussian at the group's rate
    ours = epsilon(_bandmf(1.3, 0.04, 1001, 8), delta=DELTA, accountant=accountant)
    assert ours == pytest.approx(_dpsgd_epsilon(1.3, 0.04, math.ceil(1001 / 8), accountant),
                                 rel=1e-6)


def test_epsilon_is_monotone_in_sigma():
    for make, args in ((_bandmf, (0.02, 400, 4)), (_tree, (0.01, 300, 100))):
        eps = [epsilon(make(s, *args), delta=DELTA, accountant="rdp")
               for s in (0.8, 1.0, 1.5, 2.5, 4.0)]
        assert all(a > b for a, b in zip(eps, eps[1:]))


def test_tree_rdp_equals_dp_accounting_single_epoch_tree_event():
    # dpfy accounts shuffled passes under replace-one adjacency: sensitivity 2Δ, so the node
    # noise is σ/2 relative to it; dp_accounting's tree event takes that ratio directly
    sigma, period, epochs = 3.0, 117, 4
    ours = epsilon(_tree(sigma, 1 / period, epochs * period, period), delta=DELTA,
                   accountant="rdp")
    acc = dp_accounting.rdp.RdpAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_SPECIAL)
    acc.compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.SingleEpochTreeAggregationDpEvent(sigma / 2, period), epochs))
    assert ours == pytest.approx(acc.get_epsilon(DELTA), rel=1e-9)


def test_partial_last_tree_is_charged_by_its_leaves():
    sigma, period = 2.0, 100
    ours = epsilon(_tree(sigma, 0.01, 130, period), delta=DELTA, accountant="rdp")
    acc = dp_accounting.rdp.RdpAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_SPECIAL)
    acc.compose(dp_accounting.SingleEpochTreeAggregationDpEvent(sigma / 2, [100]))
    acc.compose(dp_accounting.SingleEpochTreeAggregationDpEvent(sigma / 2, [30]))
    assert ours == pytest.approx(acc.get_epsilon(DELTA), rel=1e-9)


def test_calibration_hits_the_target_for_both_mechanisms():
    for sampling, noise, period, q in ((Sampling.CYCLIC_POISSON, "bandmf", 4, 0.02),
                                       (Sampling.SHUFFLE, "tree", 100, 0.01)):
        sigma = calibrate_noise_multiplier(target_epsilon=3.0, delta=DELTA, sample_rate=q,
                                           steps=500, accountant="rdp", sampling=sampling,
                                           dataset_size=60_000, noise=noise, period=period)
        ledger = Ledger.homogeneous(sample_rate=q, noise_multiplier=sigma, steps=500,
                                    sampling=sampling, dataset_size=60_000, noise=noise,
                                    period=period)
        eps = epsilon(ledger, delta=DELTA, accountant="rdp")
        assert 2.99 < eps <= 3.0


def test_ledger_round_trip_keeps_noise_and_period():
    ledger = _bandmf(1.0, 0.05, 10, 4)
    again = Ledger.from_json(ledger.to_json())
    assert again.step_groups[0].releases == (Release("gradient", 1.0, "bandmf", 4),)
    plain = Ledger.homogeneous(sample_rate=0.1, noise_multiplier=1.0, steps=3)
    assert "period" not in plain.to_json()     # DP-SGD ledgers are written as before


def test_refusals():
    with pytest.raises(ValueError, match="period"):
        Release("gradient", 1.0, "tree", None)
    gaussian_cyclic = Ledger.homogeneous(sample_rate=0.1, noise_multiplier=1.0, steps=3,
                                         sampling=Sampling.CYCLIC_POISSON)
    with pytest.raises(PrivacyRefusal, match="band count"):
        epsilon(gaussian_cyclic, delta=DELTA)
    shuffled_bandmf = Ledger.homogeneous(sample_rate=0.1, noise_multiplier=1.0, steps=3,
                                         sampling=Sampling.SHUFFLE, dataset_size=100,
                                         noise="bandmf", period=2)
    with pytest.raises(PrivacyRefusal, match="cyclic Poisson sampling only"):
        epsilon(shuffled_bandmf, delta=DELTA)
    two = Ledger(100)
    two.record_step(sampling=Sampling.SHUFFLE, sample_rate=0.1,
                    releases=[Release("gradient", 1.0, "tree", 10), Release("count", 5.0)])
    with pytest.raises(PrivacyRefusal, match="only its gradient sum"):
        epsilon(two, delta=DELTA)
