"""User-level accounting (issue 26 §2): ULS and ELS ledgers against dp_accounting.

Every expected ε is computed here with dp_accounting 0.6 directly, from the facts of the run
(q, σ, T, k), never through dpfy's canonical form:

- ULS: the user-level Poisson-subsampled Gaussian, ``PoissonSampledDpEvent(q_u, Gaussian(σ))``
  composed T times (PLD and RDP accountants);
- ELS, PLD: ``MixtureOfGaussiansDpEvent(σ, [0..k], Binomial(k, q))`` with the Binomial
  weights written out below from C(k, j) q^j (1 − q)^(k − j);
- ELS, RDP: order by order the smaller of k composed subsampled Gaussians (q, σ/√k) and the
  subsampled Gaussian (1 − (1 − q)^k, σ/k) that dominates the mixture (the bounds' derivations
  are in ``dpfy.privacy.mixture``), from dp_accounting's RDP of the subsampled Gaussian; it
  must stay above PLD's.

Both user-level guarantees must be no worse than group privacy's (kε, k·e^{kε}·δ) for k
examples of the example-level run (Vadhan 2017, Lemma 2.2).
"""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

from dpfy.privacy import Ledger, Sampling, epsilon
from dpfy.privacy.calibration import calibrate_noise_multiplier
from dpfy.privacy.ledger import Release

DELTA = 1e-5


def _pld(event, count: int, discretization: float) -> float:
    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=discretization)
    acc.compose(event, count)
    return float(acc.get_epsilon(DELTA))


def _rdp(event, count: int) -> float:
    acc = rdp_privacy_accountant.RdpAccountant()
    acc.compose(event, count)
    return float(acc.get_epsilon(DELTA))


def _binomial(k: int, q: float) -> list[float]:
    return [math.comb(k, j) * q ** j * (1 - q) ** (k - j) for j in range(k + 1)]


def test_uls_is_the_user_level_poisson_subsampled_gaussian():
    q_u, sigma, steps = 16 / 500, 1.1, 300     # 16 expected users per step out of 500
    ledger = Ledger.homogeneous(sample_rate=q_u, noise_multiplier=sigma, steps=steps,
                                sampling=Sampling.ULS, dataset_size=500)
    event = dp_accounting.PoissonSampledDpEvent(q_u, dp_accounting.GaussianDpEvent(sigma))
    assert epsilon(ledger, delta=DELTA, accountant="pld") == pytest.approx(
        _pld(event, steps, 1e-4), rel=1e-9)
    assert epsilon(ledger, delta=DELTA, accountant="rdp") == pytest.approx(
        _rdp(event, steps), rel=1e-9)
    assert ledger.adjacency() == "add_or_remove" and ledger.unit() == "user"


# σ = 4: a mixture's PLD takes seconds to build on a loaded machine (tens at σ = 2)
@pytest.mark.parametrize("k", [1, 2])
def test_els_pld_is_the_mixture_of_gaussians_with_binomial_weights(k):
    q, sigma, steps = 0.05, 4.0, 20
    ledger = Ledger.homogeneous(sample_rate=q, noise_multiplier=sigma, steps=steps,
                                sampling=Sampling.ELS, max_examples_per_user=k)
    mixture = dp_event.MixtureOfGaussiansDpEvent(sigma, list(range(k + 1)), _binomial(k, q))
    want = _pld(mixture, steps, 1e-3)        # dpfy accounts mixtures at 1e-3 ("auto")
    assert epsilon(ledger, delta=DELTA, accountant="pld") == pytest.approx(want, rel=1e-9)
    if k == 1:   # one example per user: ELS is example-level Poisson DP-SGD
        poisson = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
        assert want == pytest.approx(_pld(poisson, steps, 1e-3), rel=1e-3)


@pytest.mark.parametrize("sigma", [4.0, 0.8])   # each bound wins somewhere
def test_els_rdp_is_the_smaller_of_two_bounds_and_stays_above_pld(sigma):
    q, steps, k = 0.05, 20, 2
    ledger = Ledger.homogeneous(sample_rate=q, noise_multiplier=sigma, steps=steps,
                                sampling=Sampling.ELS, max_examples_per_user=k)
    orders = rdp_privacy_accountant.DEFAULT_RDP_ORDERS
    sgm = rdp_privacy_accountant._compute_rdp_poisson_subsampled_gaussian
    composed = k * sgm(q, sigma / math.sqrt(k), orders)
    dominating = sgm(1 - (1 - q) ** k, sigma / k, orders)
    want, _ = rdp_privacy_accountant.compute_epsilon(
        orders, steps * np.minimum(composed, dominating), DELTA)
    rdp = epsilon(ledger, delta=DELTA, accountant="rdp")
    assert rdp == pytest.approx(want, rel=1e-9)
    if sigma == 4.0:
        assert rdp >= epsilon(ledger, delta=DELTA, accountant="pld")


def test_els_without_amplification_is_the_gaussian_of_sensitivity_k():
    q, sigma, steps, k = 0.05, 4.0, 10, 3
    ledger = Ledger.homogeneous(sample_rate=q, noise_multiplier=sigma, steps=steps,
                                sampling=Sampling.ELS, max_examples_per_user=k)
    want = _pld(dp_accounting.GaussianDpEvent(sigma / k / math.sqrt(steps)), 1, 1e-4)
    assert epsilon(ledger, delta=DELTA, accountant="pld", amplify=False) == pytest.approx(
        want, rel=1e-3)


