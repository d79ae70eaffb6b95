"""Compiled N(0, 1) samplers from ``gaussian.c``: ChaCha20 (secure) and xoshiro256++ (seeded).

Both generators produce 64-bit words in 16 SIMD lanes; one shared Box–Muller transform turns
them into float32 normals: u1 = (r + ½)·2⁻⁶⁴ from all 64 bits of a word, rounded to float32
(2⁻²³ relative precision at every scale down to 2⁻⁶⁵), the radius √(−2 ln u1) in float32,
so the largest |z| is ``MAX_RADIUS`` = √(130 ln 2) ≈ 9.4925 (at u1 = 2⁻⁶⁵) and the tail mass
P(|z| > t) is the Gaussian's, up to 2⁻⁶⁴ and the float32 rounding of the output, for every t
below it. (torch's float32 ``normal_`` stops at 5.77.)

- :class:`ChaChaGaussian`: RFC 8439 ChaCha20 (20 rounds) keyed with 32 bytes from
  ``os.urandom``: nobody without the key can predict the draws. The key and block counter are
  its state (``get_state``), which is secret.
- :class:`XoshiroGaussian`: 16 xoshiro256++ streams (lane k = lane 0 jumped k·2¹²⁸ steps),
  seeded from an integer: anyone who knows the seed reproduces the draws.

Draws are bit-identical for the same library build on the same CPU; another CPU level (AVX2 vs
AVX-512 vector math) or vendor may differ in the last bits (the -ffast-math build takes the
square root from the CPU's reciprocal-square-root estimate and one Newton step). The raw words
never differ. The same sampler in torch tensor operations, for any device:
:mod:`dpfy.noise.device_gaussian`. The whole state fits in a small int64 tensor, so a checkpoint
resumes the exact stream.
"""

from __future__ import annotations

import ctypes
import math
import os
import threading

import torch

from dpfy.native.build import load

__all__ = [
    "ChaChaGaussian",
    "XoshiroGaussian",
    "MAX_RADIUS",
    "BLOCK",
    "WORDS32",
    "chacha20_keystream",
    "gaussian_from_words",
]

LANES = 16
BLOCK = 256  # Box–Muller pairs per block: a call for n values consumes ⌈n / (2·BLOCK)⌉ blocks
WORDS32 = 3 * BLOCK  # random 32-bit words per block: u1's high halves, low halves, angles
MAX_RADIUS = math.sqrt(130 * math.log(2))  # √(−2 ln 2⁻⁶⁵): the largest |z| any draw can have
_KIND_XOSHIRO, _KIND_CHACHA = 0, 1
_XOSHIRO_WORDS = 4 * LANES  # state: 4 words per lane
_CHACHA_WORDS = 6  # state: key (4 × 64 bits), block counter, nonce
_P, _I64 = ctypes.c_void_p, ctypes.c_int64
# Every buffer handed to the C code is made with device=_HOST: under a default-device context
# (``with torch.device("meta")``, ``torch.set_default_device("cuda")``) a bare torch.empty lands
# there, and the C code would write through a null (meta) or device pointer: a segfault.
_HOST = torch.device("cpu")


def _library() -> ctypes.CDLL:
    lib = load("gaussian")
    if not getattr(lib, "_dpfy_typed", False):
        signatures = {
            "dpfy_gaussian_seed": [_P, ctypes.c_uint64],
            "dpfy_gaussian_axpy": [_P, _I64, ctypes.c_float, ctypes.c_float, _P, ctypes.c_int],
            "dpfy_random_words": [_P, _I64, _P, ctypes.c_int],
            "dpfy_chacha20_keystream": [_P, _I64, _P],
            "dpfy_gaussian_from_words": [_P, _P],
        }
        for name, argtypes in signatures.items():
            getattr(lib, name).argtypes = argtypes
            getattr(lib, name).restype = None
        lib._dpfy_typed = True  # type: ignore[attr-defined]  # CDLL takes attributes; stub lacks it
    return lib


def _key_words(key: bytes) -> torch.Tensor:
    """32 key bytes as the 4 little-endian 64-bit words the C state holds."""
    if len(key) != 32:
        raise ValueError(f"key must be 32 bytes, got len(key) = {len(key)}. Pass os.urandom(32)")
    return torch.frombuffer(bytearray(key), dtype=torch.int64).clone()


def _as_int64(x: int) -> int:
    """An unsigned 64-bit value as the int64 with the same bits."""
    x %= 2**64
    return x - 2**64 if x >= 2**63 else x


