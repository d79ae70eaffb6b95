"""RDP of the Poisson-subsampled Gaussian at integer orders, for many noise multipliers at once.

At an integer order α the RDP of one step with sampling rate q and noise multiplier σ is a
finite sum (Mironov, Talwar and Zhang 2019, §3.3):

    ε(α) = log A_α / (α − 1),   A_α = Σ_{k=0..α} C(α, k) (1 − q)^{α−k} q^k exp((k² − k) / (2σ²)).

dp_accounting evaluates it term by term in Python, one σ at a time; individual accounting
needs it for thousands of σ (one per distinct clipped-norm ratio of the examples), where that
took minutes. Here the sum is one log-sum-exp per order over a (σ, k) array. The terms are the
same as dp_accounting's ``_compute_log_a_int``; only the summation order differs, so the two
agree to float64 rounding (a relative 1e-12, checked in the tests).

Fractional orders have no finite sum (an erfc series); their callers keep dp_accounting.
"""

from __future__ import annotations

import numpy as np
from scipy.special import gammaln, logsumexp

from dpfy._require import require

__all__ = ["subsampled_gaussian_rdp", "epsilons_from_rdp"]


# Noise levels whose (σ, k) arrays are formed at once: at α = 1024 each σ takes ≈ 50 kB of
# temporaries, so all of a 50,000-example row at once took 2.5 GB; 512 keep it near 25 MB.
_BLOCK = 512


def subsampled_gaussian_rdp(q: float, sigmas: np.ndarray, orders: np.ndarray) -> np.ndarray:
    """RDP of one Poisson-subsampled Gaussian step, shape (len(sigmas), len(orders)).

    ``orders`` must be integers ≥ 2; ``sigmas`` > 0 (σ = ∞ gives 0: no loss).
    """
    s = np.asarray(sigmas, dtype=float)
    a = np.asarray(orders, dtype=float)
    require(0 <= q <= 1, "q", q, "in [0, 1]")
    require(bool(np.all(s > 0)), "sigmas", "a value <= 0", "> 0", "A step without noise has ε = ∞")
    require(
        bool(np.all((a >= 2) & (a == np.round(a)))),
        "orders",
        list(a),
        "integers >= 2",
        "Use dp_accounting for fractional orders",
    )
    out = np.zeros((s.size, a.size))
    if q == 0:
        return out
    inv = 1.0 / (2.0 * s * s)  # σ = ∞ → 0: every exponent vanishes and A_α = 1
    if q == 1:
        return np.outer(inv, a)  # the Gaussian mechanism: α / (2σ²)
    log_q, log_1mq = np.log(q), np.log1p(-q)
    for j, alpha in enumerate(a.astype(int)):
        k = np.arange(alpha + 1, dtype=float)
        log_comb = gammaln(alpha + 1.0) - gammaln(k + 1.0) - gammaln(alpha - k + 1.0)
        coef = log_comb + k * log_q + (alpha - k) * log_1mq
        for lo in range(0, s.size, _BLOCK):  # the (σ, k) arrays of _BLOCK noise levels at once
            part = np.outer(inv[lo : lo + _BLOCK], k * k - k)
            out[lo : lo + _BLOCK, j] = logsumexp(coef[None, :] + part, axis=1) / (alpha - 1)
    return out


def epsilons_from_rdp(orders: np.ndarray, rdp: np.ndarray, delta: float) -> np.ndarray:
    """ε(δ) of each row of ``rdp`` (shape (N, len(orders))), minimised over the orders.

    The conversion of Balle et al. 2020 (Prop. 12) as dp_accounting's ``compute_epsilon``
    applies it, row by row in one array: ε = min_α [r_α + log(1 − 1/α) − log(δα)/(α − 1)],
    0 where δ² + expm1(−r_α) > 0 (the KL bound), ∞ at α ≤ 1.01, and never below 0.
    """
    a = np.asarray(orders, dtype=float)[None, :]
    r = np.asarray(rdp, dtype=float)
    require(0 < delta < 1, "delta", delta, "in (0, 1)")
    eps = r + np.log1p(-1.0 / a) - np.log(delta * a) / (a - 1.0)
    eps = np.where(a > 1.01, eps, np.inf)  # the bound is unstable as α → 1: not used there
    eps = np.where(delta**2 + np.expm1(-r) > 0, 0.0, eps)
    return np.maximum(eps.min(axis=1), 0.0)
