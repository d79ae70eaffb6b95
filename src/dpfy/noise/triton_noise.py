"""Secure (and seeded) Gaussian noise in one fused Triton kernel per call.

On a GPU, the ChaCha20 sampler in torch tensor operations (:mod:`dpfy.noise.device_gaussian`)
is ~550 kernel launches per parameter tensor. The kernel of :mod:`dpfy.noise._chacha_triton`
does the whole thing in one launch: ChaCha20 (RFC 8439, 20 rounds) words and the compiled
sampler's Box–Muller transform, written straight into the buffer the noise is added to
(x ← a·x + s·z in place: the released mean of a flat buffer that holds every parameter's sum
is one launch per step).

Same stream as the other two implementations: for the same key, counter and nonce the words
are the compiled sampler's (:mod:`dpfy.native.gaussian`) and the torch one's bit for bit (the
tests check it), and a call for n values consumes ⌈n / 512⌉ sampler blocks of 48 ChaCha20
blocks each, so the stream position depends only on the sizes asked for, in all three. The
normals agree to a few float32 ulps (different log, sin and cos implementations): the
transform is the same float32 formula, so the tails are the same, |z| up to √(130 ln 2) ≈
9.4925 at u1 = 2⁻⁶⁵ (u1 from 64 bits, 2⁻²³ relative precision at every scale). On CUDA the
kernel takes log, sin and cos from libdevice (≤ 1, 2 and 2 ulps) and a correctly rounded
square root, not the approximate hardware instructions.

Keys and counters are secrets. The key lives on the device as 8 int32 words (a tensor the
kernel reads, never a compile-time constant); the counter and nonce are plain kernel arguments
marked ``do_not_specialize`` (no compiled variant depends on their values). Each call reserves
its counter range under a lock before it launches, so no two calls, threads included, ever use
a ChaCha20 block twice; the counter advances by the blocks consumed (48 per 512 values).

Where it runs: any device Triton compiles for (CUDA, ROCm), and the CPU under Triton's
interpreter (``TRITON_INTERPRET=1``; slow, for tests). :func:`triton_available` says whether a
device can use it; :class:`dpfy.noise.NoiseSource` uses it by default on CUDA when Triton is
installed (``pip install "dpfy[gpu]"``), and on every device with ``backend="triton"``.
"""

from __future__ import annotations

import warnings
from types import ModuleType
from typing import Any

import torch

from dpfy.native.triton_support import (
    kernel_module,
    launching_on,
    triton_available,
    triton_interpreted,
)
from dpfy.noise.chacha20 import key_words
from dpfy.noise.device_gaussian import CHACHA_BLOCKS_PER_BLOCK, DeviceChaChaGaussian

__all__ = [
    "TritonChaChaGaussian",
    "SeededChaChaGaussian",
    "triton_available",
    "triton_interpreted",
    "chacha_axpy_",
    "chacha_words",
    "gaussian_from_words",
    "seeded_stream",
    "FUSED_DTYPES",
]

_SAMPLER_VALUES = 512  # normals per sampler block (2·BLOCK)
_LANES = 16
_ELEMENTS_PER_PROGRAM = 128  # (sampler block, lane) pairs per Triton program on a GPU
# under the interpreter each kernel operation is one numpy call over the whole program, so
# wide programs are what is fast there
_ELEMENTS_INTERPRETED = 1 << 14
# sampler blocks per launch: 48g + 47 < 2³² keeps the kernel's uint32 counter offset exact
_MAX_BLOCKS_PER_LAUNCH = 1 << 24
FUSED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)  # the kernel adds in float32


def _kernels() -> ModuleType:
    """The kernel module, decorated for the current ``TRITON_INTERPRET``."""
    return kernel_module("dpfy.noise._chacha_triton")


def _program_width(mod: ModuleType) -> int:
    return _ELEMENTS_INTERPRETED if mod.INTERPRETED else _ELEMENTS_PER_PROGRAM


def _accurate(mod: ModuleType) -> bool:
    """libdevice's log, sin and cos (compiled), or Triton's own (the interpreter's numpy)."""
    return not mod.INTERPRETED and mod.libdevice is not None


def _int32(v: int) -> int:
    """The low 32 bits of v as a signed int32 value (a kernel argument of one fixed type)."""
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >= 1 << 31 else v


