"""Gaussian samplers in torch tensor operations, run on the device the noise is added on.

The same stream layout and the same Box–Muller transform as dpfy's compiled sampler
(:mod:`dpfy.native.gaussian`), written with torch operations so that they run on any device
(on CUDA no noise crosses the host–device bus):

- :class:`DeviceChaChaGaussian` (secure): ChaCha20 (:mod:`dpfy.noise.chacha20`) keyed with 32
  bytes from ``os.urandom``. For the same key, counter and nonce its raw words are the compiled
  sampler's bit for bit, and its normals the compiled sampler's up to the last bits of float32
  math (module :func:`gaussian_from_words`).
- :class:`DeviceSeededGaussian` (reproducible, not secure): torch's generator on the device
  (Philox on CUDA) seeded from an integer, feeding the same transform.

Layout (the compiled sampler's): a call for n values consumes ⌈n / (2·BLOCK)⌉ blocks of
WORDS32 32-bit words. With ChaCha20, block g of a stream at counter c is 48 ChaCha20 blocks,
c + 48g + 16j + l for j < 3, l < 16, and word w of ChaCha20 block c + 48g + 16j + l is the
block's word 256j + 16w + l (16 blocks side by side, one per SIMD lane of the C code).
"""

from __future__ import annotations

import math
import os
import threading

import torch

from dpfy.native.gaussian import BLOCK, WORDS32
from dpfy.noise.chacha20 import chacha20_blocks, key_words

__all__ = [
    "DeviceChaChaGaussian",
    "DeviceSeededGaussian",
    "gaussian_from_words",
    "CHACHA_BLOCKS_PER_BLOCK",
]

_LANES = 16  # ChaCha20 blocks side by side in the compiled sampler's layout
CHACHA_BLOCKS_PER_BLOCK = WORDS32 // 16  # 48: each ChaCha20 block gives 16 words
_TWO_PI_F32 = float(torch.tensor(2 * math.pi, dtype=torch.float32))  # the C code's 2π as float


def _blocks_per_call(device: torch.device) -> int:
    """Sampler blocks computed per batch of tensor operations: small on CPU, where a batch
    that stays in the cache is fastest, large on an accelerator, where each of ChaCha20's
    ~550 operations is one kernel launch: 8192 blocks (2²² normals, ~130 MB of temporaries at
    the peak) make each kernel's work (~6 MB per operand) comparable to the launch cost of an
    eager operation (an estimate: not yet measured on a GPU)."""
    return 64 if device.type == "cpu" else 8192


def gaussian_from_words(words: torch.Tensor) -> torch.Tensor:
    """(G, 3, BLOCK) int32 random words → (G, 2·BLOCK) float32 N(0, 1), as gaussian.c does.

    Pair i of block g: u1 = float(hi)·2⁻³² + (float(lo) + ½)·2⁻⁶⁴ in float32, from hi =
    words[g, 0, i] and lo = words[g, 1, i] read as unsigned, so u1 ∈ [2⁻⁶⁵, 1] and the radius
    √(−2 ln u1) reaches √(130 ln 2) ≈ 9.4925; the angle is 2π·(top 24 bits of
    words[g, 2, i])·2⁻²⁴. Outputs: radius·cos for the first BLOCK entries
    of the row, radius·sin for the next BLOCK. Float32 throughout, as the C code; the C build
    (-ffast-math) takes its square root from a reciprocal-square-root estimate and one Newton
    step and its log, sine and cosine from glibc's vector math, torch from correctly rounded
    square roots and its own ≤ 1-ulp functions, so the two agree to a few float32 ulps, not
    bit for bit (tests/noise/test_device_chacha.py measures it).
    """

    def unsigned(w: torch.Tensor) -> torch.Tensor:  # exact in int64, rounded once to float32
        return (w.to(torch.int64) & 0xFFFFFFFF).float()

    hi, lo = unsigned(words[:, 0]), unsigned(words[:, 1])
    u1 = hi.mul_(2.0**-32).add_(lo.add_(0.5).mul_(2.0**-64))  # both products are exact
    radius = u1.log_().mul_(-2.0).clamp_min_(0.0).sqrt_()
    top24 = (words[:, 2] >> 8) & 0xFFFFFF  # the arithmetic shift's sign bits masked off
    theta = top24.float().mul_(2.0**-24).mul_(_TWO_PI_F32)
    out = torch.empty(words.shape[0], 2, BLOCK, dtype=torch.float32, device=words.device)
    torch.mul(radius, theta.cos(), out=out[:, 0])
    torch.mul(radius, theta.sin_(), out=out[:, 1])
    return out.view(words.shape[0], 2 * BLOCK)


