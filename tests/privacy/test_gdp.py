"""Gaussian DP conversions and the CLT accountant against independently computed numbers.

Expected values: computed with scipy from Eqs. (1), (7) and (9) of Dynamic DP-SGD (anonymous
submission, under review), independently of dpfy, and Bu et al. 2020's 0.23-GDP example
(TF-Privacy docstring).
"""

import math

import pytest

from dpfy.privacy import gdp
from dpfy.privacy import Ledger, epsilon


def test_delta_for_epsilon_digest_value():
    # Eq. (1), computed with scipy: δ(ε=1, μ=1) = 0.126937
    assert gdp.delta_for_epsilon(1.0, 1.0) == pytest.approx(0.126937, abs=1e-6)


@pytest.mark.parametrize("mu, eps", [(1.0, 4.377178), (0.5, 1.993091)])
def test_epsilon_for_delta_digest_values(mu, eps):
    # Eq. (1) solved for ε with scipy: ε(μ=1, δ=1e-5) = 4.377178; ε(μ=0.5, δ=1e-5) = 1.993091
    assert gdp.epsilon_for_delta(1e-5, mu) == pytest.approx(eps, abs=1e-6)


@pytest.mark.parametrize("eps, delta, mu", [
    (0.4, 1 / 600000, 0.103633), (0.6, 1 / 600000, 0.151166), (1.2, 1 / 600000, 0.287288),
    (2.0, 1 / 600000, 0.458784), (0.5, 4e-6, 0.134194), (1, 4e-6, 0.254282),
    (3, 4e-6, 0.688185), (6, 4e-6, 1.260937), (9, 4e-6, 1.774381), (0.4, 1e-5, 0.115881),
    (1.2, 1e-5, 0.316379)])
def test_mu_for_epsilon_table(eps, delta, mu):
    # Eq. (1) solved for μ with scipy, the μ_tot table
    got = gdp.mu_for_epsilon(eps, delta)
    assert got == pytest.approx(mu, abs=1e-6)
    assert gdp.epsilon_for_delta(delta, got) == pytest.approx(eps, rel=1e-8)


def test_bu_et_al_mnist_example():
    # Bu et al. 2020: N = 60000, batch 256, σ = 1.3, 15 epochs is 0.23-GDP; with the
    # (non-integer) T = 15·60000/256 Eq. (7) gives 0.227274. With whole steps:
    p, steps = 256 / 60000, 3516
    expected = p * math.sqrt(steps * math.expm1(1 / 1.3 ** 2))  # Eq. (7), written out
    assert gdp.mu_total(p, [1 / 1.3] * steps) == pytest.approx(expected, rel=1e-12)
    assert expected == pytest.approx(0.227274, abs=2e-5)


def test_heterogeneous_mu_total_is_eq9():
    mus = [0.5, 0.7, 0.9]
    expected = 0.01 * math.sqrt(sum(math.expm1(m * m) for m in mus))  # Eq. (9) by hand
    assert gdp.mu_total(0.01, mus) == pytest.approx(expected, rel=1e-12)


def test_gdp_accountant_reads_heterogeneous_poisson_ledger():
    sigmas = [1.5, 1.2, 1.0, 0.9]
    ledger = Ledger.from_schedule(sample_rates=[0.01] * 4, noise_multipliers=sigmas)
    mu = gdp.mu_total(0.01, [1 / s for s in sigmas])
    assert epsilon(ledger, delta=1e-5, accountant="gdp") == pytest.approx(
        gdp.epsilon_for_delta(1e-5, mu), rel=1e-10)


def test_gdp_under_reports_for_small_sigma():
    # The CLT is an approximation that under-reports ε for small σ (Gopi et al. 2021): PLD, an
    # upper bound, is above it here.
    ledger = Ledger.homogeneous(sample_rate=0.01, noise_multiplier=0.6, steps=500)
    assert epsilon(ledger, delta=1e-5, accountant="gdp") < epsilon(ledger, delta=1e-5,
                                                                   accountant="pld")


@pytest.mark.parametrize("call", [
    lambda: gdp.mu_total(0.0, [1.0]), lambda: gdp.mu_total(1.5, [1.0]),
    lambda: gdp.mu_total(0.1, []), lambda: gdp.mu_total(0.1, [-1.0]),
    lambda: gdp.epsilon_for_delta(1.0, 1.0), lambda: gdp.epsilon_for_delta(0.0, 1.0),
    lambda: gdp.mu_for_epsilon(0.0, 1e-5), lambda: gdp.mu_for_epsilon(1.0, 1.0)])
def test_bad_input_raises(call):
    with pytest.raises(ValueError, match="must be"):
        call()
