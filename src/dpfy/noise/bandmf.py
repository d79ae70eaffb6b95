"""Banded matrix factorization (BandMF; Choquette-Choo et al. 2023), streamed.

Step t's gradient sum gets σΔ·x_t with x = C⁻¹z for the b-banded Toeplitz strategy C of
coefficients c (:mod:`dpfy.noise.toeplitz`, ‖c‖ = 1): solving C·x = z row by row,

    x_t = (z_t − Σ_{j=1}^{b−1} c_j · x_{t−j}) / c_0,

so the mechanism keeps the last b − 1 noise vectors of every parameter: **memory (b − 1) ×
(trainable parameters) floats** on top of DP-SGD (b = 1: none, and x = z, DP-SGD exactly). The
released prefix sums are then A·G + σΔ·(A C⁻¹)·z, the matrix mechanism with B = A C⁻¹.

Its accounting (cyclic Poisson sampling with b groups, every column of C of norm ≤ 1) is in
:mod:`dpfy.privacy.correlated`; the sampler is :class:`dpfy.sampling.CyclicPoissonSampler`.
"""

from __future__ import annotations

from typing import Any, Unpack

import torch

from dpfy._require import require
from dpfy.noise.correlated import CorrelatedArgs, CorrelatedMechanism
from dpfy.noise.generator import NoiseSource
from dpfy.noise.toeplitz import check_normalized
from dpfy.types import Sampling

__all__ = ["BandMFMechanism"]


class BandMFMechanism(CorrelatedMechanism):
    """BandMF's noise: x = C⁻¹z online, with a buffer of the last b − 1 x's per parameter.

    Args:
      source: fresh N(0, 1) draws z_t (secure by default, or seeded).
      coefficients: c, the b band coefficients of C (c_0 > 0, ‖c‖ ≤ 1);
        :func:`dpfy.noise.toeplitz.optimize_banded` gives the prefix-sum optimum.
      noise_multiplier, sample_rate, sampler_position: see :class:`CorrelatedMechanism`;
        the rate is the per-group rate of the cyclic Poisson sampler.
    """

    name = "bandmf"
    samplings: tuple[Sampling, ...] = (Sampling.CYCLIC_POISSON,)

    def __init__(
        self,
        source: NoiseSource,
        *,
        coefficients: torch.Tensor,
        **stream: Unpack[CorrelatedArgs],
    ) -> None:
        c = torch.as_tensor(coefficients, dtype=torch.float64).flatten()
        require(c.numel() >= 1 and float(c[0]) > 0, "coefficients[0]", c[:1].tolist(), "> 0")
        check_normalized(c)
        super().__init__(source, sampling=Sampling.CYCLIC_POISSON, **stream)
        self.coefficients = c  # public: the strategy

    @property
    def period(self) -> int:
        """b, the band count (= the sampler's number of groups)."""
        return self.coefficients.numel()

    def memory_floats(self, parameters: int) -> int:
        """Floats the noise buffer holds for ``parameters`` trainable parameters: (b − 1)·d."""
        return (self.period - 1) * parameters

    def _start_step(self) -> None:
        pass

    def _next_unit(self, slot: int, like: torch.Tensor) -> torch.Tensor:
        """x_t of parameter ``slot``: (z_t − Σ_j c_j x_{t−j}) / c_0; buffers the newest b − 1."""
        history = self._slot_buffers(slot)  # newest first, at most b − 1
        c = self.coefficients
        x = self._fresh(like)
        for j, past in enumerate(history, start=1):
            require(
                past.shape == x.shape,
                "noise slot shape",
                tuple(x.shape),
                f"{tuple(past.shape)} (the same parameter every step)",
            )
            x.sub_(past, alpha=float(c[j]))
        x.div_(float(c[0]))
        if self.period > 1:
            history.insert(0, x.clone())
            del history[self.period - 1 :]
        return x

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "coefficients": self.coefficients.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = torch.as_tensor(state.get("coefficients"), dtype=torch.float64)
        require(
            saved.shape == self.coefficients.shape
            and bool(torch.allclose(saved, self.coefficients, rtol=0, atol=1e-12)),
            "the checkpoint's BandMF coefficients",
            saved.tolist()[:4],
            "this run's strategy",
            "Resume with the same bands and horizon",
        )
        super().load_state_dict(state)
