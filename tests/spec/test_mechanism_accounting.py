"""Each noise mechanism of the spec produces its own accounting from σ (issue 37 item 2): its
ledger on a sampling kind, and the σ calibrated for a target, read from that ledger. Numbers
come from dp_accounting (an independent library) or from the ledger constructor the engine's
own records are compared with."""

from __future__ import annotations

import dp_accounting
import pytest
from dp_accounting import rdp as dp_rdp

from dpfy.privacy import Ledger, epsilon
from dpfy.privacy.calibration_inputs import Target
from dpfy.privacy.events import CyclicPoisson, Poisson, Shuffled
from dpfy.privacy.ledger import Sampling
from dpfy.spec.run import BandMF, Gaussian, Tree


class _ShuffleSampler:
    steps_per_epoch = 25


class _CyclicSampler:
    bands = 4


def _dp_rdp_epsilon(q: float, sigma: float, steps: int, delta: float) -> float:
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps
    )
    acc = dp_rdp.RdpAccountant()
    acc.compose(event)
    return acc.get_epsilon(delta)


def test_gaussian_ledger_is_the_poisson_subsampled_gaussian():
    ledger = Gaussian(noise_multiplier=1.1).ledger(Poisson(0.01), 500)
    assert epsilon(ledger, delta=1e-5, accountant="rdp") == pytest.approx(
        _dp_rdp_epsilon(0.01, 1.1, 500, 1e-5), rel=1e-9
    )


def test_correlated_mechanisms_record_their_period():
    tree = Tree(noise_multiplier=2.0)
    period = tree.period(_ShuffleSampler())
    assert period == 25
    assert tree.ledger(Shuffled(0.04, dataset_size=1000), 50, period=period) == (
        Ledger.homogeneous(
            sample_rate=0.04,
            noise_multiplier=2.0,
            steps=50,
            sampling=Sampling.SHUFFLE,
            dataset_size=1000,
            noise="tree",
            period=25,
        )
    )
    bandmf = BandMF(noise_multiplier=1.5)
    assert bandmf.period(_CyclicSampler()) == 4
    assert bandmf.ledger(CyclicPoisson(0.2), 8, period=4) == Ledger.homogeneous(
        sample_rate=0.2,
        noise_multiplier=1.5,
        steps=8,
        sampling=Sampling.CYCLIC_POISSON,
        noise="bandmf",
        period=4,
    )
    assert Gaussian(noise_multiplier=1.0).period(_ShuffleSampler()) is None


def test_calibrated_sigma_meets_the_target_on_dp_accounting():
    # the smallest σ to relative tol 1e-3: dp_accounting's RDP ε at σ is at most the target,
    # and at σ·(1 - 2e-3) above it
    target = Target(2.0, 1e-5, "rdp")
    sigma = Gaussian().calibrated(Poisson(0.01), 1000, target).noise_multiplier
    assert sigma is not None
    assert _dp_rdp_epsilon(0.01, sigma, 1000, 1e-5) <= 2.0
    assert _dp_rdp_epsilon(0.01, sigma * (1 - 2e-3), 1000, 1e-5) > 2.0


def test_an_uncalibrated_mechanism_is_refused_by_name():
    with pytest.raises(ValueError, match="noise_multiplier must be set before"):
        Tree().ledger(Shuffled(0.1), 10, period=10)
