"""``linear_ghost_sq_norms``: per-example ghost norms of a Linear layer on sequences, from
``ghost_norm.c`` (fused, symmetric Gram tiles; see the C file for the math and the layout).

Used by the Linear rule for T ≥ 2 on float32 CPU tensors when ``fused_ghost_available()``: on
one core of the benchmark machine it takes about half the time of torch's two batched matmuls
and the product (B 256, T 32, d_in 64, d_out 192: 1.3–1.4 vs 2.5–3.3 ms). It needs AVX-512 (its
16x16 in-register transposes and 8x16 tiles are written for 32 vector registers); elsewhere, or
without a C compiler, the rule keeps torch's route, with the same numbers up to float32
rounding.

It is single-threaded, so it is used only while torch runs on one intra-op thread. Splitting the
batch across Python threads did not pay: right after a parallel torch op, torch's OpenMP workers
keep spinning on the other cores, and the kernel's second thread got no core (two threads: the
split kernel 1.38 ms against torch's 1.16 ms; with ``OMP_WAIT_POLICY=passive`` the split took
0.95 ms, but then torch's own ops slow down). With more threads torch's parallel matmuls are used.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from dpfy.native.build import NativeUnavailable, load, target_flags

__all__ = ["linear_ghost_sq_norms", "fused_ghost_available", "kernel_available"]

_I64 = ctypes.c_int64


@functools.lru_cache(maxsize=None)
def _library() -> ctypes.CDLL:
    if target_flags() != ["-march=x86-64-v4"]:
        raise NativeUnavailable("the fused ghost-norm kernel is written for AVX-512 CPUs")
    lib = load("ghost_norm")
    lib.dpfy_ghost_norm_linear.argtypes = [
        ctypes.c_void_p,
        ctypes.c_void_p,
        *[_I64] * 8,
        ctypes.c_void_p,
        ctypes.c_void_p,
    ]
    lib.dpfy_ghost_norm_linear.restype = ctypes.c_int
    return lib


@functools.lru_cache(maxsize=None)
def kernel_available() -> bool:
    """Whether the kernel is built (or can be built) and loads on this machine."""
    try:
        _library()
    except NativeUnavailable:
        return False
    return True


def fused_ghost_available(a: torch.Tensor, g: torch.Tensor) -> bool:
    """Whether the Linear rule should use ``linear_ghost_sq_norms`` for these (B, T, d) tensors:
    float32 on the CPU, torch on one intra-op thread, and the kernel built on this machine."""
    return (
        a.dtype == g.dtype == torch.float32
        and a.device.type == g.device.type == "cpu"
        and torch.get_num_threads() == 1
        and kernel_available()
    )


def linear_ghost_sq_norms(a: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(‖Σ_t g_t a_tᵀ‖_F², ‖Σ_t g_t‖²) per example, each (B,) float32.

    Args:
      a: (B, T, d_a) float32 CPU, last dimension contiguous. Sensitive.
      g: (B, T, d_g) float32 CPU, last dimension contiguous. Sensitive.

    Raises ``NativeUnavailable`` if the kernel cannot be built here.
    """
    for name, x in (("a", a), ("g", g)):
        if x.dtype != torch.float32 or x.device.type != "cpu" or x.dim() != 3 or x.stride(-1) != 1:
            raise ValueError(
                f"{name} must be a (B, T, d) float32 CPU tensor with a contiguous "
                f"last dimension, got dtype={x.dtype}, device={x.device}, "
                f"shape={tuple(x.shape)}, strides={x.stride()}. Call .contiguous()"
            )
    if a.shape[:2] != g.shape[:2]:
        raise ValueError(
            f"a and g must have the same (B, T), got {tuple(a.shape[:2])} and {tuple(g.shape[:2])}"
        )
    lib = _library()
    b, t, da = a.shape
    dg = g.shape[2]
    # on the CPU whatever torch's default device is (under `torch.device("meta")` the kernel
    # would write through a meta tensor's pointer: a segfault)
    out_w, out_b = torch.empty(b, device="cpu"), torch.empty(b, device="cpu")  # (B,) each
    code = lib.dpfy_ghost_norm_linear(
        a.data_ptr(),
        g.data_ptr(),
        b,
        t,
        da,
        dg,
        a.stride(0),
        a.stride(1),
        g.stride(0),
        g.stride(1),
        out_w.data_ptr(),
        out_b.data_ptr(),
    )
    if code != 0:
        padded = -(-t // 16) * 16  # T rounded up to the kernel's 16-row blocks
        raise MemoryError(
            f"ghost_norm.c could not allocate its scratch of {(da + dg) * padded * 4} bytes"
        )
    return out_w, out_b
