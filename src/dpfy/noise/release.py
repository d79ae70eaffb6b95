"""The released update of many sums at once: (S_k + N(0, std² I))/b for every sum S_k, in place.

:meth:`NoiseSource.noisy_mean` releases one tensor; a step releases one sum per parameter
tensor, and on a device each per-tensor operation (a draw, a division, an addition) is a kernel
launch, and a draw by ChaCha20 in torch operations is hundreds of them. :func:`noisy_means`
draws the noise of many tensors in **one** generator call and does the arithmetic as
``torch._foreach_*`` operations over all the sums: per group of tensors (at most
:data:`PENDING` values, so the extra memory stays a few chunks and not a whole gradient) one
draw and one addition, plus one division for the step.

The values are those of one call per tensor. A device generator's call for n values consumes
⌈n / 512⌉ whole sampler blocks (:mod:`dpfy.noise.device_gaussian`; a call's last block is not
carried over), so one call for the group, with each tensor's values starting at the next
multiple of 512, reads every tensor's noise from the blocks its own call would have read: for
the counter-based ChaCha20 streams on every device, and for torch's CPU generator, whose words
come in sequence. (torch's CUDA Philox generator offsets each call by its own rule, so a seeded
run on CUDA without Triton draws other, equally distributed, noise than before this grouping.)
"""

from __future__ import annotations

import torch

from dpfy.native.gaussian import BLOCK
from dpfy.noise.device_draws import DEVICE_CHUNK, chunks, fused
from dpfy.noise.generator import NoiseSource

__all__ = ["noisy_means"]

# noise values drawn and held before the group's foreach add (float32: 64 MiB)
PENDING = 4 * DEVICE_CHUNK
_ALIGN = 2 * BLOCK  # values per sampler block: where each tensor's draw starts


def _aligned(n: int) -> int:
    """n rounded up to whole sampler blocks: the values a call for n consumes."""
    return -(-n // _ALIGN) * _ALIGN


def noisy_means(
    noise: NoiseSource, totals: list[torch.Tensor], std: float, normalizer: float
) -> list[torch.Tensor]:
    """``[noise.noisy_mean(t, std, normalizer) for t in totals]``, with the same values: the
    per-tensor calls where the draw is not on a device (the compiled CPU sampler is one pass
    per tensor already) or where the fused kernel does draw and update in one launch."""
    if std == 0 or not totals or not all(noise._on_device(t.device) for t in totals):
        return [noise.noisy_mean(t, std, normalizer) for t in totals]
    streams = [noise._device_stream(t.device) for t in totals]
    if any(fused(s, t) for s, t in zip(streams, totals)):
        return [noise.noisy_mean(t, std, normalizer) for t in totals]
    torch._foreach_div_(totals, normalizer)  # the same quotient as each tensor's div_
    scale = std / normalizer
    group: list[torch.Tensor] = []  # consecutive parts of one stream, drawn by one call
    held, size, last = 0, DEVICE_CHUNK, streams[0]  # noisy_mean's device chunk, as there

    def flush() -> None:
        nonlocal group, held
        if group:
            z = last.normal(held)  # (held,) one call: each part's blocks, in order
            sizes = [m for p in group for m in (p.numel(), _aligned(p.numel()) - p.numel())]
            pieces = z.split_with_sizes(sizes)[0::2]  # one op: each part's values, 1-D
            draws = [d if d.shape == p.shape else d.view(p.shape) for d, p in zip(pieces, group)]
            torch._foreach_add_(group, draws, alpha=scale)
        group, held = [], 0

    for t, stream in zip(totals, streams):
        for part in [t] if t.numel() <= size else list(chunks(t, size)):
            need = _aligned(part.numel())
            if stream is not last or held + need > PENDING:
                flush()
            group.append(part)
            held += need
            last = stream
    flush()
    return totals
