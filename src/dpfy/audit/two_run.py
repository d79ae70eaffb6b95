"""The two-run audit: many runs with and many without one canary, a threshold test on each
run's canary score, and Clopper–Pearson bounds on its error rates (Jagielski, Ullman & Oprea
2020; Nasr et al. 2021). For tiny models, as a cross-check of the one-run audit.

For (ε, δ)-DP, every test with false-positive rate FPR and true-positive rate TPR satisfies
TPR ≤ e^ε·FPR + δ, so ε ≥ ln((TPR − δ) / FPR). With n_in runs containing the canary and n_out
without, a threshold τ guesses "in" when score ≥ τ; the bound uses the Clopper–Pearson upper
limit of FPR and lower limit of TPR, each at level s/2 (one-sided), so it holds with
confidence 1 − s. With the canary's score a projection of the released sums on its direction
and Gaussian noise, a threshold on the score is the exact likelihood-ratio (Neyman–Pearson)
test between the two runs' output laws.

τ: given in advance (valid as is), or the best over every candidate threshold, each tested at
level s/H for the H candidates (Bonferroni).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
from scipy import stats

from dpfy._require import require
from dpfy.audit.canaries import CanarySet
from dpfy.audit.run import audited_private_run, canary_scores
from dpfy.train.epoch import run_epoch

__all__ = [
    "TwoRunBound",
    "clopper_pearson_upper",
    "two_run_epsilon",
    "single_canary",
    "canary_run_score",
]


@dataclass(frozen=True)
class TwoRunBound:
    """ε lower bound of a two-run audit and the counts behind it."""

    epsilon: float
    threshold: float
    true_positives: int
    false_positives: int
    runs_in: int
    runs_out: int
    delta: float
    confidence: float


def clopper_pearson_upper(successes: int, trials: int, significance: float) -> float:
    """The one-sided upper confidence limit p with P[Binomial(n, p) ≤ k] = s (1 when k = n)."""
    if successes >= trials:
        return 1.0
    return float(stats.beta.ppf(1 - significance, successes + 1, trials - successes))


def _bound_at(tp: int, fp: int, n_in: int, n_out: int, delta: float, s: float) -> float:
    fpr_hi = clopper_pearson_upper(fp, n_out, s / 2)
    tpr_lo = 1 - clopper_pearson_upper(n_in - tp, n_in, s / 2)
    if tpr_lo <= delta or fpr_hi <= 0:
        return 0.0
    return max(0.0, math.log((tpr_lo - delta) / fpr_hi))


def two_run_epsilon(
    in_scores: np.ndarray,
    out_scores: np.ndarray,
    *,
    delta: float,
    confidence: float = 0.95,
    threshold: float | None = None,
) -> TwoRunBound:
    """ε lower bound from the canary's scores in runs with it (``in_scores``) and without."""
    a = np.asarray(in_scores, dtype=np.float64).reshape(-1)
    b = np.asarray(out_scores, dtype=np.float64).reshape(-1)
    require(
        a.size >= 1 and b.size >= 1,
        "scores",
        (a.size, b.size),
        "at least one run with and one without the canary",
    )
    require(0.5 < confidence < 1, "confidence", confidence, "in (0.5, 1)")
    require(0 <= delta < 1, "delta", delta, "in [0, 1)")
    s = 1 - confidence
    candidates = np.array([threshold]) if threshold is not None else np.unique(np.r_[a, b])
    if threshold is None:
        s /= candidates.size
    best = TwoRunBound(0.0, math.inf, 0, 0, a.size, b.size, delta, confidence)
    for t in candidates:
        tp, fp = int((a >= t).sum()), int((b >= t).sum())
        eps = _bound_at(tp, fp, a.size, b.size, delta, s)
        if eps > best.epsilon or (threshold is not None):
            best = TwoRunBound(eps, float(t), tp, fp, a.size, b.size, delta, confidence)
    return best


def single_canary(
    model: torch.nn.Module,
    include: bool,
    direction: torch.Tensor | None = None,
) -> CanarySet:
    """A one-canary set for ``model``: ``include`` decides this run's side; ``direction`` (the
    same in every run) defaults to the first coordinate."""
    layout = tuple((n, tuple(p.shape)) for n, p in model.named_parameters() if p.requires_grad)
    d = sum(int(np.prod(s)) for _, s in layout)
    u = torch.zeros(d) if direction is None else direction.reshape(-1).float()
    if direction is None:
        u[0] = 1.0
    require(
        u.numel() == d and abs(float(u.norm()) - 1) < 1e-5,
        "direction",
        tuple(u.shape),
        f"a unit vector of {d} entries",
    )
    return CanarySet(included=torch.tensor([bool(include)]), directions=u[None, :], layout=layout)


def canary_run_score(
    build: Callable[[], tuple[torch.nn.Module, torch.optim.Optimizer, Any]],
    *,
    include: bool,
    epochs: int,
    batch_size: int | None = None,
    direction: torch.Tensor | None = None,
    **engine: Any,
) -> float:
    """One run of the two-run audit: train what ``build()`` returns (model, optimizer,
    training set) through ``make_private`` with the canary in or out, return its score.

    ``batch_size`` defaults to the whole set (q = 1 with and without the canary, so the two
    runs sample alike); ``engine``: the rest of ``make_private``'s arguments.
    """
    model, optimizer, train = build()
    draw = single_canary(model, include, direction)
    size = len(train) + int(include)
    audited = audited_private_run(
        model,
        optimizer,
        train,
        canaries=draw,
        batch_size=batch_size or size,
        epochs=epochs,
        **engine,
    )
    for _ in range(epochs):
        run_epoch(audited.private, delta=1e-5)  # δ only labels a progress bar (none here)
    return float(canary_scores(audited.private.optimizer)[0])
