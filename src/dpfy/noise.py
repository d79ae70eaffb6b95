"""Gaussian noise for sums of clipped gradients: seeded, or from the OS CSPRNG.

DESIGN.md convention: noise is calibrated to the **sum**: the engine adds N(0, (σ·Δ)² I) to
Σ_i w_i g_i, where Δ is the clipping policy's sensitivity, and divides by the normalizer after.

- Seeded (default): a ``torch.Generator`` seeded from the run seed; its state is in the
  checkpoint, so a resumed run draws the same noise.
- ``secure=True``: every draw comes from ``os.urandom`` (the OS CSPRNG) through Box–Muller in
  float64, so nothing about the noise is predictable from the seed or checkpoint. (It does not
  defend against the floating-point attack of Mironov 2012 on the *output*; see Opacus'
  secure_mode notes.)
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Iterator

import torch

__all__ = ["NoiseSource", "NoisySum", "secure_uniform"]


@dataclass(frozen=True)
class NoisySum:
    """An extra release an adaptive method declares: Σ_i values_i + N(0, noise_std² I).

    Returned by ``method.sums(norms, plan)`` (STYLE.md §8). The engine sums ``values`` over the
    logical batch, adds the noise once, records ``Release(name, noise_std / sensitivity)`` in the
    ledger next to the gradient release, and hands the privatized sum to ``method.update`` in
    ``Released.sums[name]``. So a release without a ledger event cannot be written.

    Args:
      values: (B,) or (B, k) per-example contributions. Sensitive.
      sensitivity: L2 bound on one example's contribution (add/remove adjacency), > 0.
      noise_std: standard deviation of the Gaussian noise on the sum, > 0.
    """

    values: "torch.Tensor"
    sensitivity: float
    noise_std: float

    def __post_init__(self) -> None:
        from dpfy._validate import require
        require(self.sensitivity > 0, "sensitivity", self.sensitivity, "> 0")
        require(self.noise_std > 0, "noise_std", self.noise_std, "> 0",
                "An extra release without noise is not private")

    @property
    def noise_multiplier(self) -> float:
        return self.noise_std / self.sensitivity


def secure_uniform(n: int) -> torch.Tensor:
    """n float64 uniforms in (0, 1) from the OS CSPRNG (53 random bits each)."""
    bits = torch.frombuffer(bytearray(os.urandom(8 * n)), dtype=torch.int64) if n else \
        torch.zeros(0, dtype=torch.int64)
    top53 = (bits >> 11) & ((1 << 53) - 1)  # int64 is signed: keep 53 bits, non-negative
    return (top53.to(torch.float64) + 0.5) * 2.0 ** -53  # (n,) in (0, 1)


def _chunks(t: torch.Tensor, chunk: int) -> Iterator[torch.Tensor]:
    """Consecutive flat views of at most ``chunk`` entries covering ``t`` (written in place)."""
    flat = t.view(-1)
    for start in range(0, flat.numel(), chunk):
        yield flat[start:start + chunk]


class NoiseSource:
    """Draws Gaussian noise; ``state_dict`` makes seeded draws resumable."""

    def __init__(self, seed: int, *, secure: bool = False) -> None:
        self.secure = secure
        self.generator = torch.Generator().manual_seed(seed)

    def gaussian(self, like: torch.Tensor, std: float) -> torch.Tensor:
        """A tensor shaped like ``like`` with i.i.d. N(0, std²) entries."""
        if std == 0:
            return torch.zeros_like(like)
        if self.secure:
            n = like.numel()
            u1, u2 = secure_uniform(n), secure_uniform(n)
            z = torch.sqrt(-2 * torch.log(u1)) * torch.cos(2 * math.pi * u2)  # (n,) float64
            return (std * z).to(dtype=like.dtype, device=like.device).reshape(like.shape)
        z = torch.randn(like.shape, generator=self.generator, dtype=like.dtype)
        return z.mul_(std).to(like.device)

    def noisy_mean(self, total: torch.Tensor, std: float, normalizer: float,
                   chunk: int = 1 << 16) -> torch.Tensor:
        """(total + N(0, std²)) / normalizer, in place on ``total``: the released update.

        Seeded: each ``chunk`` of total/normalizer gets N(0, (std/normalizer)²) added (the same
        law), drawn into one reused chunk-sized buffer that stays in cache, so the extra memory
        is one chunk and each entry is touched twice. Secure: :meth:`add_gaussian_`, then divide.
        """
        if std == 0 or self.secure:
            return self.add_gaussian_(total, std).div_(normalizer)
        buf = torch.empty(min(chunk, total.numel()), dtype=total.dtype)
        for part in _chunks(total, chunk):
            z = buf[:part.numel()].normal_(0.0, std / normalizer, generator=self.generator)
            part.div_(normalizer).add_(z.to(part.device))
        return total

    def add_gaussian_(self, t: torch.Tensor, std: float, chunk: int = 1 << 16) -> torch.Tensor:
        """t += N(0, std²) in place, drawn ``chunk`` entries at a time (bounded extra memory)."""
        for part in _chunks(t, chunk):
            part.add_(self.gaussian(part, std))
        return t

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state(), "secure": self.secure}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])
