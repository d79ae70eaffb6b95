"""The one-run audit's statistics: ε lower bounds from canary guesses.

Steinke, Nasr & Jagielski, "Privacy auditing with one (1) training run" (NeurIPS 2023): m
canaries, each included independently with probability ½; the auditor scores every canary
from what the run released and guesses "in" for the k highest scores (abstaining on the rest).
If the run is (ε, δ)-DP, the number V of correct guesses among the k satisfies (their
Theorem 5.2, with the δ term of their Proposition 5.5 / Algorithm 2)

    P[V ≥ v] ≤ β(ε) + 2mδ·α(ε),
    β = P[Binomial(k, q) ≥ v],   q = e^ε / (1 + e^ε),
    α = max_{1 ≤ i ≤ v} (1/i)·P[v − i ≤ Binomial(k, q) < v].

A claim (ε, δ) is rejected at confidence 1 − s when that p-value is ≤ s; the lower bound is
the largest ε rejected. :mod:`dpfy.audit.fdp` gives the f-DP variant (Mahloujifar et al.
2024) on the same guesses.

Which guesses (``guesses=``):

- ``"grid"`` (the default, and what ``dpfy audit`` reports): guess counts fixed before the
  scores are seen — k = m, m/2, m/4, … down to :data:`MIN_GUESSES`, so they depend on m
  alone — and for each k two guesses: "in" for the k highest scores (one-sided), and "in"
  for the k/2 highest with "out" for the k/2 lowest (two-sided), as Steinke et al.'s guesses
  T ∈ {−1, 0, +1}^m allow (their Algorithm 1; Mahloujifar et al. audit the same guesses).
  Each of the G = 2·(grid size) guesses is tested at level s/G. **Why an honest run is
  rejected with probability at most s:** each guess is fixed in advance as a function of the
  run's output (ties broken by canary index, which is public and independent of the secret
  bits), so Theorem 5.2 (resp. the f-DP theorem) bounds its rejection probability by s/G;
  the union bound over the G guesses gives s. Two-sided guesses double the guesses at the
  same precision when every included canary was sampled often ("out" canaries are pure
  noise, "in" ones are shifted up: long runs); one-sided guesses win when many included
  canaries were never sampled (qT ≈ 1: the low scores mix "out" with unsampled "in"), so
  both are tried (measured in docs/audit.md, "Power on the default Fashion-MNIST run").
- ``"hull"``: guesses "in" only, at every threshold on the upper hull of the (false negative,
  true negative) counts (a threshold below that hull is beaten by mixing two on it), each at
  level s / H for the H hull thresholds — jax_privacy's auditing module, whose test values
  are reproduced in ``tests/audit/test_stats.py``. The hull depends on the scores, so this
  correction is that reference's convention rather than a proof.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from scipy import optimize, special, stats

from dpfy._require import require

__all__ = [
    "AuditBound",
    "GUESSES",
    "MIN_GUESSES",
    "guess_grid",
    "grid_counts",
    "guess_counts",
    "one_run_p_value",
    "epsilon_for_guesses",
    "largest_rejected",
    "one_run_epsilon",
    "best_over_thresholds",
    "check_scores",
]

# Root-finding tolerance on ε (absolute); the known values are given to ~1e-6.
EPS_XTOL = 1e-9
# The guessing rules (module docstring); the first is the default.
GUESSES = ("grid", "hull")
# The smallest guess count on the grid: fewer guesses, all correct, reject only ε below
# about 1 at 95 % / G, never the claims an audit is for.
MIN_GUESSES = 16


class FieldsAsDict:
    """:meth:`to_dict` for the audit's results, whose fields are all numbers and strings: the
    fields by name, as they are (JSON-readable)."""

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class AuditBound(FieldsAsDict):
    """A lower bound on ε from one audit.

    Attributes:
      epsilon: the largest ε whose (ε, δ) claim the guesses reject (0 when none is).
      test: ``"one_run"`` (Steinke et al.) or ``"fdp"`` (Mahloujifar et al.).
      guesses, correct: k and v of the threshold that gave it (0, 0 when none did).
      canaries: m; delta, confidence: the claim's δ and the test's level.
      thresholds: the guesses tried, each at level (1 − confidence) / thresholds: the grid
        rule's G (``"grid"``) or the hull's H (``"hull"``).
      guessing: the rule, one of :data:`GUESSES`.
    """

    epsilon: float
    test: str
    guesses: int
    correct: int
    canaries: int
    delta: float
    confidence: float
    thresholds: int
    guessing: str


def check_scores(scores: np.ndarray, included: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Scores and inclusion bits as float64 / bool arrays of one length, refused otherwise."""
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    inc = np.asarray(included).reshape(-1)
    require(
        s.shape == inc.shape, "included", f"{inc.size} bits", f"one per score ({s.size} scores)"
    )
    require(bool(np.all(np.isfinite(s))), "scores", "non-finite values", "finite")
    require(
        inc.dtype == bool or bool(np.all((inc == 0) | (inc == 1))),
        "included",
        "non-binary values",
        "booleans (True: the canary was in the training set)",
    )
    require(s.size >= 1, "scores", "empty", "one score per canary")
    return s, inc.astype(bool)


