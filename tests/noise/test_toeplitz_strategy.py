"""The banded Toeplitz strategy: inverse, prefix-sum objective and optimizer, against dense
linear algebra and derivations written here (identity = DP-SGD, the honest binary tree)."""

import math

import pytest
import torch

from dpfy.noise.toeplitz import (banded_matrix, check_normalized, inverse_coefficients,
                                 optimize_banded, prefix_error, sqrt_coefficients)


def _dense_objective(c: torch.Tensor, n: int) -> float:
    """‖A C⁻¹‖_F² / n × (largest column norm of C)², A the prefix-sum matrix (dense)."""
    C = banded_matrix(c, n)
    A = torch.tril(torch.ones(n, n, dtype=torch.float64))
    B = A @ torch.linalg.inv(C)
    return float(B.square().sum() / n * C.square().sum(0).max())


def _tree_objective(n: int) -> float:
    """The honest tree on the same workload: prefix t adds one node per 1-bit of t (its
    dyadic decomposition, counted here by peeling the largest power of two), and one example
    enters ⌈log2(n+1)⌉ nodes (its sensitivity²)."""
    def nodes(t: int) -> int:
        count = 0
        while t:
            t -= 1 << (t.bit_length() - 1)
            count += 1
        return count
    return sum(nodes(t) for t in range(1, n + 1)) / n * math.ceil(math.log2(n + 1))


def test_inverse_coefficients_match_the_dense_inverse():
    c = torch.tensor([1.3, -0.4, 0.25, 0.1], dtype=torch.float64)
    dense = torch.linalg.inv(banded_matrix(c, 40))
    assert torch.allclose(inverse_coefficients(c, 40), dense[:, 0], atol=1e-12)
    # Toeplitz: every column is the first one shifted
    assert torch.allclose(dense[5:, 5], dense[:35, 0], atol=1e-12)


def test_prefix_error_matches_dense_objective():
    c = torch.tensor([0.8, 0.45, 0.3, 0.2, 0.1], dtype=torch.float64)
    assert float(prefix_error(c, 33)) == pytest.approx(_dense_objective(c, 33), rel=1e-10)


def test_identity_is_dp_sgd_objective():
    # C = I: query k (1-based) sums k unit-variance noises; the mean is (n + 1)/2
    assert float(prefix_error(torch.ones(1, dtype=torch.float64), 64)) == pytest.approx(32.5)
    assert optimize_banded(64, 1).tolist() == [1.0]


def test_optimized_strategy_beats_identity_and_tree():
    n, bands = 128, 8
    c = optimize_banded(n, bands)
    assert c.shape == (bands,)
    assert float(c.norm()) == pytest.approx(1.0, abs=1e-12)
    ours = _dense_objective(c, n)
    assert ours < (n + 1) / 2           # DP-SGD's (identity) objective
    assert ours < _tree_objective(n)
    # and no worse than its starting point, the truncated square root of A
    start = sqrt_coefficients(bands)
    assert ours <= _dense_objective(start / start.norm(), n) + 1e-9


def test_bands_beyond_horizon_are_zero_and_normalization_is_checked():
    c = optimize_banded(3, 5)
    assert c.shape == (5,) and c[3:].abs().max() == 0
    with pytest.raises(ValueError, match="column norm"):
        check_normalized(torch.tensor([1.0, 0.5]))
