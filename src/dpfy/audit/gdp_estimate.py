"""The Gaussian-DP estimate of ε from canary scores (Nasr et al. 2023, "Tight auditing of
differentially private machine learning"): an estimate of the run's privacy, not a bound.

DP-SGD's trade-off curve is close to that of a μ-GDP mechanism (Dong, Roth & Su 2022: by
the central limit theorem, many composed subsampled Gaussian steps are ≈ μ-GDP). Under μ-GDP
the optimal test statistic is N(0, 1) on an "out" canary and N(μ, 1) on an "in" one after
standardization, so μ is the standardized shift of the "in" scores against the "out" scores:

    μ̂ = (mean(in scores) − mean(out scores)) / sd(out scores),

and the estimate of ε is the ε of μ̂-GDP at the run's δ (:func:`dpfy.privacy.gdp.
epsilon_for_delta`). The "out" scores are the null: a canary that never entered the run is
scored on noise alone, which is why their spread is the unit (a run with no noise has
sd(out) = 0 and μ̂ = ∞).

Confidence: the lower limit μ̂_low is the (1 − confidence) quantile of μ̂ over ``resamples``
bootstrap resamples of the in and out canaries (each resampled with replacement, separately);
ε̂_low is its ε. "The estimate exceeds the claim at this confidence" means ε̂_low > claimed ε.
The bootstrap draws come from a fixed generator: they resample scores that are already
computed, so the estimate is reproducible and reveals nothing about the run.

What the estimate is worth is measured, not proved: on a correct run it sits below the
claimed (PLD) ε by the distance between the run's privacy-loss distribution and its
Gaussian fit (docs/audit.md gives the measured ratios). Use the lower bounds of
:mod:`dpfy.audit.stats` and :mod:`dpfy.audit.fdp` for statements that hold without the
Gaussian assumption.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dpfy._require import require
from dpfy.audit.stats import FieldsAsDict, check_scores
from dpfy.privacy.gdp import epsilon_for_delta

__all__ = ["GdpEstimate", "gdp_estimate", "standardized_shift", "DEFAULT_RESAMPLES"]

DEFAULT_RESAMPLES = 2000
BOOTSTRAP_SEED = 0  # resamples public scores: reproducibility, not secrecy


@dataclass(frozen=True)
class GdpEstimate(FieldsAsDict):
    """μ̂ and ε̂ (the estimate), with their lower limits at ``confidence``."""

    mu: float
    mu_low: float
    epsilon: float
    epsilon_low: float
    delta: float
    confidence: float
    resamples: int


def standardized_shift(in_scores: np.ndarray, out_scores: np.ndarray) -> np.ndarray:
    """μ̂ = (mean(in) − mean(out)) / sd(out) along the last axis, clipped at 0 (a shift the
    wrong way is no evidence of leakage); ∞ where sd(out) = 0 < the shift."""
    shift = in_scores.mean(axis=-1) - out_scores.mean(axis=-1)
    spread = out_scores.std(axis=-1, ddof=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        mu = np.where(
            spread > 0, shift / np.where(spread > 0, spread, 1.0), np.where(shift > 0, np.inf, 0.0)
        )
    return np.maximum(mu, 0.0)


def _epsilon(mu: float, delta: float) -> float:
    return math.inf if math.isinf(mu) else epsilon_for_delta(delta, mu)


def gdp_estimate(
    scores: np.ndarray,
    included: np.ndarray,
    *,
    delta: float,
    confidence: float = 0.95,
    resamples: int = DEFAULT_RESAMPLES,
) -> GdpEstimate:
    """The GDP estimate of ε from canary ``scores`` (higher: more likely "in") and the secret
    inclusion bits, with its lower limit at ``confidence`` (module docstring)."""
    s, inc = check_scores(scores, included)
    require(0.5 < confidence < 1, "confidence", confidence, "in (0.5, 1)", "Use 0.95")
    require(0 < delta < 1, "delta", delta, "in (0, 1)")
    require(
        int(inc.sum()) >= 2 and int((~inc).sum()) >= 2,
        "canaries in and out",
        (int(inc.sum()), int((~inc).sum())),
        "at least 2 of each",
        "Use 1000 canaries",
    )
    require(
        isinstance(resamples, int) and resamples >= 100, "resamples", resamples, "an int >= 100"
    )
    a, b = s[inc], s[~inc]
    mu = float(standardized_shift(a, b))
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    chunk = max(1, 2_000_000 // s.size)  # bounded memory: chunk × m draws at a time
    boot = np.concatenate(
        [
            standardized_shift(
                a[rng.integers(0, a.size, (n, a.size))], b[rng.integers(0, b.size, (n, b.size))]
            )
            for n in [chunk] * (resamples // chunk) + [resamples % chunk]
            if n
        ]
    )
    mu_low = float(np.quantile(boot, 1 - confidence, method="lower"))
    return GdpEstimate(
        mu=mu,
        mu_low=mu_low,
        epsilon=_epsilon(mu, delta),
        epsilon_low=_epsilon(mu_low, delta),
        delta=delta,
        confidence=confidence,
        resamples=resamples,
    )
