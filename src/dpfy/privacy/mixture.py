"""One ELS step at the user level: a mixture of Gaussians with Binomial(k, q) weights.

Example-level sampling with contribution bounding (ELS; Charles et al. 2024, "Fine-tuning
large language models with user-level differential privacy") caps every user at k examples of
the training set, Poisson-samples examples at rate q and clips each to C. Adding one user adds
j of their examples to a step with probability Binomial(k, q)(j) = C(k, j) q^j (1 − q)^(k−j),
and those j examples move the clipped sum by at most j·C. At noise σC the step is, at the
user level, the mixture-of-Gaussians mechanism N(0, σ²) against Σ_j w_j N(j, σ²) (in units of
C): dp_accounting's ``MixtureOfGaussiansDpEvent`` (Charles et al.'s tight accounting), which
its PLD accountant composes.

RDP has no accountant for that event in dp_accounting 0.6, so dpfy's RDP column for ELS is a
bound derived here, never the mixture itself: at every order α, the smaller of two Rényi
divergences that each bound one ELS step's.

(a) A composition (:func:`els_rdp_composition`). Split the step's noise N(0, σ²C²) into k
  independent parts N(0, σ²C²/k). The user's contribution Σ_i b_i v_i (b_i ~ Bernoulli(q)
  independent, ‖v_i‖ ≤ C) plus the noise is the sum of the k releases b_i v_i + N(0, σ²C²/k),
  each a Poisson-subsampled Gaussian with sensitivity C and noise multiplier σ/√k, and the
  rest of the batch's sum does not depend on the user. So one ELS step is post-processing of
  k composed subsampled Gaussians (q, σ/√k): its RDP is at most k times theirs.

(b) A dominating pair (:func:`els_rdp_dominating_pair`):

  Write p = 1 − (1 − q)^k (the user takes part at all). The mixture is (1 − p)·N(0, σ²) +
  p·M with M = Σ_{j≥1} (w_j / p)·N(z_j, σ²), ‖z_j‖ ≤ j ≤ k. The hockey-stick divergence
  H_γ(·‖·) is jointly convex, so for every γ ≥ 0 and in both directions
  H_γ((1 − p)N(0) + pM ‖ N(0)) ≤ Σ_j (w_j / p)·H_γ((1 − p)N(0) + pN(z_j) ‖ N(0)), and each
  term is the Poisson-subsampled Gaussian at rate p with sensitivity ‖z_j‖ ≤ k, whose
  privacy curve grows with the sensitivity. Hence every ELS step is dominated by the
  Poisson-subsampled Gaussian at rate p with noise multiplier σ/k, a dominating pair that
  composes (Zhu, Dong & Wang 2022) and whose Rényi divergences bound the step's. Looser than
  the mixture, but a bound. Without amplification the step is the Gaussian at σ/k (all k
  examples present: sensitivity kC).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from dpfy._lazy import LazyModule

if TYPE_CHECKING:
    from dp_accounting import dp_event
else:  # imported on first read, for start-up time only (dpfy._lazy)
    dp_event = LazyModule("dp_accounting.dp_event")


__all__ = ["binomial_weights", "els_dp_event", "els_rdp_dominating_pair", "els_rdp_composition"]


def binomial_weights(k: int, q: float) -> list[float]:
    """Binomial(k, q)(j) for j = 0..k: how often one user's k examples enter one step."""
    return [math.comb(k, j) * q**j * (1 - q) ** (k - j) for j in range(k + 1)]


def els_dp_event(
    sample_rate: float, noise_multiplier: float, max_examples_per_user: int
) -> dp_event.DpEvent:
    """One ELS step at the user level: ``MixtureOfGaussiansDpEvent(σ, [0..k], Binomial(k, q))``.

    Sensitivities in units of the clipping threshold C, so the standard deviation is σ."""
    k = max_examples_per_user
    return dp_event.MixtureOfGaussiansDpEvent(
        standard_deviation=noise_multiplier,
        sensitivities=[float(j) for j in range(k + 1)],
        sampling_probs=binomial_weights(k, sample_rate),
    )


def els_rdp_composition(
    sample_rate: float, noise_multiplier: float, max_examples_per_user: int
) -> tuple[int, float, float]:
    """(count, rate, noise multiplier) of the composition that bounds one ELS step (module
    docstring, (a)): k subsampled Gaussians at rate q and σ/√k."""
    k = max_examples_per_user
    return k, sample_rate, noise_multiplier / math.sqrt(k)


def els_rdp_dominating_pair(
    sample_rate: float, noise_multiplier: float, max_examples_per_user: int
) -> tuple[float, float]:
    """(rate, noise multiplier) of the Poisson-subsampled Gaussian that dominates one ELS step
    (module docstring): (1 − (1 − q)^k, σ/k)."""
    k = max_examples_per_user
    rate = -math.expm1(k * math.log1p(-sample_rate)) if sample_rate < 1 else 1.0
    return min(1.0, rate), noise_multiplier / k
