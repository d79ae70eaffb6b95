"""``CompiledGaussian``: seeded N(0, 1) draws from ``gaussian.c``, written into float32 tensors.

16 xoshiro256++ streams (lane k = lane 0 jumped k·2^128 steps) + Box–Muller through glibc's
vector math: ≈ 0.4 ns per value on one core, against ≈ 2.4 ns for torch's CPU ``normal_`` (the
Mersenne Twister behind it is serial). Tails reach 6.66σ (torch's float32 normal_: 5.77σ).
The whole generator state is 64 words, so a checkpoint resumes the exact stream. Draws are
bit-identical for the same library build; another CPU level (AVX2 vs AVX-512 vector math) may
differ in the last bit.
"""

from __future__ import annotations

import ctypes
import threading

import torch

from dpfy.native.build import load

__all__ = ["CompiledGaussian"]

LANES = 16
STATE_WORDS = 4 * LANES


def _library() -> ctypes.CDLL:
    lib = load("gaussian")
    if not getattr(lib, "_dpfy_typed", False):
        lib.dpfy_gaussian_seed.argtypes = [ctypes.c_void_p, ctypes.c_uint64]
        lib.dpfy_gaussian_seed.restype = None
        lib.dpfy_gaussian_axpy.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_float,
                                           ctypes.c_float, ctypes.c_void_p]
        lib.dpfy_gaussian_axpy.restype = None
        lib._dpfy_typed = True
    return lib


class CompiledGaussian:
    """A seeded Gaussian generator (raises ``NativeUnavailable`` if it cannot be built here)."""

    def __init__(self, seed: int) -> None:
        self._lib = _library()
        self._lock = threading.Lock()  # the C call releases the GIL and mutates the state
        self._state = torch.empty(STATE_WORDS, dtype=torch.int64)
        self._lib.dpfy_gaussian_seed(self._state.data_ptr(), seed % 2 ** 64)

    def axpy_(self, x: torch.Tensor, a: float, s: float) -> torch.Tensor:
        """x ← a·x + s·z in place, z i.i.d. N(0, 1) (with a = 0, x is only written).

        ``x`` must be a contiguous float32 CPU tensor (callers use a scratch buffer otherwise).
        """
        if x.dtype != torch.float32 or x.device.type != "cpu" or not x.is_contiguous():
            raise ValueError(f"x must be a contiguous float32 CPU tensor, got dtype={x.dtype}, "
                             f"device={x.device}, contiguous={x.is_contiguous()}. Draw into a "
                             f"float32 buffer and add it")
        with self._lock:
            self._lib.dpfy_gaussian_axpy(x.data_ptr(), x.numel(), a, s, self._state.data_ptr())
        return x

    def get_state(self) -> torch.Tensor:
        return self._state.clone()

    def set_state(self, state: torch.Tensor) -> None:
        if state.dtype != torch.int64 or state.shape != (STATE_WORDS,):
            raise ValueError(f"state must be an int64 tensor of shape ({STATE_WORDS},), got "
                             f"dtype={state.dtype}, shape={tuple(state.shape)}. Pass a state from "
                             f"CompiledGaussian.get_state()")
        with self._lock:
            self._state.copy_(state)
