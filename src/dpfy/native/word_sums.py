"""Integer sums of many tensors' memory in one kernel launch (Triton; a GPU, or the CPU under
``TRITON_INTERPRET=1``).

The model-state guard fingerprints every parameter three times a training step (the sum of its
bits read as integers: :mod:`dpfy.buffers.marks`). As one ``sum`` per parameter that is one
kernel launch per parameter tensor per check, about 600 a step for BERT-base on a GPU.
:class:`WordSums` does all of them in one launch: each tensor's memory is cut into chunks of at
most :data:`CHUNK_WORDS` 32-bit words, a table of the chunks' start addresses and lengths is
kept on the device, and one program per chunk sums its words (read as int32, added in int64,
wrapping). The result has one entry per chunk: a change of any one word of a tensor changes its
chunk's sum, which is all a fingerprint needs (``owners`` says which tensor a chunk is of).

The table holds the tensors (so their memory stays allocated while its addresses are kept);
it describes their memory as it was when built: the caller builds a new one when a tensor's
identity, storage, shape or dtype changed (:mod:`dpfy.buffers.marks` does).
"""

from __future__ import annotations

from typing import Sequence

import torch

from dpfy.native.triton_support import (
    kernel_module,
    launching_on,
    triton_available,
    triton_installed,
    triton_interpreted,
)

__all__ = ["WordSums", "word_sums_available", "summable", "CHUNK_WORDS"]

CHUNK_WORDS = 1 << 16  # 256 KiB a program on a GPU: BERT-base's 110 M parameters are ~1.7 k
_BLOCK = 1024  # words a program adds per loop iteration on a GPU
# under the interpreter each kernel operation is one numpy call over the whole block, so long
# chunks read in one block are what is fast there
_CHUNK_INTERPRETED = _BLOCK_INTERPRETED = 1 << 18


def word_sums_available(device: torch.device) -> bool:
    """Whether :class:`WordSums` can run for tensors on ``device``: Triton installed, and a GPU
    it compiles for, or the CPU under its interpreter (which reads the table's addresses as
    host memory: never a GPU's tensors then)."""
    if triton_interpreted():
        return triton_installed() and torch.device(device).type == "cpu"
    return triton_available(device)


def summable(t: torch.Tensor) -> bool:
    """Whether ``t``'s memory is whole 32-bit words: contiguous, not empty, its address and byte
    length multiples of 4 (every float32 and float64 tensor; float16 and bfloat16 ones of even
    length at an even offset). Other tensors are summed another way by the caller."""
    nbytes = t.numel() * t.element_size()
    return t.is_contiguous() and nbytes > 0 and nbytes % 4 == 0 and t.data_ptr() % 4 == 0


class WordSums:
    """The chunk table of ``tensors`` (all :func:`summable`, all on one device); calling it
    returns their chunk sums (int64, one per chunk, on that device) in one kernel launch.

    ``owners[c]``: the index in ``tensors`` of the tensor chunk c is part of.
    """

    def __init__(self, tensors: Sequence[torch.Tensor]) -> None:
        if not tensors:
            raise ValueError("tensors must hold at least one tensor, got an empty list")
        device = tensors[0].device
        if not word_sums_available(device):
            raise ValueError(
                f"tensors must be on a device Triton runs on here, got {device} "
                f"(TRITON_INTERPRET={'1' if triton_interpreted() else '0'}). Sum them with torch"
            )
        chunk = _CHUNK_INTERPRETED if triton_interpreted() else CHUNK_WORDS
        starts: list[int] = []
        lengths: list[int] = []
        owners: list[int] = []
        for i, t in enumerate(tensors):
            if not summable(t) or t.device != device:
                raise ValueError(
                    f"tensors[{i}] must be contiguous 32-bit words on {device}, got dtype "
                    f"{t.dtype}, shape {tuple(t.shape)} on {t.device}. Sum it with torch"
                )
            words = t.numel() * t.element_size() // 4
            for first in range(0, words, chunk):
                starts.append(t.data_ptr() + 4 * first)
                lengths.append(min(chunk, words - first))
                owners.append(i)
        self._held = [t.detach() for t in tensors]  # their memory outlives the table
        self._addresses = torch.tensor(starts, dtype=torch.int64, device=device)
        self._lengths = torch.tensor(lengths, dtype=torch.int64, device=device)
        self.owners: tuple[int, ...] = tuple(owners)
        self.device = device

    def __call__(self) -> torch.Tensor:
        """The chunk sums now (one launch; nothing read back to the host)."""
        mod = kernel_module("dpfy.native._word_sums_triton")
        out = torch.empty(len(self.owners), dtype=torch.int64, device=self.device)
        block = _BLOCK_INTERPRETED if mod.INTERPRETED else _BLOCK
        with launching_on(self.device):
            mod.chunk_word_sums[(len(self.owners),)](
                self._addresses, self._lengths, out, BLOCK=block,
                enable_fp_fusion=False,  # integers only; stated, so Triton 3.9 does not warn
            )  # fmt: skip
        return out