@pytest.mark.parametrize("sampling", [Sampling.ULS, Sampling.ELS])
def test_user_level_epsilon_is_no_worse_than_group_privacy(sampling):
    """At group privacy's δ_g = k·e^{kε}·δ, the user-level ε is at most kε, ε the same steps'
    example-level ε (dp_accounting, Poisson at q): what the user-level accounting buys."""
    q, sigma, steps, k = 0.05, 4.0, 20, 2
    example = _pld(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)),
                   steps, 1e-3)
    group_eps, group_delta = k * example, k * math.exp(k * example) * DELTA
    assert group_delta < 1
    extra = {"max_examples_per_user": k} if sampling is Sampling.ELS else {}
    ledger = Ledger.homogeneous(sample_rate=q, noise_multiplier=sigma, steps=steps,
                                sampling=sampling, **extra)
    user = epsilon(ledger, delta=group_delta, accountant="pld")
    assert user < group_eps


def test_els_steps_record_k_and_nothing_guesses_it():
    with pytest.raises(ValueError, match="max_examples_per_user"):
        Ledger().record_step(sampling=Sampling.ELS, sample_rate=0.1,
                             releases=[Release("gradient", 1.0)])
    with pytest.raises(ValueError, match="max_examples_per_user"):
        Ledger().record_step(sampling=Sampling.POISSON, sample_rate=0.1,
                             releases=[Release("gradient", 1.0)], max_examples_per_user=3)
    ledger = Ledger(dataset_size=40)
    ledger.record_step(sampling=Sampling.ELS, sample_rate=0.1,
                       releases=[Release("gradient", 3.0)], count=4, max_examples_per_user=3)
    back = Ledger.from_json(ledger.to_json())
    assert back.step_groups == ledger.step_groups and back.step_groups[0].max_examples_per_user == 3
    assert back.prefix(2).step_groups[0].max_examples_per_user == 3
    assert back.only("gradient").step_groups[0].max_examples_per_user == 3
    # an example-level ledger's JSON is unchanged (no new key)
    plain = Ledger.homogeneous(sample_rate=0.1, noise_multiplier=1.0, steps=2)
    assert "max_examples_per_user" not in plain.to_json()


def test_a_ledger_mixing_users_and_examples_is_refused():
    ledger = Ledger.homogeneous(sample_rate=0.1, noise_multiplier=1.0, steps=2,
                                sampling=Sampling.ULS)
    ledger.record_step(sampling=Sampling.POISSON, sample_rate=0.1,
                       releases=[Release("gradient", 1.0)])
    with pytest.raises(ValueError, match="unit of privacy"):
        epsilon(ledger, delta=DELTA, accountant="rdp")


def _uls_sigma_spends_the_target(accountant: str) -> None:
    q_u, steps = 0.02, 200
    sigma = calibrate_noise_multiplier(target_epsilon=2.0, delta=DELTA, sample_rate=q_u,
                                       steps=steps, accountant=accountant,
                                       sampling=Sampling.ULS)
    event = dp_accounting.PoissonSampledDpEvent(q_u, dp_accounting.GaussianDpEvent(sigma))
    got = _pld(event, steps, 1e-4) if accountant == "pld" else _rdp(event, steps)
    assert 1.95 <= got <= 2.0 + 1e-9


def test_sigma_calibrated_for_a_user_level_target():
    _uls_sigma_spends_the_target("rdp")
    q, k, steps = 0.05, 3, 20
    sigma = calibrate_noise_multiplier(target_epsilon=2.0, delta=DELTA, sample_rate=q,
                                       steps=steps, accountant="rdp", sampling=Sampling.ELS,
                                       max_examples_per_user=k)
    orders = rdp_privacy_accountant.DEFAULT_RDP_ORDERS
    sgm = rdp_privacy_accountant._compute_rdp_poisson_subsampled_gaussian
    curve = steps * np.minimum(k * sgm(q, sigma / math.sqrt(k), orders),
                               sgm(1 - (1 - q) ** k, sigma / k, orders))
    assert 1.95 <= rdp_privacy_accountant.compute_epsilon(orders, curve, DELTA)[0] <= 2.0 + 1e-9


@pytest.mark.slow
def test_uls_sigma_calibrated_by_pld_spends_the_target():
    _uls_sigma_spends_the_target("pld")


@pytest.mark.slow
def test_els_sigma_calibrated_by_pld_spends_the_target_on_the_mixture():
    q, k, steps = 0.05, 2, 10
    sigma = calibrate_noise_multiplier(target_epsilon=2.0, delta=DELTA, sample_rate=q,
                                       steps=steps, accountant="pld", sampling=Sampling.ELS,
                                       max_examples_per_user=k, tol=1e-2)
    mixture = dp_event.MixtureOfGaussiansDpEvent(sigma, list(range(k + 1)), _binomial(k, q))
    assert 1.9 <= _pld(mixture, steps, 1e-3) <= 2.0 + 1e-6
