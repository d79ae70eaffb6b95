"""The audit statistics against the issue's known values (jax_privacy's audit tests) and
against derivations written here."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special, stats

from dpfy.audit.fdp import fdp_epsilon
from dpfy.audit.stats import guess_counts, one_run_epsilon, one_run_p_value

N = 10_000          # in-canaries, and as many out-canaries (issue 15 §1)
# Scores at the exact expected positions of N(0, 1) order statistics: the (i + ½)/N quantiles
# (deterministic; no seed), as in jax_privacy's test that produced the values below.
OUT = stats.norm.ppf((np.arange(N) + 0.5) / N)
INCLUDED = np.r_[np.ones(N, bool), np.zeros(N, bool)]

# Issue 15 §1 (from jax_privacy's audit tests): 95 % confidence, δ = 1e-6. Tolerance: relative
# 1e-5, the precision to which the values are given (and that of their root finding).
KNOWN = [(1, 1.13346, 2.164749), (2, 2.311945, 4.7218075), (4, 4.395568, 9.133752)]


@pytest.mark.parametrize("shift,one_run,fdp", KNOWN)
def test_known_values(shift: float, one_run: float, fdp: float) -> None:
    scores = np.r_[OUT + shift, OUT]
    assert one_run_epsilon(scores, INCLUDED, delta=1e-6).epsilon == pytest.approx(one_run, rel=1e-5)
    assert fdp_epsilon(scores, INCLUDED, delta=1e-6).epsilon == pytest.approx(fdp, rel=1e-5)


def test_p_value_matches_the_papers_sum_written_out() -> None:
    # Steinke et al. Alg. 2: α accumulates P[B = v − i] one i at a time and keeps max sum / i.
    m, k, v, eps, delta = 100, 40, 31, 0.7, 1e-3
    q = math.exp(eps) / (1 + math.exp(eps))
    beta = sum(math.comb(k, j) * q**j * (1 - q)**(k - j) for j in range(v, k + 1))
    acc, alpha = 0.0, 0.0
    for i in range(1, v + 1):
        acc += math.comb(k, v - i) * q**(v - i) * (1 - q)**(k - v + i)
        alpha = max(alpha, acc / i)
    assert one_run_p_value(m, k, v, eps, delta) == pytest.approx(beta + 2 * m * delta * alpha,
                                                                 rel=1e-9)


def test_guess_counts_keep_the_hull_and_skip_ties() -> None:
    # in: 3, 2, 2; out: 2, 0. (false negatives, true negatives) below t = 0, 2, 3, ∞:
    # (0,0), (0,1), (2,2), (3,2), all on the upper hull. No threshold splits the tied 2s, so the
    # guesses are k = 5, 4, 1, 0 with v = 3, 3, 1, 0 correct.
    k, v = guess_counts(np.array([3.0, 2, 2, 2, 0]), np.array([1, 1, 1, 0, 0], bool))
    assert list(zip(k.tolist(), v.tolist())) == [(5, 3), (4, 3), (1, 1), (0, 0)]
    # in: 3, 1; out: 2, 0: counts (0,0), (0,1), (1,1), (1,2), (2,2); (1,1) lies below the chord
    # (0,1)–(1,2) (a mixture of those two thresholds beats it) and is dropped.
    k, v = guess_counts(np.array([3.0, 1, 2, 0]), np.array([1, 1, 0, 0], bool))
    assert list(zip(k.tolist(), v.tolist())) == [(4, 2), (3, 2), (1, 1), (0, 0)]


def test_no_signal_gives_no_bound() -> None:
    scores = np.r_[OUT, OUT]          # in and out identically distributed
    assert one_run_epsilon(scores, INCLUDED, delta=1e-6).epsilon == 0.0
    assert fdp_epsilon(scores, INCLUDED, delta=1e-6).epsilon == 0.0


def test_refuses_bad_inputs() -> None:
    with pytest.raises(ValueError, match="included must be"):
        one_run_epsilon(np.zeros(3), np.zeros(2, bool), delta=1e-6)
    with pytest.raises(ValueError, match="confidence must be"):
        one_run_epsilon(np.zeros(3), np.zeros(3, bool), delta=1e-6, confidence=0.3)
