"""Fixed-size batches (sampling without replacement, replace-one): an independent lower bound.

dpfy charges a fixed-size step with the Poisson mixture pair at σ/2 (module docstring of
``dpfy.privacy.pld``). That pair is claimed to *dominate* the real mechanism, so dpfy's δ(ε) must
be at least the δ(ε) of any concrete pair of neighbouring datasets. Here we build one such pair
by hand and integrate its hockey-stick divergence numerically, with no dp_accounting involved:

N examples, batches of m drawn without replacement (q = m/N); every example's clipped gradient
is 0 except the one that differs: −C in D, +C in D' (a replacement moving the sum by 2C, the
largest a replacement can). With noise N(0, σ²C²) on the sum and everything in units of C,

    P = (1 − q)·N(0, σ²) + q·N(−1, σ²),    Q = (1 − q)·N(0, σ²) + q·N(+1, σ²),

and δ_true(ε) = max(H_{e^ε}(P‖Q), H_{e^ε}(Q‖P)) with H_α(P‖Q) = ∫ max(p − α q, 0).
A factor-2 error in the replace-one sensitivity (σ not halved) would charge less than this.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpfy.privacy import Ledger, Sampling, delta


def _normal_pdf(x: np.ndarray, mean: float, sigma: float) -> np.ndarray:
    return np.exp(-0.5 * ((x - mean) / sigma) ** 2) / (sigma * math.sqrt(2 * math.pi))


def _hockey_stick(p: np.ndarray, q: np.ndarray, alpha: float, dx: float) -> float:
    return float(np.sum(np.maximum(p - alpha * q, 0.0)) * dx)


def concrete_pair_delta(q: float, sigma: float, eps: float) -> float:
    """δ(ε) of the concrete neighbouring pair above, by numerical integration (one step)."""
    x = np.linspace(-1 - 40 * sigma, 1 + 40 * sigma, 400_001)
    dx = float(x[1] - x[0])
    base = (1 - q) * _normal_pdf(x, 0.0, sigma)
    p = base + q * _normal_pdf(x, -1.0, sigma)
    r = base + q * _normal_pdf(x, 1.0, sigma)
    alpha = math.exp(eps)
    return max(_hockey_stick(p, r, alpha, dx), _hockey_stick(r, p, alpha, dx))


def test_integration_reproduces_the_unsampled_gaussian():
    # q = 1: P = N(−1, σ²), Q = N(1, σ²), a Gaussian with shift 2: closed form (Balle & Wang)
    sigma, eps = 1.5, 0.7
    mu = 2 / sigma
    exact = (0.5 * math.erfc(-(-eps / mu + mu / 2) / math.sqrt(2))
             - math.exp(eps) * 0.5 * math.erfc(-(-eps / mu - mu / 2) / math.sqrt(2)))
    assert concrete_pair_delta(1.0, sigma, eps) == pytest.approx(exact, rel=1e-6)


@pytest.mark.parametrize("q, sigma, eps", [(0.01, 1.0, 0.05), (0.05, 0.8, 0.2),
                                           (0.2, 1.2, 0.5), (0.5, 2.0, 0.3)])
@pytest.mark.parametrize("accountant", ["pld", "rdp"])
def test_fixed_size_charge_dominates_a_concrete_replacement(q, sigma, eps, accountant):
    n = 1000
    ledger = Ledger.homogeneous(sample_rate=q, noise_multiplier=sigma, steps=1,
                                sampling=Sampling.FIXED_SIZE, dataset_size=n)
    charged = delta(ledger, epsilon=eps, accountant=accountant)
    true = concrete_pair_delta(q, sigma, eps)
    assert true > 1e-4  # the check has teeth: the concrete pair is far from private here
    assert charged >= true * (1 - 1e-6), (charged, true)
    # and the charge is not vacuous: below the same step without any sampling
    unsampled = Ledger.homogeneous(sample_rate=1.0, noise_multiplier=sigma, steps=1,
                                   sampling=Sampling.FIXED_SIZE, dataset_size=n)
    assert charged < delta(unsampled, epsilon=eps, accountant=accountant)


def test_a_halved_sensitivity_would_be_caught():
    # the Poisson pair at σ (not σ/2) charges less than the concrete replacement: the check
    # above would fail if dpfy forgot that a replacement moves the sum by 2C
    q, sigma, eps = 0.05, 0.8, 0.2
    poisson = Ledger.homogeneous(sample_rate=q, noise_multiplier=sigma, steps=1)
    assert delta(poisson, epsilon=eps, accountant="pld") < concrete_pair_delta(q, sigma, eps)
