"""The floating-point arithmetic in effect: unit roundoffs, the row probe's tolerance derived
from them, and full float32 for the computations that decide the sensitivity.

A float32 tensor on CUDA is not always computed in float32. With TensorFloat-32 allowed
(``torch.backends.cudnn.allow_tf32``, on by default for convolutions;
``torch.backends.cuda.matmul.allow_tf32`` or ``torch.set_float32_matmul_precision("high")``
for matrix products) the inputs of a convolution or matmul are rounded to a 10-bit mantissa,
unit roundoff u = 2⁻¹¹, before they are multiplied (the products are accumulated in float32);
``"medium"`` allows bfloat16 inside (u = 2⁻⁸); autocast runs the listed ops in its dtype. cuDNN
may also pick another algorithm for another batch size, which sums in another order.

Two places in dpfy depend on that arithmetic.

1. **The row-identity probe** (``grads/row_identity.py``) compares a layer's input rows computed
   on a batch of n rows and on n − 1 of them. Those are two different computations: the rows
   differ by the arithmetic alone. :func:`row_rtol` is the relative tolerance,
   ``max(FP32_RTOL, ROW_FACTOR · u)`` for the unit roundoff u of the arithmetic in effect
   (:func:`unit_roundoff`), and each element's change is bounded by it times the element's
   magnitude *plus its row's root mean square* (``row_identity.beyond_arithmetic``). Why the
   row's scale: a dot product of length K with inputs rounded at u errs by at most about
   K·u·‖a‖‖b‖ (γ_K, Higham 2002, §3.1), and with rounding errors of random sign by about
   √K·u·‖a‖‖b‖ (Higham & Mary 2019), a scale the row's norm carries; a single element may
   be a small result of large cancelling terms, so a bound relative to the element alone (the
   probe's former |Δ| ≤ 1e-4·|x| + 1e-5·max|x|) refuses arithmetic noise on such elements.
   Once the rows of two forwards differ at all (by the summation order), rounding the next
   layer's inputs to TF32 moves each element that crosses a rounding boundary by one TF32
   ulp, so the difference grows layer by layer towards a few u of TF32, not beyond.
   Measured in emulation (inputs of every convolution and Linear rounded to 10 bits, the full
   batch summed in float32 and the shortened one in float64, ``tests/grads/
   test_arithmetic_tolerance.py``): ResNet-18 with GroupNorm at 32×32, 8 rows, worst element
   7.3·u (the last block; 1.2·u after the fourth layer of a small GroupNorm conv net), every
   layer refused by the former tolerance. ``ROW_FACTOR = 32`` leaves a margin of 4 over
   that, for larger batches (the maximum over more elements) and cuDNN's Winograd or FFT
   algorithms. The float32 floor ``FP32_RTOL = 1e-4`` is the probe's former relative
   tolerance (float32 BLAS results differ between batch sizes on the CPU), kept so that
   nothing accepted before is refused now. What this gives up: under TF32 a batch statistic
   over more than about 1/row_rtol = 64 rows changes rows by less than the tolerance and
   passes this probe; the perturbation probe (``grads/perturbation.py``) still refuses it,
   since it compares forwards of the same shape bit for bit (a hand-written batch norm is
   refused in the tests under emulated TF32).

2. **The sensitivity bound.** The clip factor of example i is C/‖g_i‖ with ‖g_i‖ computed by the
   engine, and the clipped sum Σ_i w_i g_i is computed by the engine too. If the norm is
   computed in TF32 and the sum in float32 (or either with another rounding), example i's
   contribution can exceed C by the norm's relative error (measured on a GPU: 2.3e-4 for the
   tanh CNN's cuDNN convolutions). dpfy computes per-example norms, materialized per-example
   gradients and the clipped sums in full float32: :func:`full_precision` switches TF32,
   reduced-precision matmuls and autocast off for the duration of those computations and
   restores the user's settings after. The forward and backward that produce the layer inputs
   and output gradients still run in the user's arithmetic: they decide *which* gradient
   example i has, not how large its clipped contribution is, which is bounded by C up to
   float32 rounding because its norm and its sum are computed from the same inputs in the
   same arithmetic. (The alternative, inflating the accounted sensitivity by a derived
   bound on TF32's error, would charge every run for an error that switching TF32 off for
   the engine's few matmuls removes.)

:func:`round_to_tf32` rounds float32 to TF32's precision, so the tests emulate a GPU's TF32
on the CPU.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable, TypeVar

import torch

__all__ = [
    "FP64_U",
    "FP32_U",
    "TF32_U",
    "FP16_U",
    "BF16_U",
    "FP32_RTOL",
    "ROW_FACTOR",
    "dtype_roundoff",
    "tf32_in_effect",
    "unit_roundoff",
    "row_rtol",
    "round_to_tf32",
    "full_precision",
    "in_full_precision",
]

FP64_U = 2.0**-53
FP32_U = 2.0**-24
TF32_U = 2.0**-11  # 10 explicit mantissa bits, round to nearest
FP16_U = 2.0**-11
BF16_U = 2.0**-8
FP32_RTOL = 1e-4  # the probe's float32 tolerance (module docstring, point 1)
ROW_FACTOR = 32.0  # row_rtol = ROW_FACTOR · u beyond float32 (module docstring, point 1)

_DTYPE_U = {
    torch.float64: FP64_U,
    torch.float32: FP32_U,
    torch.float16: FP16_U,
    torch.bfloat16: BF16_U,
}

F = TypeVar("F", bound=Callable[..., Any])


def dtype_roundoff(dtype: torch.dtype) -> float:
    """Unit roundoff of ``dtype`` itself (float32's for a dtype this table does not know)."""
    return _DTYPE_U.get(dtype, FP32_U)


def _legacy_or_new(legacy: Callable[[], bool], new: Callable[[], str]) -> bool:
    """A TF32 flag, read through the legacy ``allow_tf32`` attribute or, when torch refuses
    that because the newer ``fp32_precision`` API was used, through the newer one."""
    try:
        return bool(legacy())
    except RuntimeError:  # "mix of the legacy and new APIs": read the new one
        return new() == "tf32"


def tf32_in_effect() -> bool:
    """Whether float32 convolutions or matmuls on CUDA may run in TF32 (or lower) now."""
    cuda, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    matmul = _legacy_or_new(
        lambda: cuda.allow_tf32, lambda: getattr(cuda, "fp32_precision", "ieee")
    )
    conv = _legacy_or_new(
        lambda: cudnn.allow_tf32,
        lambda: getattr(getattr(cudnn, "conv", None), "fp32_precision", "ieee"),
    )
    return matmul or conv or _matmul_precision() in ("high", "medium")


def _matmul_precision() -> str:
    """``torch.get_float32_matmul_precision()``, or ``"mixed"`` where torch refuses to say
    because the per-backend API was used (its flags are then read one by one)."""
    try:
        return str(torch.get_float32_matmul_precision())
    except RuntimeError:
        return "mixed"


def unit_roundoff(dtype: torch.dtype, device_type: str) -> float:
    """u of the arithmetic a ``dtype`` tensor on ``device_type`` is computed in now: the dtype's,
    coarsened by TF32 or reduced-precision matmuls (CUDA; and ``"medium"``/``"high"``
    float32 matmul precision anywhere, which lets backends use bfloat16 or TF32) and by
    autocast enabled on that device."""
    u = dtype_roundoff(dtype)
    if dtype == torch.float32:
        precision = _matmul_precision()
        if precision == "medium":
            u = max(u, BF16_U)
        elif device_type == "cuda" and tf32_in_effect() or precision == "high":
            u = max(u, TF32_U)
        if device_type == "cpu":  # oneDNN's own flags (torch.backends.mkldnn.*.fp32_precision)
            u = max([u] + [_REDUCED_U.get(_fp32_precision(f), u) for f in _onednn_flags()])
    if dtype in (torch.float32, torch.float64) and _autocast_on(device_type):
        u = max(u, dtype_roundoff(torch.get_autocast_dtype(device_type)))
    return u


# the unit roundoff a backend's fp32_precision setting lets float32 operations run in
_REDUCED_U = {"tf32": TF32_U, "bf16": BF16_U}


def _onednn_flags() -> list[Any]:
    """The CPU's oneDNN matmul and convolution flag objects (where torch has them)."""
    mkldnn = getattr(torch.backends, "mkldnn", None)
    return [f for f in (getattr(mkldnn, "matmul", None), getattr(mkldnn, "conv", None)) if f]


def _fp32_precision(flag: Any) -> str:
    return str(getattr(flag, "fp32_precision", "ieee"))


def _reduced_off(flag: Any) -> Callable[[], None]:
    """Set one backend's float32 precision to "ieee" where it allows TF32 or bfloat16 (the
    CPU's oneDNN: ``torch.backends.mkldnn.matmul.fp32_precision = "bf16"``); its restore."""
    before = _fp32_precision(flag)
    if before not in _REDUCED_U:
        return _nothing
    flag.fp32_precision = "ieee"
    return functools.partial(_restore, flag, before)


def _restore(flag: Any, before: str) -> None:
    """Give ``flag`` back the precision ``before`` it read: inherited ("none") where its parent
    (``torch.backends.fp32_precision``, the backend's) gives that, so that a later change of
    the parent still reaches it; else set explicitly."""
    flag.fp32_precision = "none"
    if _fp32_precision(flag) != before:
        flag.fp32_precision = before


def _autocast_on(device_type: str) -> bool:
    try:
        return bool(torch.is_autocast_enabled(device_type))
    except (RuntimeError, TypeError):  # a device type autocast does not know
        return False


def row_rtol(dtype: torch.dtype, device_type: str) -> float:
    """The row probe's relative tolerance on ‖Δ row‖ / ‖row‖ (module docstring, point 1)."""
    return max(FP32_RTOL, ROW_FACTOR * unit_roundoff(dtype, device_type))


def round_to_tf32(x: torch.Tensor) -> torch.Tensor:
    """``x`` (float32) rounded to TF32's 10-bit mantissa, to nearest, ties to even, as a
    float32 tensor: what a TF32 tensor core multiplies. Infinities and NaN pass unchanged."""
    if x.dtype != torch.float32:
        raise ValueError(f"x must be float32, got dtype = {x.dtype}. Call .float() first")
    bits = x.contiguous().view(torch.int32)
    drop = 13  # float32 keeps 23 mantissa bits, TF32 10
    lsb = (bits >> drop) & 1
    rounded = (bits + ((1 << (drop - 1)) - 1) + lsb) & ~((1 << drop) - 1)
    finite = torch.isfinite(x)
    return torch.where(finite, rounded.view(torch.float32), x)


class full_precision:
    """Context manager: float32 computed in float32 inside: TF32 off for cuBLAS and cuDNN,
    TF32 and bfloat16 off for the CPU's oneDNN, float32 matmul precision ``"highest"``,
    autocast off on CUDA and the CPU; the user's settings restored after (module docstring,
    point 2). The flags are process-wide: another thread's forward running meanwhile runs in
    full float32 too, and they are restored when the last thread inside leaves. Entering and
    leaving cost a few microseconds (a flag read each, a write only for a flag that is on)."""

    def __enter__(self) -> "full_precision":
        with _SECTIONS.lock:  # the first thread in switches the flags off, the last out back
            if _SECTIONS.inside == 0:
                _SECTIONS.undo = _flags_off()
            _SECTIONS.inside += 1
        self._undo: list[Callable[[], None]] = []
        for device_type in ("cuda", "cpu"):  # autocast is per thread
            if _autocast_on(device_type):
                off = torch.autocast(device_type, enabled=False)
                off.__enter__()
                self._undo.append(lambda off=off: off.__exit__(None, None, None))  # type: ignore[misc]
        return self

    def __exit__(self, *exc: object) -> None:
        for undo in reversed(self._undo):
            undo()
        with _SECTIONS.lock:
            _SECTIONS.inside -= 1
            if _SECTIONS.inside == 0:
                for undo in reversed(_SECTIONS.undo):
                    undo()
                _SECTIONS.undo = []


class _Sections:
    """How many :class:`full_precision` sections are open, in every thread, and the restores
    of the process-wide flags the first of them switched off: a thread leaving while another
    is still inside must not give the other's norms and sums TF32 back."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.inside = 0
        self.undo: list[Callable[[], None]] = []


_SECTIONS = _Sections()


def _flags_off() -> list[Callable[[], None]]:
    """Switch TF32 and bfloat16 off in cuBLAS, cuDNN and oneDNN; the restores, in order."""
    undo: list[Callable[[], None]] = []
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    precision = _matmul_precision()
    if precision == "mixed":  # set through the per-backend API
        undo.append(_tf32_off(matmul, matmul))
    elif precision != "highest":  # covers cuBLAS's allow_tf32, which reads as "high"
        onednn = _onednn_flags()[:1]  # oneDNN's matmul flag, which the call below sets too
        undo.append(_matmul_precision_back(precision, onednn))
        torch.set_float32_matmul_precision("highest")
    undo.append(_tf32_off(cudnn, getattr(cudnn, "conv", None)))
    return undo + [_reduced_off(flag) for flag in _onednn_flags()]


def _matmul_precision_back(precision: str, onednn: list[Any]) -> Callable[[], None]:
    """The restore of ``torch.set_float32_matmul_precision("highest")`` (returned when called
    with the flags as they were): ``precision`` again, then oneDNN's matmul flag as before.
    Setting "high" also sets oneDNN's matmuls to "tf32", where the legacy
    ``torch.backends.cuda.matmul.allow_tf32 = True``, which also reads as "high", had left
    them in float32."""
    before = [_fp32_precision(flag) for flag in onednn]

    def back() -> None:
        torch.set_float32_matmul_precision(precision)
        for flag, was in zip(onednn, before):
            if _fp32_precision(flag) != was:
                _restore(flag, was)

    return back


def _nothing() -> None:
    return None


def _tf32_off(legacy: Any, new: Any) -> Callable[[], None]:
    """Switch one TF32 flag off (``legacy.allow_tf32``, or ``new.fp32_precision`` where torch
    refuses the legacy attribute because the newer API was used); return its restore."""
    undo = _nothing
    try:
        if legacy.allow_tf32:
            legacy.allow_tf32 = False
            undo = functools.partial(setattr, legacy, "allow_tf32", True)
    except RuntimeError:  # "mix of the legacy and new APIs": the new one decides
        pass
    # the legacy switch sets the new API's flag to "none", which inherits: under
    # torch.backends.fp32_precision = "tf32" (or torch.backends.cudnn's) it still reads "tf32",
    # and cuDNN's convolutions would still round to TF32 inside
    if getattr(new, "fp32_precision", "ieee") != "tf32":
        return undo
    new.fp32_precision = "ieee"

    def restore() -> None:
        _restore(new, "tf32")
        undo()

    return restore


def in_full_precision(fn: F) -> F:
    """Decorator: run ``fn`` inside :func:`full_precision`."""

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        with full_precision():
            return fn(*args, **kwargs)

    return wrapped  # type: ignore[return-value]
