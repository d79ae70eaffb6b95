"""Individualized PATE utilities (Boenisch et al. 2023, as reviewed by Monir, Fauzan & Ghinita
2023, §5, Algorithms 1 and 2): examples worked out by hand from the algorithms."""

import pytest

from dpfy.privacy.pate import pate_teacher_weights, pate_upsampling_factors


def test_upsampling_factors():
    # Algorithm 1: {1, 2, 3} at p = 1 → ε̄ = {10, 20, 30}, D = 10 → {1, 2, 3}.
    assert pate_upsampling_factors([1.0, 2.0, 3.0, 2.0], precision=1) == [1, 2, 3, 2]
    # Algorithm 1: {0.5, 1.5} at p = 1 → {5, 15}, D = 5 → {1, 3}.
    assert pate_upsampling_factors([0.5, 1.5], precision=1) == [1, 3]


def test_teacher_weights_sum_over_groups_to_k():
    # Algorithm 2 (sums over groups): ε = {1, 2, 3}, n = {3, 4, 3}, k = 10 → w = {1.5, 4.0, 4.5}.
    w = pate_teacher_weights([1.0, 2.0, 3.0], [3, 4, 3], 10)
    assert w == pytest.approx([1.5, 4.0, 4.5])
    assert sum(w) == pytest.approx(10)                                   # groups sum to k
    assert sum(n * x for n, x in zip([3, 4, 3], w)) == pytest.approx(34)  # teachers do not


@pytest.mark.parametrize("call, match", [
    (lambda: pate_upsampling_factors([0.0, 1.0]), "budgets must be > 0"),
    (lambda: pate_upsampling_factors([0.01, 1.0], precision=1), "Raise the precision"),
    (lambda: pate_teacher_weights([1.0, 2.0], [3, 4], 8), "total_teachers must be"),
    (lambda: pate_teacher_weights([1.0, 2.0], [3], 3), "len\\(teachers\\)"),
])
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()
