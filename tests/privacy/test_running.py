"""RunningEpsilon equals the accountants on every prefix (derivation: composition is additive)."""

import math

import numpy as np
import pytest

from dpfy.privacy import Ledger, Release, Sampling, epsilon
from dpfy.privacy.running import RunningEpsilon


@pytest.mark.parametrize("accountant, rel", [("rdp", 1e-12), ("gdp", 1e-9), ("pld", 2e-3)])
def test_running_matches_full_accounting(accountant, rel):
    sigmas = np.linspace(1.5, 0.9, 30)
    ledger = Ledger()
    running = RunningEpsilon(delta=1e-5, accountant=accountant)
    for t, s in enumerate(sigmas, 1):
        ledger.record_step(sampling=Sampling.POISSON, sample_rate=0.02,
                           releases=[Release("gradient", float(s))])
        got = running(ledger)
        if t % 10 == 0:
            assert got == pytest.approx(epsilon(ledger, delta=1e-5, accountant=accountant,
                                                sigma_resolution=None,
                                                value_discretization=1e-3), rel=rel)


def test_with_extra_does_not_commit():
    ledger = Ledger.homogeneous(sample_rate=0.01, noise_multiplier=1.0, steps=100)
    running = RunningEpsilon(delta=1e-5)
    extra = Ledger.homogeneous(sample_rate=0.01, noise_multiplier=1.0, steps=50)
    both = Ledger.homogeneous(sample_rate=0.01, noise_multiplier=1.0, steps=150)
    assert running.with_extra(ledger, extra) == pytest.approx(epsilon(both, delta=1e-5),
                                                              rel=1e-12)
    assert running(ledger) == pytest.approx(epsilon(ledger, delta=1e-5), rel=1e-12)


def test_non_private_and_shuffle_fallback():
    ledger = Ledger.homogeneous(sample_rate=0.01, noise_multiplier=1.0, steps=300,
                                sampling=Sampling.SHUFFLE)
    assert RunningEpsilon(delta=1e-5)(ledger) == epsilon(ledger, delta=1e-5)
    ledger = Ledger.homogeneous(sample_rate=0.01, noise_multiplier=0.0, steps=3)
    assert RunningEpsilon(delta=1e-5, accountant="pld")(ledger) == math.inf