def _sampler_words(chacha: torch.Tensor) -> torch.Tensor:
    """(16, 48·G) ChaCha20 output (word, block) → (G, 3, BLOCK) in the compiled layout."""
    g = chacha.shape[1] // CHACHA_BLOCKS_PER_BLOCK
    # block index 48g + 16j + l, word w → sampler word [g, j, 16w + l]
    return chacha.view(16, g, 3, _LANES).permute(1, 2, 0, 3).reshape(g, 3, BLOCK)


def _pack64(words: torch.Tensor) -> torch.Tensor:
    """(G, WORDS32) int32 → (G·WORDS32/2,) int64: word j = words[2j] | words[2j + 1] << 32."""
    pairs = words.reshape(-1, 2).to(torch.int64)
    return (pairs[:, 0] & 0xFFFFFFFF) | (pairs[:, 1] << 32)


class _DeviceStream:
    """Sampler blocks on one device; subclasses say where the words come from."""

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self._per_call = _blocks_per_call(self.device)

    def _next_words(self, blocks: int) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def normal(self, n: int) -> torch.Tensor:
        """(n,) float32 N(0, 1) on the device; consumes ⌈n / (2·BLOCK)⌉ blocks."""
        blocks = -(-n // (2 * BLOCK))
        out = torch.empty(blocks, 2 * BLOCK, dtype=torch.float32, device=self.device)
        for start in range(0, blocks, self._per_call):
            count = min(self._per_call, blocks - start)
            out[start : start + count] = gaussian_from_words(self._next_words(count))
        return out.view(-1)[:n]

    def words(self, n: int) -> torch.Tensor:
        """The next n raw 64-bit words as int64 on the device (whole blocks are consumed)."""
        blocks = -(-n // (WORDS32 // 2))
        out = torch.empty(blocks * (WORDS32 // 2), dtype=torch.int64, device=self.device)
        for start in range(0, blocks, self._per_call):
            count = min(self._per_call, blocks - start)
            half = WORDS32 // 2
            out[start * half : (start + count) * half] = _pack64(self._next_words(count))
        return out[:n]


class DeviceChaChaGaussian(_DeviceStream):
    """Secure draws on ``device``: ChaCha20 keyed from ``os.urandom`` (or a given key).

    The key lives on the device as 8 int32 words; key and counter are as secret as the noise
    and are not exported (a secure checkpoint holds neither, :class:`dpfy.noise.NoiseSource`).
    """

    def __init__(
        self,
        device: torch.device | str = "cpu",
        key: bytes | None = None,
        counter: int = 0,
        nonce: int = 0,
    ) -> None:
        super().__init__(device)
        self._key = key_words(os.urandom(32) if key is None else key, self.device)
        self._counter = counter % 2**64
        self._nonce = nonce % 2**64
        self._lock = threading.Lock()  # two threads must never get the same counter range

    def _next_words(self, blocks: int) -> torch.Tensor:
        n = blocks * CHACHA_BLOCKS_PER_BLOCK
        with self._lock:  # reserve the blocks first: torch releases the GIL while computing
            counter = self._counter
            self._counter = (counter + n) % 2**64
        return _sampler_words(chacha20_blocks(self._key, counter, self._nonce, n))


class DeviceSeededGaussian(_DeviceStream):
    """Reproducible draws on ``device`` from torch's generator there (Philox on CUDA).

    Not secure: anyone who knows the seed, or the state (:meth:`get_state`), reproduces the
    draws.
    """

    def __init__(self, seed: int, device: torch.device | str) -> None:
        super().__init__(device)
        self.generator = torch.Generator(device=self.device).manual_seed(seed % 2**64)

    def _next_words(self, blocks: int) -> torch.Tensor:
        full = torch.empty(blocks * WORDS32 // 2, dtype=torch.int64, device=self.device)
        full.random_(-(2**63), None, generator=self.generator)  # all 64 bits uniform
        return full.view(torch.int32).view(blocks, 3, BLOCK)

    def get_state(self) -> torch.Tensor:
        return self.generator.get_state()

    def set_state(self, state: torch.Tensor) -> None:
        self.generator.set_state(state)
