"""Probe fits pooled over rounds: HyFreeDP's (a, b) with a fraction of one round's noise.

Why: one probe round's fit is three released losses, each with noise std u = σ_l·R_l/b. On
Fashion-MNIST at ε = 3 (b = 2048, σ_l ≈ 10) u is larger than what one step changes the loss
by after the first epochs, so a single round almost never resolves the curvature a = dᵀHd or
the slope b = ∇Lᵀd (docs/results/hyfree_fmnist.md), and a rule acting on single rounds either
freezes or, through its false positives (2.3 % a round at two stds, hundreds of rounds), only
ever shrinks η. But a and b are properties of the loss along the optimizer's direction d,
not of the probe spacing η (the fit is exact on a quadratic for any spacing), and they drift
slowly over rounds; averaging rounds reduces the noise where one round cannot.

The pool is an inverse-variance weighted average with exponential forgetting: round k, of
age j rounds, has weight λ^j / std_k², so rounds probed at a larger spacing (smaller std)
count more. Its noise std is √(Σ w_k² std_k²) / Σ w_k (the weights are public: they depend on
σ_l, R_l, b and η only), which for equal stds is std·√((1 − λ)/(1 + λ)) at steady state:
λ = 0.95 averages about 39 rounds' worth (std ÷ 6.2). Everything pooled is released
(post-processing).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from dpfy._require import require

__all__ = ["PooledFit"]


@dataclass(frozen=True)
class _Pool:
    """Σ w_k x_k, Σ w_k and Σ w_k² std_k² of one estimate, with w_k = λ^age / std_k²."""

    weighted: float = 0.0
    weight: float = 0.0
    variance: float = 0.0
    exact: bool = False          # a round had std 0 (σ_l = 0): the pool is its value alone

    def add(self, value: float, std: float, memory: float) -> "_Pool":
        if std == 0.0 or self.exact:
            return _Pool(value, 1.0, 0.0, True) if std == 0.0 else self
        w = 1.0 / std ** 2
        return _Pool(memory * self.weighted + w * value, memory * self.weight + w,
                     memory ** 2 * self.variance + w ** 2 * std ** 2)

    @property
    def mean(self) -> float:
        return self.weighted / self.weight if self.weight > 0 else math.nan

    @property
    def std(self) -> float:
        return math.sqrt(self.variance) / self.weight if self.weight > 0 else math.inf


@dataclass(frozen=True)
class PooledFit:
    """(a, b) of the probe rounds so far, pooled with forgetting factor ``memory`` (λ).

    ``memory = 0`` keeps the latest round only (the unpooled rule). :meth:`add` takes one
    round's fit and its noise stds; :attr:`a`, :attr:`b`, :attr:`std_a`, :attr:`std_b` are the
    pooled estimates and their noise stds, to be tested exactly as one round's are.
    """

    memory: float
    curvature: _Pool = _Pool()
    slope: _Pool = _Pool()
    rounds: int = 0

    def __post_init__(self) -> None:
        require(0 <= self.memory < 1, "memory", self.memory, "in [0, 1)")

    def add(self, a: float, b: float, *, std_a: float, std_b: float) -> "PooledFit":
        """The pool with one more round; a non-finite fit (a failed probe) resets it."""
        if not (math.isfinite(a) and math.isfinite(b)):
            return PooledFit(self.memory)
        return replace(self, curvature=self.curvature.add(a, std_a, self.memory),
                       slope=self.slope.add(b, std_b, self.memory), rounds=self.rounds + 1)

    def reset(self) -> "PooledFit":
        """An empty pool: what was pooled no longer describes the direction (η was halved)."""
        return PooledFit(self.memory)

    @property
    def a(self) -> float:
        return self.curvature.mean

    @property
    def b(self) -> float:
        return self.slope.mean

    @property
    def std_a(self) -> float:
        return self.curvature.std

    @property
    def std_b(self) -> float:
        return self.slope.std
