"""The released loss's trend (``dpfy.adaptive._loss_trend``): its rise and standard error from
a derivation written here, its false-alarm rate on stationary noise and its detection of a
climb, both by Monte Carlo."""

from __future__ import annotations

import math
import random

import pytest

from dpfy.adaptive._loss_trend import LossTrend


def _filled(values, std=0.1, window=10):
    t = LossTrend(window)
    for v in values:
        t = t.add(v, std)
    return t


def _alarms(test, noise: float, declared: float, runs: int = 100, rounds: int = 200) -> int:
    """How many rounds ``test(trend)`` fires on stationary N(1, noise²) losses declared at
    std ``declared``, over ``runs`` runs of ``rounds`` rounds."""
    alarms = 0
    for seed in range(runs):
        rng, t = random.Random(seed), LossTrend(10)
        for _ in range(rounds):
            t = t.add(rng.gauss(1.0, noise), declared)
            alarms += test(t)
    return alarms


def test_rise_is_the_windows_mean_difference_with_the_declared_std_when_it_dominates():
    """Windows [1]*10 then [2]*10, declared std 0.1, no spread: rise 1, se = 0.1·√(2/10)."""
    diff, se = _filled([1.0] * 10 + [2.0] * 10).rise()
    assert diff == pytest.approx(1.0)
    assert se == pytest.approx(0.1 * math.sqrt(2 / 10))


def test_the_spread_of_the_released_losses_counts_when_larger_than_the_declared_std():
    """Each window alternates ±0.5 around its mean: sample variance 0.5²·10/9 per window, so
    the per-round std is 0.5·√(10/9) > the declared 0.1."""
    old = [1.0 + (0.5 if i % 2 else -0.5) for i in range(10)]
    new = [1.2 + (0.5 if i % 2 else -0.5) for i in range(10)]
    diff, se = _filled(old + new).rise()
    assert diff == pytest.approx(0.2)
    assert se == pytest.approx(0.5 * math.sqrt(10 / 9) * math.sqrt(2 / 10))


def test_no_verdict_before_two_windows_and_only_the_latest_two_are_kept():
    t = _filled([5.0] * 19)
    assert not t.rising(4.0) and math.isnan(t.rise()[0])
    t = _filled([100.0] * 5 + [1.0] * 10 + [1.0] * 10)      # the first 5 have left
    assert t.rise()[0] == pytest.approx(0.0)


def test_a_non_finite_loss_or_a_reset_empties_it():
    t = _filled([1.0] * 20)
    assert len(t.add(math.nan, 0.1).losses) == 0
    assert len(t.reset().losses) == 0 and t.reset().window == 10


def test_false_alarms_are_rare_on_stationary_noise_and_a_climb_is_seen():
    """Stationary N(1, 0.1²) losses with std 0.1 declared: at 4 standard errors, one-sided,
    P(alarm) ≈ 3e-5 a round; over 100 runs × 200 rounds (sliding windows) none is expected.
    A climb of 0.03 a round puts the windows' means 0.3 apart; the ramp adds to the spread
    within a window (per-round std √(0.1² + 0.03²·(10² − 1)/12) ≈ 0.13), so the rise is
    ≈ 0.3/(0.13·√0.2) ≈ 5 standard errors: seen within 40 rounds in every run."""
    assert _alarms(lambda t: t.rising(4.0), noise=0.1, declared=0.1) == 0
    for seed in range(100):
        rng, t = random.Random(seed), LossTrend(10)
        seen = False
        for r in range(40):
            t = t.add(1.0 + 0.03 * r + rng.gauss(0.0, 0.1), 0.1)
            seen = seen or t.rising(4.0)
        assert seen


def test_bad_window_is_refused():
    with pytest.raises(ValueError, match="window"):
        LossTrend(1)


def test_a_jump_is_the_last_round_against_the_one_before_beyond_the_larger_std():
    """Declared std 0.1, five flat rounds before: a jump of 0.5 is 0.5/(0.1·√2) ≈ 3.5 stds
    (not seen at 4), 0.6 is 4.2 (seen); a spread of held losses larger than the declared std
    raises the bar; fewer than five held before: no verdict."""
    assert not _filled([1.0] * 4 + [3.0]).jumped(4.0)
    assert not _filled([1.0] * 5 + [1.5]).jumped(4.0)
    assert _filled([1.0] * 5 + [1.6]).jumped(4.0)
    assert not _filled([0.5, 1.5, 0.5, 1.5, 1.0, 1.6]).jumped(4.0)   # spread ≈ 0.45 ≫ 0.1


def test_jumps_are_not_seen_on_stationary_noise_larger_than_declared_but_a_divergence_is():
    """Losses N(1, 0.2²) with std 0.1 declared (batch sampling doubles the noise): the spread
    of the held rounds takes over, and over 100 runs × 200 rounds no jump beyond 8 stds is
    seen (HyFreeDP's: twice its windows' 4; the spread of 5–20 rounds is itself noisy, so the
    ratio has Student-t tails: at 4 stds a handful of false jumps appear in 2·10⁴ rounds). A
    loss tripling from one round to the next after 10 stationary rounds is seen at 4 (per-round
    std max(√((0.1² + 0.3²)/2), ≈ 0.2) ≈ 0.22: 2/(0.22·√2) ≈ 6.3 stds), a ×5 at 8 (≈ 12.6).
    """
    assert _alarms(lambda t: t.jumped(8.0), noise=0.2, declared=0.1) == 0
    for seed in range(20):
        rng, t = random.Random(seed), LossTrend(10)
        for _ in range(10):
            t = t.add(rng.gauss(1.0, 0.2), 0.1)
        assert t.add(3.0, 0.3).jumped(4.0) and t.add(5.0, 0.3).jumped(8.0)
