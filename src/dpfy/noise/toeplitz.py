"""Banded Toeplitz strategies for the matrix-factorization mechanism, optimized for prefix sums.

The matrix mechanism (Denisov et al. 2022; Choquette-Choo et al. 2023) releases the workload
A·G of the gradients G (rows: steps) as B·(C·G + σΔ·Z) with A = B·C: equivalently, each step's
gradient sum gets the correlated noise σΔ·(C⁻¹Z)_t. DP-SGD is C = I. Here C is lower-triangular
Toeplitz and **b-banded**: C[t, s] = c_{t−s} for 0 ≤ t − s < b, else 0, described by its b
coefficients c. Its inverse is lower-triangular Toeplitz too, with coefficients d = c⁻¹ as a
power series (c * d = 1).

For the prefix-sum workload A (lower-triangular ones; SGD's iterates are θ_0 − η·A·G̃) over n
steps, the expected squared error of query k is Σ_{j≤k} (Σ_{i≤j} d_i)², and the objective is the
mean over k times the sensitivity², ‖c‖² (the largest column norm of a Toeplitz C is its first
column's). With participations at least b steps apart the columns an example touches have
disjoint supports, so this single-participation objective is the right one for cyclic Poisson
sampling (Choquette-Choo et al. 2023; McKenna 2024 optimizes the same loss).

:func:`optimize_banded` minimizes it over c with L-BFGS and returns c scaled to ‖c‖ = 1, the
normalization the accounting assumes (every column norm ≤ 1).
"""

from __future__ import annotations

import math

import torch

from dpfy._require import require

__all__ = ["inverse_coefficients", "prefix_error", "optimize_banded", "sqrt_coefficients"]


def _convolve(a: torch.Tensor, b: torch.Tensor, length: int) -> torch.Tensor:
    """The first ``length`` coefficients of the product of power series a and b (FFT)."""
    size = 1 << max(1, (a.numel() + b.numel() - 1).bit_length())
    out = torch.fft.irfft(torch.fft.rfft(a, size) * torch.fft.rfft(b, size), size)
    return out[:length]


def inverse_coefficients(c: torch.Tensor, n: int) -> torch.Tensor:
    """The n Toeplitz coefficients of C⁻¹ for the Toeplitz C with leading coefficients ``c``.

    Newton's iteration on power series, d ← d·(2 − c·d) mod x^{2m}, doubling the correct
    length each round (float64, differentiable in c). Requires c_0 ≠ 0.
    """
    require(
        c.numel() >= 1 and float(c[0].detach()) != 0,
        "c[0]",
        c.detach()[:1].tolist(),
        "non-zero (C must be invertible)",
    )
    c = c.to(torch.float64)
    d = (1.0 / c[:1]).reshape(1)
    m = 1
    while m < n:
        m = min(2 * m, n)
        cd = _convolve(c[:m], d, m)
        d = 2 * torch.nn.functional.pad(d, (0, m - d.numel())) - _convolve(d, cd, m)
    return d[:n]


def prefix_error(c: torch.Tensor, n: int) -> torch.Tensor:
    """Mean squared error of the n prefix sums per unit σ, times the sensitivity² ‖c‖².

    Query k's noise is Σ_{j≤k} (A C⁻¹)_{k,j} z_j with (A C⁻¹)_{k,j} = Σ_{i ≤ k−j} d_i, so its
    variance is Σ_{j≤k} (Σ_{i≤j} d_i)²: the cumulative sum of the squared cumulative sums.
    """
    d = inverse_coefficients(c, n)
    per_query = torch.cumsum(torch.cumsum(d, 0).square(), 0)  # (n,)
    return per_query.mean() * c.to(torch.float64).square().sum()


def sqrt_coefficients(bands: int) -> torch.Tensor:
    """The first ``bands`` coefficients of the square root of the prefix-sum matrix,
    c_k = ∏_{j≤k} (2j − 1)/(2j) (Fichtenberger et al. 2023): the optimizer's starting point."""
    k = torch.arange(bands, dtype=torch.float64)
    ratios = (2 * k - 1) / (2 * k).clamp(min=1)
    ratios[0] = 1.0
    return torch.cumprod(ratios, 0)


def optimize_banded(n: int, bands: int, *, max_iterations: int = 200) -> torch.Tensor:
    """The b-banded Toeplitz strategy (b = ``bands``) minimizing :func:`prefix_error` over n
    steps, scaled to ‖c‖ = 1 (float64, (bands,)). bands = 1 is DP-SGD (c = [1])."""
    require(isinstance(n, int) and n >= 1, "n", n, "an integer >= 1")
    require(isinstance(bands, int) and 1 <= bands, "bands", bands, "an integer >= 1")
    if bands > n:  # bands beyond the horizon never act: zeros keep the length b
        return torch.cat(
            [
                optimize_banded(n, n, max_iterations=max_iterations),
                torch.zeros(bands - n, dtype=torch.float64),
            ]
        )
    if bands == 1:
        return torch.ones(1, dtype=torch.float64)
    tail = sqrt_coefficients(bands)[1:].clone().requires_grad_(True)
    one = torch.ones(1, dtype=torch.float64)
    opt = torch.optim.LBFGS(
        [tail],
        lr=1.0,
        max_iter=max_iterations,
        tolerance_grad=1e-10,
        tolerance_change=1e-14,
        line_search_fn="strong_wolfe",
    )

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = prefix_error(torch.cat([one, tail]), n)
        loss.backward()
        return loss

    with torch.enable_grad():
        opt.step(closure)
    c = torch.cat([one, tail.detach()])
    require(
        bool(torch.isfinite(c).all()),
        "the optimized strategy",
        "not finite",
        "finite coefficients",
        "Use fewer bands or fewer steps",
    )
    return c / c.norm()


def banded_matrix(c: torch.Tensor, n: int) -> torch.Tensor:
    """The dense n×n lower-triangular banded Toeplitz matrix of ``c`` (tests, small n)."""
    out = torch.zeros(n, n, dtype=c.dtype)
    for k in range(min(c.numel(), n)):
        out += torch.diag(c[k].expand(n - k), -k)
    return out


def check_normalized(c: torch.Tensor) -> float:
    """‖c‖ (the largest column norm of the strategy), refused above 1 + 1e-9."""
    norm = float(torch.as_tensor(c, dtype=torch.float64).norm())
    require(
        math.isfinite(norm) and norm <= 1 + 1e-9,
        "the strategy's column norm",
        norm,
        "<= 1 (the accounting assumes normalized columns)",
        "Scale the coefficients to unit norm (optimize_banded does)",
    )
    return norm
