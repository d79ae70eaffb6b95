"""Calibration: searches over ledgers that a run would write.

Minimal first version (σ for a target ε); the accounting issue extends it.
"""

from __future__ import annotations

from dpfy._validate import require
from dpfy.privacy.accountants import epsilon
from dpfy.privacy.ledger import Ledger, Sampling

__all__ = ["calibrate_noise_multiplier"]


def calibrate_noise_multiplier(*, target_epsilon: float, delta: float, sample_rate: float,
                               steps: int, accountant: str = "rdp",
                               sampling: Sampling = Sampling.POISSON,
                               tol: float = 1e-3) -> float:
    """Smallest σ (to relative ``tol``) whose ledger of ``steps`` identical steps spends ≤ target."""
    require(target_epsilon > 0, "target_epsilon", target_epsilon, "> 0")
    require(steps >= 1, "steps", steps, ">= 1")

    def eps(sigma: float) -> float:
        return epsilon(Ledger.homogeneous(sample_rate=sample_rate, noise_multiplier=sigma,
                                          steps=steps, sampling=sampling),
                       delta=delta, accountant=accountant)

    lo, hi = 0.1, 1.0
    while eps(hi) > target_epsilon:
        lo, hi = hi, hi * 2
        require(hi < 1e4, "target_epsilon", target_epsilon, "reachable with σ < 1e4",
                "Raise the target ε, lower the sample rate or the number of steps")
    while hi - lo > tol * hi:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if eps(mid) <= target_epsilon else (mid, hi)
    return hi
