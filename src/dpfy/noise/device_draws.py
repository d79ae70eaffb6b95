"""How a draw on a device is cut into parts: the chunk size and the one-launch test.

Shared by :class:`dpfy.noise.generator.NoiseSource` (one tensor's noise) and
:mod:`dpfy.noise.release` (many tensors' noisy means), so that both consume a device stream
the same way.
"""

from __future__ import annotations

from typing import Iterator, TypeGuard

import torch

from dpfy.native.gaussian import BLOCK
from dpfy.noise.triton_noise import FUSED_DTYPES, TritonChaChaGaussian

__all__ = ["DEVICE_CHUNK", "chunks", "fused"]

# values a device generator draws per batch: a multiple of 2·BLOCK, so that a chunked draw
# consumes the stream exactly as one draw of the same size; large, since on an accelerator
# each of ChaCha20's tensor operations is a kernel launch
DEVICE_CHUNK = 1 << 22
assert DEVICE_CHUNK % (2 * BLOCK) == 0


def chunks(t: torch.Tensor, chunk: int) -> Iterator[torch.Tensor]:
    """Consecutive flat views of at most ``chunk`` entries covering ``t`` (written in place):
    the parts a draw on a device is split into, here and in :mod:`dpfy.noise.release`."""
    flat = t.view(-1)
    for start in range(0, flat.numel(), chunk):
        yield flat[start : start + chunk]


def fused(stream: object, t: torch.Tensor) -> TypeGuard[TritonChaChaGaussian]:
    """The Triton kernel updates ``t`` in place in one launch (else: drawn, then added); where
    it does, :func:`dpfy.noise.release.noisy_means` leaves ``t`` to ``NoiseSource.noisy_mean``."""
    fits = t.dtype in FUSED_DTYPES and t.is_contiguous()
    return isinstance(stream, TritonChaChaGaussian) and fits
