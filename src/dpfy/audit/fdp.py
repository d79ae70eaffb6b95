"""The f-DP one-run audit (Mahloujifar, Melis & Chaudhuri, "Auditing f-Differential Privacy
in One Run", 2024): the same guesses as :mod:`dpfy.audit.stats` (the grid rule by default),
tested against the whole trade-off curve of the claim instead of its (ε, δ) pair, so the
bound keeps improving as the number of canaries m grows.

The claim (ε, δ) is read as the μ-GDP curve that is exactly (ε, δ)-DP
(μ = :func:`dpfy.privacy.gdp.mu_for_epsilon`), whose inverse blow-up is
``b(x) = Φ(Φ⁻¹(x) − μ)``. With k guesses of which v are correct at level s, the paper's
recursion (its capped "r, h" bound) starts from r = s·v/m, h = s·(k − v)/m and for
i = v−1, …, 0 sets h' = max(h, b(r)), r' = min(1, r + i/(k − i)·(h' − h)). The claim is
rejected when the final r + h exceeds k/m (the paper's test: under the claimed curve, that
many correct guesses would need more probability mass than k guesses out of m canaries
have). The lower bound is the largest ε rejected.

The claim is tested as a Gaussian mechanism's trade-off curve (what DP-SGD's accounting
describes). Like Steinke et al.'s test, this bounds the run's privacy from below through the
guesses only; it never estimates the claim itself.
"""

from __future__ import annotations

import functools

import numpy as np
from scipy import special

from dpfy.audit.stats import AuditBound, largest_rejected, best_over_thresholds
from dpfy.privacy.gdp import mu_for_epsilon

__all__ = ["fdp_rejects_by", "epsilon_for_guesses_fdp", "fdp_epsilon"]


@functools.lru_cache(maxsize=4096)
def _mu(epsilon: float, delta: float) -> float:
    return mu_for_epsilon(epsilon, delta)


def fdp_rejects_by(
    canaries: int, guesses: int, correct: int, epsilon: float, delta: float, significance: float
) -> float:
    """(r + h) − k/m after the recursion (module docstring): > 0 rejects the (ε, δ) claim."""
    mu = _mu(float(epsilon), float(delta))
    r = significance * correct / canaries
    h = significance * (guesses - correct) / canaries
    for i in range(correct - 1, -1, -1):
        h_next = max(h, float(special.ndtr(special.ndtri(r) - mu)))
        if h_next == h:  # h, and so r, cannot move any more
            break
        r = min(r + i / (guesses - i) * (h_next - h), 1.0)
        h = h_next
    return (r + h) - guesses / canaries


def epsilon_for_guesses_fdp(
    canaries: int,
    guesses: int,
    correct: int,
    *,
    delta: float,
    significance: float,
    floor: float = 0.0,
) -> float:
    """The largest ε whose Gaussian-curve (ε, δ) claim these guesses reject, or ``floor``."""
    return largest_rejected(
        lambda e: fdp_rejects_by(canaries, guesses, correct, max(e, 1e-12), delta, significance),
        floor,
    )


def fdp_epsilon(
    scores: np.ndarray,
    included: np.ndarray,
    *,
    delta: float,
    confidence: float = 0.95,
    guesses: str = "grid",
) -> AuditBound:
    """Mahloujifar et al.'s f-DP lower bound on ε from canary scores and inclusion bits, with
    the guessing rule ``guesses`` (:mod:`dpfy.audit.stats`)."""
    return best_over_thresholds(
        scores,
        included,
        delta=delta,
        confidence=confidence,
        test="fdp",
        epsilon_for=epsilon_for_guesses_fdp,
        guesses=guesses,
    )
