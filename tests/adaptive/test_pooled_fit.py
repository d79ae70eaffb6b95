"""PooledFit: HyFreeDP's probe fits averaged over rounds (inverse-variance weights, forgetting).

Numbers come from derivations written here: the weighted mean and its std for two rounds, the
steady-state std std·√((1 − λ)/(1 + λ)) of an exponentially weighted mean of equal-variance
rounds (Σ λ^{2j} / (Σ λ^j)² = (1 − λ)²/(1 − λ²)), and a Monte Carlo of its coverage.
"""

from __future__ import annotations

import math
import random

import pytest

from dpfy.adaptive._pooled_fit import PooledFit


def test_no_memory_is_the_latest_round():
    p = PooledFit(0.0).add(1.0, 2.0, std_a=3.0, std_b=4.0).add(5.0, 6.0, std_a=7.0, std_b=8.0)
    assert (p.a, p.b, p.std_a, p.std_b) == (5.0, 6.0, 7.0, 8.0)


def test_two_rounds_are_inverse_variance_weighted_with_forgetting():
    """Round 1 (a = 1, std 1) aged one round at λ = 0.5 has weight 0.5; round 2 (a = 4, std 2)
    weight 1/4. Mean (0.5·1 + 0.25·4)/0.75 = 2; std √(0.5²·1 + 0.25²·4)/0.75 = √0.5/0.75."""
    p = PooledFit(0.5).add(1.0, 0.0, std_a=1.0, std_b=1.0).add(4.0, 0.0, std_a=2.0, std_b=1.0)
    assert p.a == pytest.approx(2.0)
    assert p.std_a == pytest.approx(math.sqrt(0.5) / 0.75)
    assert p.rounds == 2


@pytest.mark.parametrize("memory", [0.5, 0.9, 0.95])
def test_steady_state_std_and_coverage(memory):
    """Equal stds s: the pooled std tends to s·√((1 − λ)/(1 + λ)); and the pooled mean of noisy
    rounds around a = 3 lies within 2 pooled stds about 95 % of the time (Monte Carlo)."""
    rng = random.Random(0)
    s, inside, total = 2.0, 0, 0
    p = PooledFit(memory)
    for k in range(6000):
        p = p.add(3.0 + rng.gauss(0, s), 0.0, std_a=s, std_b=1.0)
        if k >= 200 and k % 10 == 0:          # rounds ~decorrelated at λ ≤ 0.95
            inside += abs(p.a - 3.0) <= 2 * p.std_a
            total += 1
    assert p.std_a == pytest.approx(s * math.sqrt((1 - memory) / (1 + memory)), rel=1e-6)
    assert 0.90 <= inside / total <= 0.99


def test_zero_noise_rounds_are_exact_and_a_failed_round_resets():
    p = PooledFit(0.9).add(2.0, 1.0, std_a=0.0, std_b=0.0)
    assert (p.a, p.b, p.std_a, p.std_b) == (2.0, 1.0, 0.0, 0.0)
    assert PooledFit(0.9).add(1.0, 1.0, std_a=1.0, std_b=1.0).add(
        math.nan, 1.0, std_a=1.0, std_b=1.0).rounds == 0
    assert math.isinf(PooledFit(0.9).std_a) and math.isnan(PooledFit(0.9).a)


def test_memory_out_of_range_is_refused():
    with pytest.raises(ValueError, match="memory"):
        PooledFit(1.0)
