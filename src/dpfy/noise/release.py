"""The released update of many sums at once: (S_k + N(0, std² I))/b for every sum S_k, in place.

:meth:`NoiseSource.noisy_mean` releases one tensor; a step releases one sum per parameter
tensor, and on a device each of its per-tensor operations (a division, an addition, a flat
view per chunk) is a kernel launch. :func:`noisy_means` draws the noise exactly as the
per-tensor calls do (the same generator calls, in the same order, of the same sizes, so a
seeded run's noise is unchanged) and does the arithmetic as ``torch._foreach_*`` operations
over all the sums: two launches per group instead of three per tensor. The noise drawn but
not yet added is bounded (:data:`PENDING`), so the extra memory stays a few chunks, as in the
per-tensor loop, and not a whole gradient.
"""

from __future__ import annotations

import torch

from dpfy.noise.generator import _DEVICE_CHUNK, NoiseSource, _chunks, _fused

__all__ = ["noisy_means"]

# noise values drawn and held before the group's foreach add (float32: 64 MiB)
PENDING = 4 * _DEVICE_CHUNK


def noisy_means(
    noise: NoiseSource, totals: list[torch.Tensor], std: float, normalizer: float
) -> list[torch.Tensor]:
    """``[noise.noisy_mean(t, std, normalizer) for t in totals]``, with the same values: the
    per-tensor calls where the draw is not on a device (the compiled CPU sampler is one pass
    per tensor already) or where the fused kernel does draw and update in one launch."""
    if std == 0 or not totals or not all(noise._on_device(t.device) for t in totals):
        return [noise.noisy_mean(t, std, normalizer) for t in totals]
    streams = [noise._device_stream(t.device) for t in totals]
    if any(_fused(s, t) for s, t in zip(streams, totals)):
        return [noise.noisy_mean(t, std, normalizer) for t in totals]
    torch._foreach_div_(totals, normalizer)  # the same quotient as each tensor's div_
    parts: list[torch.Tensor] = []
    draws: list[torch.Tensor] = []
    held, size = 0, _DEVICE_CHUNK  # noisy_mean's device chunk: one draw per chunk, as there
    for t, stream in zip(totals, streams):
        pieces = [t] if t.numel() <= size else list(_chunks(t, size))
        for part in pieces:
            z = stream.normal(part.numel())
            parts.append(part)
            draws.append(z if z.shape == part.shape else z.view(part.shape))
            held += part.numel()
            if held >= PENDING:
                torch._foreach_add_(parts, draws, alpha=std / normalizer)
                parts, draws, held = [], [], 0
    if parts:
        torch._foreach_add_(parts, draws, alpha=std / normalizer)
    return totals
