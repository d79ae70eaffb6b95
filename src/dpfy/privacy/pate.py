"""Individualized PATE utilities (Boenisch et al.): upsampling factors and teacher weights
(Monir, Fauzan & Ghinita 2023, §5), from per-point or per-group privacy budgets.

Both are data-independent bookkeeping on public budgets (no noise, no ledger entry); the
privacy of the PATE aggregation itself is accounted wherever its noisy votes are released.
"""

from __future__ import annotations

import math
from typing import Sequence

from dpfy._require import require

__all__ = ["pate_upsampling_factors", "pate_teacher_weights"]


def _check_budgets(budgets: Sequence[float], name: str) -> None:
    require(len(budgets) >= 1, name, list(budgets), "at least one ε")
    for e in budgets:
        require(
            isinstance(e, (int, float)) and 0 < e < math.inf,
            name,
            e,
            "> 0 and finite for every entry",
            "Give every point or group a positive ε",
        )


def pate_upsampling_factors(budgets: Sequence[float], precision: int = 1) -> list[int]:
    """Algorithm 1 (individualized PATE, upsampling): how many teachers' subsets each point is
    copied into.

    Budgets are scaled by 10^precision and rounded to integers ε̄; with D = gcd of the distinct
    ε̄, point d is duplicated u_d = ε̄_d / D times, so points with larger budgets train more
    teachers in proportion to their budget. {1, 2, 3} → {1, 2, 3}; {0.5, 1.5} → {1, 3} (p = 1).

    Args:
      budgets: ε_d per data point (> 0).
      precision: p ∈ ℕ, decimal digits of the budgets kept (rounding: round(ε·10^p)).

    Returns: u_d per point, in the input order.
    """
    _check_budgets(budgets, "budgets")
    require(
        isinstance(precision, int) and precision >= 0, "precision", precision, "an integer >= 0"
    )
    scaled = [round(e * 10**precision) for e in budgets]
    require(
        min(scaled) >= 1,
        "budgets",
        min(budgets),
        f">= {0.5 * 10**-precision:g} at precision {precision}",
        "Raise the precision so every budget keeps a non-zero digit",
    )
    divisor = math.gcd(*sorted(set(scaled)))
    return [s // divisor for s in scaled]


def pate_teacher_weights(
    budgets: Sequence[float], teachers: Sequence[int], total_teachers: int
) -> list[float]:
    """Algorithm 2 (individualized PATE, weighting): the vote weight of every teacher of group j.

    w̄_j = (ε_j / Σ_j ε_j) · (n_j / k), and w_j = k · w̄_j / Σ_j w̄_j. As the paper writes it,
    the weights of the *groups* sum to k (Σ_j w_j = k); the per-teacher total Σ_j n_j·w_j is in
    general not k (ε = {1, 2, 3}, n = {3, 4, 3}, k = 10 → w = {1.5, 4.0, 4.5}: the groups sum to
    10, the ten teachers to 34). Normalize by Σ_j n_j w_j yourself if your aggregator needs
    teacher weights summing to k (the printed Algorithm 2 normalizes over groups).

    Args:
      budgets: ε_j per privacy group (> 0).
      teachers: n_j, the number of teachers trained on group j's data (>= 1).
      total_teachers: k; must equal Σ_j n_j.

    Returns: w_j per group (every teacher of group j votes with weight w_j).
    """
    _check_budgets(budgets, "budgets")
    require(
        len(teachers) == len(budgets),
        "len(teachers)",
        len(teachers),
        f"{len(budgets)} (one count per group)",
    )
    require(
        all(isinstance(n, int) and n >= 1 for n in teachers),
        "teachers",
        list(teachers),
        "integers >= 1",
    )
    require(
        total_teachers == sum(teachers),
        "total_teachers",
        total_teachers,
        f"the sum of teachers per group ({sum(teachers)})",
    )
    e_sum = math.fsum(budgets)
    raw = [(e / e_sum) * (n / total_teachers) for e, n in zip(budgets, teachers)]
    w_sum = math.fsum(raw)
    return [w / w_sum * total_teachers for w in raw]
