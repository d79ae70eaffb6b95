"""Gaussian noise for sums of clipped gradients: seeded, or from the OS CSPRNG.

DESIGN.md convention: noise is calibrated to the **sum**: the engine adds N(0, (σ·Δ)² I) to
Σ_i w_i g_i, where Δ is the clipping policy's sensitivity, and divides by the normalizer after.

- Seeded (default): drawn by the compiled sampler ``dpfy.native.gaussian.CompiledGaussian``
  (16 xoshiro256++ streams + vectorized Box–Muller, ≈ 6× faster than torch's CPU ``normal_``,
  longer tails), seeded from the run seed. Where it cannot be built (no C compiler, not Linux
  x86-64 with AVX2) a ``torch.Generator`` with the same seed is used instead, with a warning
  (``backend="torch"`` asks for it explicitly). The generator's state, and which backend it
  is, are in the checkpoint, so a resumed run draws the same noise.
- ``secure=True``: every draw comes from ``os.urandom`` (the OS CSPRNG) through Box–Muller in
  float64, so nothing about the noise is predictable from the seed or checkpoint. (It does not
  defend against the floating-point attack of Mironov 2012 on the *output*; see Opacus'
  secure_mode notes.)
"""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass
from typing import Any, Iterator, Literal

import torch

from dpfy.native.build import NativeUnavailable

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


Backend = Literal["auto", "compiled", "torch"]


def _fits_kernel(t: torch.Tensor) -> bool:
    """The compiled sampler writes straight into contiguous float32 CPU tensors."""
    return t.dtype == torch.float32 and t.device.type == "cpu" and t.is_contiguous()


class NoiseSource:
    """Draws Gaussian noise; ``state_dict`` makes seeded draws resumable.

    Args:
      seed: seeds the generator (ignored with ``secure=True``).
      secure: draw from the OS CSPRNG instead (``secure_uniform`` + Box–Muller in float64).
      backend: seeded generator: ``"compiled"`` (dpfy's C sampler; error if it cannot be built),
        ``"torch"`` (``torch.Generator``), or ``"auto"`` (compiled, else torch with a warning).
    """

    def __init__(self, seed: int, *, secure: bool = False, backend: Backend = "auto") -> None:
        from dpfy._validate import require
        require(backend in ("auto", "compiled", "torch"), "backend", backend,
                'one of "auto", "compiled", "torch"')
        self.secure = secure
        self.compiled = None
        self.generator = None
        if backend != "torch" and not secure:  # secure draws never use a seeded generator
            try:
                from dpfy.native.gaussian import CompiledGaussian
                self.compiled = CompiledGaussian(seed)
            except NativeUnavailable as err:
                if backend == "compiled":
                    raise
                warnings.warn(f"dpfy's compiled Gaussian sampler is unavailable ({err}); noise "
                              f"is drawn with torch's generator, which is ≈ 6× slower",
                              RuntimeWarning, stacklevel=2)
        if self.compiled is None:
            self.generator = torch.Generator().manual_seed(seed)

    @property
    def backend(self) -> str:
        return "compiled" if self.compiled is not None else "torch"

    def _standard_into(self, buf: torch.Tensor, std: float) -> torch.Tensor:
        """buf ← N(0, std²) entries from the seeded generator (buf is float32 CPU contiguous
        for the compiled backend)."""
        if self.compiled is not None:
            return self.compiled.axpy_(buf, 0.0, std)
        return buf.normal_(0.0, std, generator=self.generator)

    def gaussian(self, like: torch.Tensor, std: float) -> torch.Tensor:
        """A tensor shaped like ``like`` with i.i.d. N(0, std²) entries."""
        if std == 0:
            return torch.zeros_like(like)
        if self.secure:
            n = like.numel()
            u1, u2 = secure_uniform(n), secure_uniform(n)
            z = torch.sqrt(-2 * torch.log(u1)) * torch.cos(2 * math.pi * u2)  # (n,) float64
            return (std * z).to(dtype=like.dtype, device=like.device).reshape(like.shape)
        dtype = torch.float32 if self.compiled is not None else like.dtype
        z = self._standard_into(torch.empty(like.shape, dtype=dtype), std)
        return z.to(dtype=like.dtype, device=like.device)

    def noisy_mean(self, total: torch.Tensor, std: float, normalizer: float,
                   chunk: int = 1 << 16) -> torch.Tensor:
        """(total + N(0, std²)) / normalizer, in place on ``total``: the released update.

        Seeded: total/normalizer gets N(0, (std/normalizer)²) added (the same law). The compiled
        sampler does this in one pass over a float32 CPU ``total``; otherwise each ``chunk`` is
        drawn into one reused chunk-sized buffer that stays in cache, so the extra memory is one
        chunk. Secure: :meth:`add_gaussian_`, then divide.
        """
        if std == 0 or self.secure:
            return self.add_gaussian_(total, std).div_(normalizer)
        if self.compiled is not None and _fits_kernel(total):
            self.compiled.axpy_(total.view(-1), 1.0 / normalizer, std / normalizer)
            return total
        buf = torch.empty(min(chunk, total.numel()),
                          dtype=torch.float32 if self.compiled is not None else total.dtype)
        for part in _chunks(total, chunk):
            z = self._standard_into(buf[:part.numel()], std / normalizer)
            part.div_(normalizer).add_(z.to(part.device))
        return total

    def add_gaussian_(self, t: torch.Tensor, std: float, chunk: int = 1 << 16) -> torch.Tensor:
        """t += N(0, std²) in place, drawn ``chunk`` entries at a time (bounded extra memory)."""
        if std != 0 and not self.secure and self.compiled is not None and _fits_kernel(t):
            self.compiled.axpy_(t.view(-1), 1.0, std)
            return t
        for part in _chunks(t, chunk):
            part.add_(self.gaussian(part, std))
        return t

    def state_dict(self) -> dict[str, Any]:
        if self.compiled is not None:
            return {"backend": "compiled", "state": self.compiled.get_state(),
                    "secure": self.secure}
        return {"backend": "torch", "generator": self.generator.get_state(), "secure": self.secure}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume the saved stream exactly, switching to the backend that drew it."""
        if state.get("backend", "torch") == "compiled":
            if self.compiled is None:
                from dpfy.native.gaussian import CompiledGaussian
                try:
                    self.compiled = CompiledGaussian(0)
                except NativeUnavailable as err:
                    raise RuntimeError(
                        f"this checkpoint's noise was drawn by dpfy's compiled sampler, which "
                        f"cannot be built here ({err}); resume on a machine where it can, "
                        f"to continue the same noise stream") from err
                self.generator = None
            self.compiled.set_state(state["state"])
        else:
            self.compiled = None
            self.generator = self.generator or torch.Generator()
            self.generator.set_state(state["generator"])
