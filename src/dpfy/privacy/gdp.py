"""Gaussian differential privacy (μ-GDP) and the central-limit-theorem accountant.

A mechanism is μ-GDP when telling its outputs on two neighbouring datasets apart is no easier
than telling N(0, 1) from N(μ, 1). The Gaussian mechanism with noise multiplier σ (noise std
divided by the L2 sensitivity) is exactly μ-GDP with μ = 1/σ, and μ-GDP holds for every ε ≥ 0
at once with

    δ(ε; μ) = Φ(−ε/μ + μ/2) − e^ε · Φ(−ε/μ − μ/2)                                  (Eq. 1)

(Dong, Roth & Su 2022; Du et al. 2021, Eqs. 1–2).

For T Poisson-subsampled steps with rate p and per-step μ_t = 1/σ_t, the central limit theorem
of Bu et al. (2020), extended to heterogeneous steps by the Dynamic DP-SGD paper (Theorem 1,
Eq. 9), says the composition approaches μ_tot-GDP with

    μ_tot = p · sqrt( Σ_t (e^{μ_t²} − 1) ).                                        (Eq. 9)

.. warning::
   The CLT is an asymptotic *approximation*, not a bound. Gopi et al. (2021) show it
   under-reports ε, most for small σ (large μ_t) and few steps. dpfy labels every GDP number
   "approximation"; use the RDP or PLD accountant for a guarantee.

References:
  Dong, Roth, Su. "Gaussian differential privacy", JRSS-B 2022.
  Bu, Dong, Long, Su. "Deep learning with Gaussian differential privacy", HDSR 2020.
  Du et al. 2021, "Dynamic Differential-Privacy Preserving SGD", Eqs. 1–2 and 6–9.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

import numpy as np

from dpfy._lazy import LazyModule
from dpfy._require import require
from dpfy.privacy.canonical import GAUSSIAN, MIXTURE, CanonicalForm
from dpfy.privacy.mixture import els_rdp_dominating_pair
from dpfy.types.sampling import require_sample_rate

if TYPE_CHECKING:
    from scipy import optimize, special
else:  # imported on first read, for start-up time only (dpfy._lazy)
    optimize = LazyModule("scipy.optimize")
    special = LazyModule("scipy.special")

__all__ = [
    "APPROXIMATION_NOTE",
    "ApproximateEpsilon",
    "mu_total",
    "delta_for_epsilon",
    "epsilon_for_delta",
    "mu_for_epsilon",
    "mu_of_form",
    "epsilon_of_form",
    "delta_of_form",
]

APPROXIMATION_NOTE = (
    "GDP central-limit-theorem approximation (Bu et al. 2020; Dynamic DP-SGD "
    "Eq. 9): not an upper bound, it under-reports ε for small noise multipliers"
)


class ApproximateEpsilon(float):
    """An ε read with an approximate accountant (the GDP CLT), with the rigorous ε beside it.

    It is the approximate value as a float (so it prints and formats as one); ``rigorous`` is
    ε(δ) of the same ledger by ``rigorous_accountant`` (PLD), the number that is a guarantee.
    Returned only to a caller who asked for it (``approximate=True``).
    """

    rigorous: float
    rigorous_accountant: str

    def __new__(
        cls, value: float, *, rigorous: float, rigorous_accountant: str
    ) -> "ApproximateEpsilon":
        out = super().__new__(cls, value)
        out.rigorous, out.rigorous_accountant = float(rigorous), rigorous_accountant
        return out

    def __getnewargs_ex__(self) -> tuple[tuple[float], dict[str, object]]:
        return (float(self),), {
            "rigorous": self.rigorous,
            "rigorous_accountant": self.rigorous_accountant,
        }

    def __repr__(self) -> str:
        return (
            f"ApproximateEpsilon({float(self)!r}, rigorous={self.rigorous!r} "
            f"[{self.rigorous_accountant}])"
        )

    __str__ = __repr__


def _log_ndtr(x: float) -> float:
    return float(special.log_ndtr(x))


def mu_total(sample_rate: float, mus: Sequence[float] | np.ndarray) -> float:
    """μ_tot = p·sqrt(Σ_t (e^{μ_t²} − 1)) for Poisson steps at rate p with per-step μ_t (Eq. 9).

    Args:
      sample_rate: p in (0, 1], the Poisson sampling rate shared by all steps.
      mus: per-step μ_t = 1/σ_t (≥ 0; use ``math.inf`` for a step without noise).

    With constant μ_t = μ this is Bu et al.'s Eq. (7), μ_tot = p·sqrt(T(e^{μ²} − 1)).
    An approximation (see the module warning).
    """
    require_sample_rate(sample_rate)
    arr = np.asarray(list(mus), dtype=float)
    require(arr.size >= 1, "mus", list(mus), "a non-empty sequence of per-step μ_t = 1/σ_t")
    require(bool(np.all(arr >= 0)), "mus", float(arr.min()), ">= 0 for every step")
    if np.any(np.isinf(arr)):
        return math.inf
    return float(sample_rate * math.sqrt(float(np.sum(np.expm1(arr**2)))))


def delta_for_epsilon(epsilon: float, mu: float) -> float:
    """δ(ε; μ) of a μ-GDP mechanism (Eq. 1), computed in log space so large ε cannot overflow."""
    require(epsilon >= 0, "epsilon", epsilon, ">= 0")
    require(mu >= 0, "mu", mu, ">= 0")
    if mu == 0:
        return 0.0
    if math.isinf(mu):
        return 1.0
    if math.isinf(epsilon):
        return 0.0
    a = _log_ndtr(-epsilon / mu + mu / 2)
    b = epsilon + _log_ndtr(-epsilon / mu - mu / 2)
    if b >= a:  # only rounding can do this; the true difference is >= 0
        return 0.0
    return float(math.exp(a) * -math.expm1(b - a))


def epsilon_for_delta(delta: float, mu: float) -> float:
    """Smallest ε ≥ 0 with δ(ε; μ) ≤ δ (root of the decreasing function ε ↦ δ(ε; μ))."""
    require(0 < delta < 1, "delta", delta, "in (0, 1)")
    require(mu >= 0, "mu", mu, ">= 0")
    if math.isinf(mu):
        return math.inf
    if delta_for_epsilon(0.0, mu) <= delta:
        return 0.0
    hi = max(1.0, mu * mu)
    while delta_for_epsilon(hi, mu) > delta:
        hi *= 2
    return float(
        optimize.brentq(lambda e: delta_for_epsilon(e, mu) - delta, 0.0, hi, xtol=1e-12, rtol=1e-12)
    )


def mu_for_epsilon(epsilon: float, delta: float) -> float:
    """The μ whose μ-GDP guarantee is exactly (ε, δ)-DP (root of the increasing μ ↦ δ(ε; μ))."""
    require(epsilon > 0, "epsilon", epsilon, "> 0")
    require(0 < delta < 1, "delta", delta, "in (0, 1)")
    lo, hi = 1e-12, 1.0
    while delta_for_epsilon(epsilon, hi) < delta:
        hi *= 2
        require(hi < 1e6, "epsilon", epsilon, "finite for this delta")
    return float(
        optimize.brentq(
            lambda m: delta_for_epsilon(epsilon, m) - delta, lo, hi, xtol=1e-14, rtol=1e-12
        )
    )


def mu_of_form(form: CanonicalForm) -> float:
    """μ_tot of a canonical ledger form (sampled atoms by the CLT, Gaussians exactly).

    μ_tot² = Σ_sampled c·q²·(e^{1/σ²} − 1) + Σ_unsampled c/σ². The first sum is Eq. (9) written
    per step so that q may differ between steps (each step contributes its own term to the CLT's
    variance; with one q it is exactly Eq. 9). Unsampled Gaussians compose exactly in GDP
    (μ² adds), so they are not put through the CLT.
    """
    if form.non_private:
        return math.inf
    total = 0.0
    for a in form.atoms:
        if a.kind == GAUSSIAN:
            total += a.count / a.noise_multiplier**2
        else:  # an ELS mixture through its dominating subsampled Gaussian (p, σ/k)
            q, sigma = a.sample_rate, a.noise_multiplier
            if a.kind == MIXTURE:
                k = a.max_examples_per_user
                assert k is not None  # a mixture atom is built from an ELS group, which records k
                q, sigma = els_rdp_dominating_pair(q, sigma, int(k))
            total += a.count * q**2 * math.expm1(sigma**-2)
    return math.sqrt(total)


def epsilon_of_form(form: CanonicalForm, delta: float) -> float:
    """ε(δ) of a canonical ledger form through its μ_tot (0 for an empty form)."""
    return 0.0 if form.is_empty else epsilon_for_delta(delta, mu_of_form(form))


def delta_of_form(form: CanonicalForm, epsilon: float) -> float:
    """δ(ε) of a canonical ledger form through its μ_tot (0 for an empty form)."""
    return 0.0 if form.is_empty else delta_for_epsilon(epsilon, mu_of_form(form))
