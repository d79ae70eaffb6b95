"""Individual accounting's rounding (Yu et al.'s r) never rounds a norm ratio down.

``round_up(ρ, r)`` must return the smallest grid point k·r (k an integer, the product in
float64, capped at 1) that is ≥ ρ: a grid point below ρ would charge the example a
sensitivity smaller than its clipped norm, so an ε_i below its own RDP bound. The checks
below state that definition directly (k·r ≥ ρ and (k − 1)·r < ρ), with ρ just above and
just below grid points, where ρ/r in float64 lands on the wrong side of an integer.
"""

from __future__ import annotations

import numpy as np
import pytest

from dpfy.privacy.per_example_accounting import round_up


def _grid_rows(r: float) -> np.ndarray:
    """ρ at, one part in 1e13 above, and one part in 1e13 below every grid point k·r < 1."""
    points = np.arange(1, int(np.floor(1 / r)) + 1) * r
    points = points[points < 1]
    return np.concatenate([points, points * (1 + 1e-13), points * (1 - 1e-13)])


@pytest.mark.parametrize("r", [0.1, 0.25, 0.01, 0.3, 0.07])
def test_round_up_is_the_smallest_grid_point_not_below_rho(r):
    rho = _grid_rows(r)
    got = round_up(rho, r)
    k = np.round(got / r)  # the grid index of each result (exact: got is a float k·r or 1)
    capped = got == 1.0
    assert np.all(got >= rho), rho[got < rho]  # never rounded down: the sensitivity holds
    below = (k - 1) * r  # the grid point under the result, as round_up's grid writes it
    assert np.all((below < rho) | capped)  # and the smallest such grid point
    assert np.all(np.isclose(got[~capped], k[~capped] * r, rtol=0, atol=0))


def test_round_up_keeps_exact_grid_points_and_the_cap():
    # 0.3 / 0.1 = 2.9999999999999996 in float64: still the grid point 3·0.1
    assert round_up(np.array([0.3]), 0.1)[0] == 3 * 0.1
    assert list(round_up(np.array([0.0, 1.0, 1.7]), 0.3)) == [0.0, 1.0, 1.0]