def chacha_axpy_(
    x: torch.Tensor,
    key: torch.Tensor,
    counter: int,
    nonce: int,
    a: float,
    s: float,
    *,
    write_only: bool = False,
) -> int:
    """x ← a·x + s·z in place over the flat contiguous ``x`` (z the stream's N(0, 1) from block
    ``counter`` on; ``write_only``: x ← s·z, x's old values unread). Returns the ChaCha20 blocks
    consumed. ``key``: 8 int32 words on x's device (:func:`dpfy.noise.chacha20.key_words`)."""
    if x.dtype not in FUSED_DTYPES or not x.is_contiguous() or x.dim() != 1:
        raise ValueError(
            f"x must be a flat contiguous float32, float16 or bfloat16 tensor, got "
            f"dtype={x.dtype}, shape={tuple(x.shape)}, contiguous={x.is_contiguous()}. "
            f"Draw into a float32 buffer and add it"
        )
    mod = _kernels()
    n = x.numel()
    blocks = -(-n // _SAMPLER_VALUES)
    width = _program_width(mod)
    with launching_on(x.device):  # Triton launches on the current CUDA device
        for first in range(0, blocks, _MAX_BLOCKS_PER_LAUNCH):
            count = min(_MAX_BLOCKS_PER_LAUNCH, blocks - first)
            part = x[first * _SAMPLER_VALUES : (first + count) * _SAMPLER_VALUES]
            c = (counter + first * CHACHA_BLOCKS_PER_BLOCK) % 2**64
            grid = (-(-count * _LANES // width),)
            mod.chacha_gaussian_kernel[grid](
                part,
                key,
                _int32(c),
                _int32(c >> 32),
                _int32(nonce),
                _int32(nonce >> 32),
                part.numel(),
                float(a),
                float(s),
                BLOCK_SIZE=width,
                WRITE_ONLY=write_only,
                ACCURATE=_accurate(mod),
                enable_fp_fusion=False,  # a·x + s·z rounded twice, as everywhere else: no FMA
            )
    return blocks * CHACHA_BLOCKS_PER_BLOCK


def chacha_words(key: torch.Tensor, counter: int, nonce: int, nblocks: int) -> torch.Tensor:
    """(nblocks, 16) int32: word w of ChaCha20 block counter + b at [b, w], computed by the
    kernel's block function on key's device (the RFC 8439 check of the fused kernel)."""
    if not 0 < nblocks < 2**32:
        raise ValueError(f"nblocks must be in [1, 2**32), got nblocks = {nblocks}")
    out = torch.empty(nblocks, 16, dtype=torch.int32, device=key.device)
    counter %= 2**64
    nonce %= 2**64
    mod = _kernels()
    width = _program_width(mod)
    grid = (-(-nblocks // width),)
    with launching_on(key.device):
        mod.chacha_words_kernel[grid](
            out, key, _int32(counter), _int32(counter >> 32), _int32(nonce), _int32(nonce >> 32),
            nblocks, BLOCK_SIZE=width,
            enable_fp_fusion=False,  # integers only; stated, so Triton 3.9 does not warn
        )  # fmt: skip
    return out


def gaussian_from_words(words: torch.Tensor) -> torch.Tensor:
    """(G, 3, 256) int32 words → (G, 512) float32 normals by the fused kernel's transform (the
    check of its tails on chosen words; :func:`dpfy.noise.device_gaussian.gaussian_from_words`
    is the same formula in torch operations)."""
    if words.dtype != torch.int32 or words.dim() != 3 or words.shape[1:] != (3, 256):
        raise ValueError(
            f"words must be an int32 tensor of shape (G, 3, 256), got dtype={words.dtype}, "
            f"shape={tuple(words.shape)}"
        )
    mod = _kernels()
    words = words.contiguous()
    out = torch.empty(words.shape[0], 512, dtype=torch.float32, device=words.device)
    width = _program_width(mod)
    with launching_on(words.device):
        mod.gaussian_from_words_kernel[(-(-out.numel() // 2 // width),)](
            words, out, words.shape[0], BLOCK_SIZE=width, ACCURATE=_accurate(mod),
            enable_fp_fusion=False,
        )  # fmt: skip
    return out


class TritonChaChaGaussian(DeviceChaChaGaussian):
    """Secure draws on ``device`` by the fused kernel: ChaCha20 keyed from ``os.urandom`` (or a
    given key). The torch stream's interface (``normal``, ``words``) plus :meth:`axpy_`, the
    one-launch in-place update; ``words`` (Poisson masks, not noise) stays torch's ChaCha20 on
    the same key and counter.

    If the first launch fails (Triton cannot compile for this device), the stream warns once
    and continues in torch operations on the same key, past the counter range that launch had
    reserved: the same generator, slower; never a block used twice.
    """

    torch_ops = False  # True: drawn by the parent's torch operations instead of the kernel
    _launched = False

    def _reserve(self, blocks: int) -> int:
        """The first of ``blocks`` fresh ChaCha20 blocks (the counter moves past them)."""
        with self._lock:
            counter = self._counter
            self._counter = (counter + blocks) % 2**64
        return counter

    def _launch(self, x: torch.Tensor, a: float, s: float, write_only: bool) -> bool:
        """The kernel on ``x`` (True), or False where the stream draws in torch operations."""
        if self.torch_ops:
            return False
        blocks = -(-x.numel() // _SAMPLER_VALUES) * CHACHA_BLOCKS_PER_BLOCK
        counter = self._reserve(blocks)
        try:
            chacha_axpy_(x, self._key, counter, self._nonce, a, s, write_only=write_only)
        except Exception as err:  # noqa: BLE001 - any compile failure; a later one propagates
            if self._launched:
                raise
            warnings.warn(
                f"the fused Triton noise kernel cannot run on {self.device} ({err!r}); this "
                f"stream draws with ChaCha20 in torch operations instead (as secure, slower)",
                RuntimeWarning,
                stacklevel=3,
            )
            self.torch_ops = True
            return False
        self._launched = True
        return True

    def axpy_(self, x: torch.Tensor, a: float, s: float) -> torch.Tensor:
        """x ← a·x + s·z in place (x flat, contiguous, float32/16/bf16, on this device)."""
        if x.numel() and not self._launch(x, a, s, write_only=False):
            x.mul_(a).add_(super().normal(x.numel()), alpha=s)
        return x

    def normal(self, n: int) -> torch.Tensor:
        """(n,) float32 N(0, 1) on the device; consumes ⌈n / 512⌉ sampler blocks."""
        out = torch.empty(n, dtype=torch.float32, device=self.device)
        if n and not self._launch(out, 0.0, 1.0, write_only=True):
            return super().normal(n)
        return out


class SeededChaChaGaussian(TritonChaChaGaussian):
    """Reproducible draws: the fused kernel on a key derived from a seed (not secure: whoever
    has the key, or :meth:`get_state`, reproduces the draws). Its state is the compiled
    sampler's ChaCha20 layout, an int64 tensor (key as 4 words, counter, nonce), so a
    checkpoint continues the stream here or, where Triton is missing, in torch operations
    (:func:`seeded_stream`)."""

    def get_state(self) -> torch.Tensor:
        key = self._key.cpu().view(4, 2).to(torch.int64)
        words = (key[:, 0] & 0xFFFFFFFF) | (key[:, 1] << 32)
        return torch.cat([words, torch.tensor([_signed64(self._counter), _signed64(self._nonce)])])

    def set_state(self, state: torch.Tensor) -> None:
        if state.dtype != torch.int64 or state.shape != (6,):
            raise ValueError(
                f"state must be an int64 tensor of shape (6,), got dtype={state.dtype}, "
                f"shape={tuple(state.shape)}. Pass a state from SeededChaChaGaussian.get_state()"
            )
        with self._lock:
            key_bytes = state[:4].cpu().contiguous().numpy().astype("<i8").tobytes()
            self._key = key_words(key_bytes, self.device)
            self._counter = int(state[4]) % 2**64
            self._nonce = int(state[5]) % 2**64


def _signed64(v: int) -> int:
    v %= 2**64
    return v - 2**64 if v >= 2**63 else v


def seeded_stream(
    key: bytes | None, device: torch.device, state: Any = None
) -> TritonChaChaGaussian:
    """A seeded ChaCha20 stream on ``device``: keyed with ``key``, or resumed from ``state``;
    the fused kernel where Triton can run there, torch operations otherwise."""
    stream = SeededChaChaGaussian(device, key if key is not None else bytes(32))
    stream.torch_ops = not triton_available(device)
    if state is not None:
        stream.set_state(state)
    return stream
