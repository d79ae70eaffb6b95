"""rdp_integer's closed form keeps its memory bounded in the number of noise levels.

Individual accounting without rounding asks for one RDP curve per distinct clipped-norm ratio
of a row: up to the dataset size (50,000 for CIFAR-10). The (σ, k) arrays of the log-sum-exp
at order α = 1024 hold 1025 float64 per σ, several of them at once: formed for every σ together
they took ≈ 50 kB per σ (1.0 GB for 20,000 measured with tracemalloc), so the memory grew with
the dataset. Formed in fixed-size blocks of σ, the peak stays the same from 1,024 σ to 8,192 σ:
the check compares the two peaks (numpy's allocations, counted exactly by tracemalloc), so it
needs no machine-dependent threshold, and the values must not change (same terms, same sums).
"""

from __future__ import annotations

import tracemalloc

import numpy as np

from dpfy.privacy.rdp_integer import subsampled_gaussian_rdp

ORDERS = np.array([2.0, 1024.0])  # the largest integer order dominates the arrays


def _peak(sigmas: np.ndarray) -> tuple[int, np.ndarray]:
    tracemalloc.start()
    try:
        out = subsampled_gaussian_rdp(0.01, sigmas, ORDERS)
        return tracemalloc.get_traced_memory()[1], out
    finally:
        tracemalloc.stop()


def test_peak_memory_does_not_grow_with_the_number_of_noise_levels():
    small_peak, small = _peak(np.linspace(1.0, 50.0, 1024))
    big_sigmas = np.linspace(1.0, 50.0, 8192)
    big_peak, big = _peak(big_sigmas)
    # the output itself grows (8192 × 2 float64 = 128 kB); the temporaries must not: 8× the
    # σ formed at once would be ≈ 8× the peak, a block at a time ≈ 1× plus the output
    assert big_peak < 2 * small_peak, (small_peak, big_peak)
    # one σ alone gives the same row as inside a block (rows are independent: the same terms
    # summed by the same reduction; 1e-14 relative leaves room for a vectorized sum's order)
    for i in (0, 4095, 8191):
        one = subsampled_gaussian_rdp(0.01, big_sigmas[i : i + 1], ORDERS)[0]
        np.testing.assert_allclose(big[i], one, rtol=1e-14, atol=0)