def _upper_hull(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Indices of the vertices of the upper concave hull of points sorted by x (then y).

    A point on or below the chord of its neighbours is dropped: a guess at that threshold is
    beaten by randomizing between the two outer ones.
    """
    keep: list[int] = []
    for i in range(len(x)):
        while len(keep) >= 2:
            a, b = keep[-2], keep[-1]
            # b is dominated when the slope a→b is ≤ the slope b→i (cross product ≤ 0)
            if (y[b] - y[a]) * (x[i] - x[b]) - (y[i] - y[b]) * (x[b] - x[a]) <= 0:
                keep.pop()
            else:
                break
        keep.append(i)
    return np.asarray(keep, dtype=np.int64)


def guess_grid(canaries: int) -> np.ndarray:
    """The grid rule's guess counts for m canaries: m, m/2, m/4, … while ≥ :data:`MIN_GUESSES`;
    m alone decides them, never the scores."""
    grid: list[int] = []
    k = int(canaries)
    while k >= MIN_GUESSES:
        grid.append(k)
        k //= 2
    return np.asarray(grid or [canaries], dtype=np.int64)


def grid_counts(scores: np.ndarray, included: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(k, v) of the grid rule's guesses: for each k of :func:`guess_grid`, "in" for the k
    highest scores, then "in" for the k/2 highest and "out" for the k/2 lowest (2·⌊k/2⌋
    guesses); v of them right. Ties are ordered by canary index (a stable sort): public, and
    independent of the inclusion bits."""
    s, inc = check_scores(scores, included)
    order = np.argsort(s, kind="stable")  # (m,) ascending scores
    ranked = inc[order]  # (m,) inclusion bits, lowest score first
    k_out, v_out = [], []
    for k in guess_grid(s.size).tolist():
        h = k // 2
        k_out += [k, 2 * h]
        v_out += [
            int(ranked[s.size - k :].sum()),
            int(ranked[s.size - h :].sum() + (~ranked[:h]).sum()),
        ]
    return np.asarray(k_out, dtype=np.int64), np.asarray(v_out, dtype=np.int64)


def guess_counts(scores: np.ndarray, included: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(k, v) at each candidate threshold t: guessing "in" for every score ≥ t gives k guesses,
    v of them correct.

    Candidates: every distinct score and +∞ (no guess), reduced to the vertices of the upper
    hull of (false negatives, true negatives) — the thresholds no mixture of others beats.
    """
    s, inc = check_scores(scores, included)
    t = np.append(np.unique(s), np.inf)  # ascending thresholds
    fn = np.searchsorted(np.sort(s[inc]), t, side="left")  # in-canaries below t
    tn = np.searchsorted(np.sort(s[~inc]), t, side="left")  # out-canaries below t
    hull = _upper_hull(fn, tn)
    v = inc.sum() - fn[hull]
    k = v + (~inc).sum() - tn[hull]
    return k.astype(np.int64), v.astype(np.int64)


def one_run_p_value(
    canaries: int, guesses: int, correct: int, epsilon: float, delta: float
) -> float:
    """P[V ≥ correct] bound under an (ε, δ)-DP claim (module docstring), capped at 1."""
    q = float(special.expit(epsilon))
    tail = float(stats.binom.sf(correct - 1, guesses, q))  # P[B ≥ v]
    if delta == 0 or correct == 0:
        return min(tail, 1.0)
    i = np.arange(1, correct + 1)
    window = stats.binom.sf(correct - i - 1, guesses, q) - tail  # P[v − i ≤ B < v]
    alpha = float(np.max(window / i))
    return min(tail + 2 * canaries * delta * alpha, 1.0)


def largest_rejected(rejects_by: Callable[[float], float], floor: float) -> float:
    """The largest ε ≥ ``floor`` with ``rejects_by(ε) > 0`` (a decreasing function of ε), or
    ``floor`` when it is not rejected there: the one root search of both audits' ε
    (:func:`epsilon_for_guesses` here, the f-DP audit in :mod:`dpfy.audit.fdp`)."""
    if rejects_by(floor) <= 0:
        return floor
    lo, hi = floor, max(1.0, 2 * floor)
    while rejects_by(hi) > 0:
        lo, hi = hi, 2 * hi
        if hi > 1e4:  # every ε is rejected: only a degenerate test (s ≥ 1) does this
            return math.inf
    return float(optimize.brentq(rejects_by, lo, hi, xtol=EPS_XTOL))


def epsilon_for_guesses(
    canaries: int,
    guesses: int,
    correct: int,
    *,
    delta: float,
    significance: float,
    floor: float = 0.0,
) -> float:
    """The largest ε whose (ε, δ) claim k guesses with v correct reject at level s.

    Returns ``floor`` when no ε ≥ floor is rejected.
    """
    if one_run_p_value(canaries, guesses, correct, floor, 0.0) > significance:
        return floor  # not even with δ = 0 (the p-value only grows with δ)
    return largest_rejected(
        lambda e: significance - one_run_p_value(canaries, guesses, correct, e, delta), floor
    )


def best_over_thresholds(
    scores: np.ndarray,
    included: np.ndarray,
    *,
    delta: float,
    confidence: float,
    test: str,
    epsilon_for: Callable[..., float],
    guesses: str = "grid",
) -> AuditBound:
    """The best bound ``epsilon_for(m, k, v, delta=, significance=, floor=)`` gives over the
    guess counts of the rule ``guesses`` (module docstring), each at level (1 − confidence)/G.

    Tried in decreasing precision v/k: a threshold whose precision is ≤ e^ε/(1+e^ε) of the
    best ε so far cannot beat it (its binomial tail is ≥ ½) and is skipped.
    """
    require(0.5 < confidence < 1, "confidence", confidence, "in (0.5, 1)", "Use 0.95")
    require(0 < delta < 1, "delta", delta, "in (0, 1)")
    require(guesses in GUESSES, "guesses", guesses, f"one of {list(GUESSES)}")
    k, v = (grid_counts if guesses == "grid" else guess_counts)(scores, included)
    m = int(np.asarray(scores).size)
    significance = (1 - confidence) / len(k)
    best, best_k, best_v = 0.0, 0, 0
    guessed = k > 0
    k, v = k[guessed], v[guessed]
    for idx in np.lexsort((-k, -v / k)):  # precision descending, then more guesses first
        kk, vv = int(k[idx]), int(v[idx])
        if vv / kk <= special.expit(best):
            continue
        eps = epsilon_for(m, kk, vv, delta=delta, significance=significance, floor=best)
        if eps > best:
            best, best_k, best_v = eps, kk, vv
    return AuditBound(
        epsilon=float(best),
        test=test,
        guesses=best_k,
        correct=best_v,
        canaries=m,
        delta=delta,
        confidence=confidence,
        thresholds=int(guessed.size),
        guessing=guesses,
    )


def one_run_epsilon(
    scores: np.ndarray,
    included: np.ndarray,
    *,
    delta: float,
    confidence: float = 0.95,
    guesses: str = "grid",
) -> AuditBound:
    """Steinke et al.'s lower bound on ε from canary ``scores`` (higher: more likely "in") and
    the secret inclusion bits, at ``confidence``, for a claim with this ``delta``; ``guesses``
    is the guessing rule (module docstring)."""
    return best_over_thresholds(
        scores,
        included,
        delta=delta,
        confidence=confidence,
        test="one_run",
        epsilon_for=epsilon_for_guesses,
        guesses=guesses,
    )
