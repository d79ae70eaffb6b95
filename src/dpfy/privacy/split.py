"""Splitting one noise budget between Gaussian releases made on the same batch.

Releases computed on one batch (a clipped-gradient sum and a clipped count, say), each with
noise multiplier σ_i relative to its own sensitivity, form together one Gaussian mechanism with

    σ⁻² = Σ_i σ_i⁻²                                                              (1)

(stack the releases scaled by 1/(σ_i·Δ_i): the stacked vector has sensitivity sqrt(Σ σ_i⁻²) and
unit noise). So a run that releases extra values at σ_other and keeps the gradient at
σ_g = (σ⁻² − k·σ_other⁻²)^(−1/2) spends exactly what plain DP-SGD at σ spends. The ledger
records the truth (each release with its own σ_i); these helpers only choose the σ_i.

References:
  Galli et al. 2024 (OSO), Proposition 1 and the 1 % rule (Privacy Analysis).
  Andrew et al. 2021 / He et al. (quantile clipping): Monir et al. 2023, §3.2.2,
  σ_new = (σ⁻² − K·(2σ_b)⁻²)^(−1/2).
"""

from __future__ import annotations

import math

from dpfy._require import require

__all__ = [
    "combine_noise_multipliers",
    "gaussian_remainder",
    "split_noise_multiplier",
    "quantile_noise_split",
]


def combine_noise_multipliers(*sigmas: float) -> float:
    """σ of releases made together on one batch: (Σ σ_i⁻²)^(−1/2), Eq. (1). 0 if any σ_i = 0."""
    require(len(sigmas) >= 1, "sigmas", sigmas, "at least one noise multiplier")
    for s in sigmas:
        require(s >= 0, "noise_multiplier", s, ">= 0")
    if any(s == 0 for s in sigmas):
        return 0.0
    return sum(s**-2 for s in sigmas) ** -0.5


def gaussian_remainder(total: float, other: float, *, count: int = 1) -> float:
    """The σ left for one release when ``count`` others at σ ``other`` share a total σ.

    Solves total⁻² = σ⁻² + count·other⁻² for σ (Eq. 1). Requires other > total·√count: the
    other releases alone must spend less than the whole budget.

    Args:
      total: σ of the whole step (what plain DP-SGD would use), > 0.
      other: noise multiplier of each other release, relative to its own sensitivity.
      count: how many such releases (K in per-layer quantile clipping).
    """
    require(total > 0, "total", total, "> 0")
    require(count >= 1, "count", count, ">= 1")
    limit = total * math.sqrt(count)
    require(
        other > limit,
        "other",
        other,
        f"> total·√count = {limit:.6g}",
        f"The other release(s) would spend the whole budget; use a noise multiplier above "
        f"{limit:.6g} for them, or a smaller total σ",
    )
    return (total**-2 - count * other**-2) ** -0.5


def split_noise_multiplier(total: float, *, inflation: float = 0.01) -> tuple[float, float]:
    """OSO's rule: raise the gradient σ by ``inflation`` and give the rest to a second release.

    Returns (σ_g, σ_q) with σ_g = (1 + inflation)·total and σ_q = total/sqrt(1 − (1+inflation)⁻²),
    so total⁻² = σ_g⁻² + σ_q⁻². With the paper's 1 %: σ_q = 7.12399·total (Galli et al. 2024,
    Proposition 1).
    """
    require(total > 0, "total", total, "> 0")
    require(inflation > 0, "inflation", inflation, "> 0", "Use e.g. 0.01 for OSO's 1 % rule")
    sigma_g = (1 + inflation) * total
    return sigma_g, total / math.sqrt(1 - (1 + inflation) ** -2)


def quantile_noise_split(total: float, count_noise_std: float, *, num_counts: int = 1) -> float:
    """Gradient σ for quantile clipping with ``num_counts`` clipped-count releases.

    A count of indicators centred to ±½ has sensitivity ½, so noise std σ_b is multiplier 2σ_b:
    σ_new = (σ⁻² − K·(2σ_b)⁻²)^(−1/2) (Monir et al. 2023, §3.2.2; He et al.'s printed formula has a
    sign
    typo in the exponent). Requires σ < 2σ_b/√K.
    """
    require(
        count_noise_std > 0,
        "count_noise_std",
        count_noise_std,
        "> 0",
        "Andrew et al. use expected batch size / 20",
    )
    # checked here so that the refusal names the setting a user gives (σ_b), not the
    # count's noise multiplier 2σ_b that gaussian_remainder sees
    least = total * math.sqrt(num_counts) / 2
    require(
        count_noise_std > least,
        "count_noise_std",
        count_noise_std,
        f"> σ·√K/2 = {least:.6g} (the counts would spend the whole budget of σ = {total:g})",
        "Pass a larger count_noise_std= (the default, expected batch or users per round / 20, "
        "is too small for few units per step), or a smaller total σ",
    )
    return gaussian_remainder(total, 2 * count_noise_std, count=num_counts)