class _CompiledStream:
    """One generator state in an int64 tensor plus the C calls that advance it."""

    _kind: int
    _state_words: int

    def __init__(self, state: torch.Tensor) -> None:
        self._lib = _library()
        self._lock = threading.Lock()  # the C call releases the GIL and mutates the state
        self._state = state

    def axpy_(self, x: torch.Tensor, a: float, s: float) -> torch.Tensor:
        """x ← a·x + s·z in place, z i.i.d. N(0, 1) (with a = 0, x is only written).

        ``x`` must be a contiguous float32 CPU tensor (callers use a scratch buffer otherwise).
        """
        if x.dtype != torch.float32 or x.device.type != "cpu" or not x.is_contiguous():
            raise ValueError(
                f"x must be a contiguous float32 CPU tensor, got dtype={x.dtype}, "
                f"device={x.device}, contiguous={x.is_contiguous()}. Draw into a "
                f"float32 buffer and add it"
            )
        with self._lock:
            self._lib.dpfy_gaussian_axpy(
                x.data_ptr(), x.numel(), a, s, self._state.data_ptr(), self._kind
            )
        return x

    def words(self, n: int) -> torch.Tensor:
        """The stream's next n raw 64-bit words as int64 (whole blocks are consumed)."""
        out = torch.empty(n, dtype=torch.int64, device=_HOST)
        with self._lock:
            self._lib.dpfy_random_words(out.data_ptr(), n, self._state.data_ptr(), self._kind)
        return out

    def get_state(self) -> torch.Tensor:
        return self._state.clone()

    def set_state(self, state: torch.Tensor) -> None:
        if state.dtype != torch.int64 or state.shape != (self._state_words,):
            raise ValueError(
                f"state must be an int64 tensor of shape ({self._state_words},), got "
                f"dtype={state.dtype}, shape={tuple(state.shape)}. Pass a state from "
                f"{type(self).__name__}.get_state()"
            )
        with self._lock:
            self._state.copy_(state)


class XoshiroGaussian(_CompiledStream):
    """Seeded, reproducible draws (raises ``NativeUnavailable`` if it cannot be built here)."""

    _kind, _state_words = _KIND_XOSHIRO, _XOSHIRO_WORDS

    def __init__(self, seed: int) -> None:
        super().__init__(torch.empty(_XOSHIRO_WORDS, dtype=torch.int64, device=_HOST))
        self._lib.dpfy_gaussian_seed(self._state.data_ptr(), seed % 2**64)


class ChaChaGaussian(_CompiledStream):
    """Cryptographically secure draws: ChaCha20 keyed from ``os.urandom`` (or a given key).

    Raises ``NativeUnavailable`` if the library cannot be built here. The state (key, block
    counter, nonce) lets a checkpoint continue the stream; it is as secret as the noise itself.
    """

    _kind, _state_words = _KIND_CHACHA, _CHACHA_WORDS

    def __init__(self, key: bytes | None = None, counter: int = 0, nonce: int = 0) -> None:
        words = _key_words(os.urandom(32) if key is None else key)
        tail = torch.tensor([_as_int64(counter), _as_int64(nonce)], device=_HOST)
        super().__init__(torch.cat([words, tail]))


def chacha20_keystream(key: bytes, counter: int, nonce: int, nblocks: int) -> bytes:
    """``nblocks`` ChaCha20 blocks from block ``counter`` on, serialized as in RFC 8439.

    ``counter`` is 64 bits (input words 12–13), ``nonce`` 64 bits (words 14–15); RFC 8439's
    32-bit counter c and 96-bit nonce (n0, n1, n2) are counter = c | n0 << 32 and
    nonce = n1 | n2 << 32.
    """
    state = ChaChaGaussian(key, counter, nonce)._state
    out = torch.empty(64 * nblocks, dtype=torch.uint8, device=_HOST)
    _library().dpfy_chacha20_keystream(out.data_ptr(), nblocks, state.data_ptr())
    return bytes(out.numpy())


def gaussian_from_words(words: torch.Tensor) -> torch.Tensor:
    """The 2·BLOCK float32 normals one block of ``WORDS32`` given 32-bit words (int32) becomes.

    Pair i (outputs i and BLOCK + i) takes u1's high half from words[i], its low half from
    words[BLOCK + i] and its angle from words[2·BLOCK + i] (gaussian.c).
    """
    if words.dtype != torch.int32 or words.shape != (WORDS32,) or words.device != _HOST:
        raise ValueError(
            f"words must be an int32 CPU tensor of shape ({WORDS32},), got "
            f"dtype={words.dtype}, shape={tuple(words.shape)}, device={words.device}"
        )
    words = words.contiguous()
    out = torch.empty(2 * BLOCK, dtype=torch.float32, device=_HOST)
    _library().dpfy_gaussian_from_words(words.data_ptr(), out.data_ptr())
    return out
