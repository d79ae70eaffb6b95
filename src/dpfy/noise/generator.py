"""The Gaussian generator: secure by default (ChaCha20), reproducible from a seed on request.

Convention (docs/architecture.md): noise is calibrated to the **sum**: the engine adds N(0, (σ·Δ)²
I) to
Σ_i w_i g_i, where Δ is the clipping policy's sensitivity, and divides by the normalizer after.

Two modes (``NoiseSource(seed)``):

- **Secure** (``seed=None``, the default): ChaCha20 (RFC 8439, 20 rounds) inside dpfy's compiled
  sampler, keyed with 32 bytes from ``os.urandom`` (backend ``"chacha20"``). Nobody without the
  key can predict or reproduce the noise; the key lives only in memory (no checkpoint holds
  it: a resumed secure run is re-keyed, so it never replays noise). Where the sampler
  cannot be built (no C compiler, not Linux x86-64 with AVX2) every draw comes from
  ``os.urandom`` through float64 Box–Muller in torch instead (backend ``"urandom"``), with a
  ``RuntimeWarning``: as secure and with the same tails, only slower.
- **Reproducible** (``seed=<int>``): 16 xoshiro256++ streams in the compiled sampler
  (``"xoshiro"``), or a ``torch.Generator`` (``"torch"``: asked for, or the warned fallback).
  Anyone who knows the seed reproduces the noise, and so can undo the privacy: a seed is for
  debugging and for reproducing a paper, never for a release.

Where the noise is drawn: the backends above run on the CPU. Noise for a tensor on another
device (CUDA) is drawn on that device, so no noise crosses the host–device bus: with Triton,
one fused kernel per draw (:mod:`dpfy.noise.triton_noise`: ChaCha20, keyed from os.urandom or,
seeded, from the host stream, and the same Box–Muller transform); else, secure, ChaCha20 in
torch tensor operations (:mod:`dpfy.noise.device_gaussian`: the compiled sampler's keystream
bit for bit, the same transform) and, seeded, torch's generator there (Philox on CUDA). On the CPU
the compiled sampler stays the default: it is tens of times faster than ChaCha20 in torch
tensor operations there (docs/guide/noise_generators.md has the measurements), which
``backend="torch-chacha20"`` selects on every device.

Tails, every backend: u1 = (r + ½)·2⁻⁶⁴ comes from 64 random bits r and the radius
√(−2 ln u1) is computed in double (the fallbacks) or in float32 from a float32 u1, which keeps
2⁻²³ relative precision down to its smallest value (the compiled and device samplers), so
|z| reaches √(130 ln 2) ≈ 9.4925σ (at u1 = 2⁻⁶⁵), and the tail mass beyond any t below that
is the Gaussian's up to 2⁻⁶⁴ per draw. torch's own
``normal_`` (float32 uniforms, cut at 5.77σ) is used nowhere: a cut tail is mass the accountant
does not see (an extra δ ≈ Φ̄(t − 1/σ) per participation). Like every floating-point sampler
this is a discretized Gaussian; it does not defend against the floating-point attack of
Mironov 2012 on the output.
"""

from __future__ import annotations

import math
import os
import threading
import warnings
from typing import Any, Literal

import torch

from dpfy._require import require, require_extra
from dpfy.native.build import NativeUnavailable
from dpfy.native.gaussian import ChaChaGaussian, XoshiroGaussian  # built on first use
from dpfy.noise.device_gaussian import DeviceChaChaGaussian, DeviceSeededGaussian
from dpfy.noise.device_draws import DEVICE_CHUNK, chunks, fused
from dpfy.noise.triton_noise import TritonChaChaGaussian, seeded_stream
from dpfy.noise.triton_noise import SeededChaChaGaussian, triton_available

_DeviceStream = DeviceChaChaGaussian | DeviceSeededGaussian

__all__ = ["NoiseSource", "secure_uniform"]

Backend = Literal["auto", "compiled", "torch", "urandom", "torch-chacha20", "triton"]
_BACKENDS = ("auto", "compiled", "torch", "urandom", "torch-chacha20", "triton")
_MASK52 = (1 << 52) - 1
# the backend choice a resumed source makes, from the backend its checkpoint names
_RESUMED_CHOICE: dict[str, Backend] = {
    "torch": "torch",
    "urandom": "urandom",
    "torch-chacha20": "torch-chacha20",
}


def _open_unit(words: torch.Tensor) -> torch.Tensor:
    """int64 random words → float64 (m + ½)·2⁻⁵² from their top 52 bits m: exactly in (0, 1)."""
    return (((words >> 12) & _MASK52).double() + 0.5) * 2.0**-52


def _u1(words: torch.Tensor) -> torch.Tensor:
    """int64 random words r → float64 u1 = (r + ½)·2⁻⁶⁴ (r read as unsigned), smallest 2⁻⁶⁵.

    (r >> 12)·2⁻⁵² and ((r & 0xFFF) + ½)·2⁻⁶⁴ are exact doubles; their sum rounds only where
    u1 ≥ 2⁻⁵², i.e. in the body, not in the tail.
    """
    return ((words >> 12) & _MASK52).double() * 2.0**-52 + (
        (words & 0xFFF).double() + 0.5
    ) * 2.0**-64


def _normals_from_words(words: torch.Tensor) -> torch.Tensor:
    """2k random int64 words → 2k float64 N(0, 1) by Box–Muller (the fallback backends).

    Pair i takes u1 from all 64 bits of words[i] (:func:`_u1`, radius ≤ √(130 ln 2)) and its
    angle from 52 bits of words[k + i]; output: the k cosines, then the k sines.
    """
    k = words.numel() // 2
    radius = torch.sqrt(-2.0 * torch.log(_u1(words[:k])))
    angle = (2 * math.pi) * _open_unit(words[k : 2 * k])
    return torch.cat([radius * torch.cos(angle), radius * torch.sin(angle)])


def _urandom_words(n: int) -> torch.Tensor:
    """n int64 words from the OS CSPRNG."""
    if n == 0:
        return torch.zeros(0, dtype=torch.int64)
    return torch.frombuffer(bytearray(os.urandom(8 * n)), dtype=torch.int64)


def _fits_kernel(t: torch.Tensor) -> bool:
    """The compiled sampler writes straight into contiguous float32 CPU tensors."""
    return t.dtype == torch.float32 and t.device.type == "cpu" and t.is_contiguous()


class NoiseSource:
    """Draws Gaussian noise: secure (default) or reproducible from a seed.

    Args:
      seed: ``None`` (default) ⇒ secure: ChaCha20 keyed from ``os.urandom``. An int ⇒
        reproducible: anyone who knows the seed can reproduce the noise and undo the privacy.
      backend: ``"auto"`` (the compiled sampler, else the fallback with a ``RuntimeWarning``;
        noise for tensors on another device is drawn there, see below), ``"compiled"`` (error
        if it cannot be built; every draw on the CPU, copied to the tensor's device),
        ``"torch"`` (reproducible only: a ``torch.Generator`` feeding float64 Box–Muller on the
        CPU, torch's generator on the tensor's device for other devices), ``"urandom"``
        (secure only: os.urandom feeding float64 Box–Muller, copied to the device),
        ``"torch-chacha20"`` (secure only: ChaCha20 in torch tensor operations on the tensor's
        device, the CPU included), ``"triton"`` (the fused Triton kernel on every device, the
        CPU included under ``TRITON_INTERPRET=1``; needs ``dpfy[gpu]``).

    Device: with ``"auto"`` (and ``"torch"``), noise for a tensor that is not on the CPU is
    drawn on its device: by the fused Triton kernel on a GPU where Triton is installed (not
    for ``"torch"``), else secure by ChaCha20 in torch operations keyed from ``os.urandom``
    (one key per device), seeded by torch's generator on that device (Philox on CUDA); seeded
    keys and generators come from this source's host stream the first time a device is used.
    :meth:`generator_for` names the generator a device gets.

    Every backend's draws reach |z| = √(130 ln 2) ≈ 9.49σ with Gaussian tail mass (module
    docstring). ``state_dict()`` of a seeded source holds the generator states that continue
    its streams bit-identically, its device generators' included (secret, like the seed). A
    secure source's holds no key and no counter, for no device: a resumed secure run is
    re-keyed from ``os.urandom`` (:meth:`load_state_dict`), so no checkpoint, saved or leaked,
    can reproduce or replay its noise.
    """

    def __init__(self, seed: int | None = None, *, backend: Backend = "auto") -> None:
        require(
            backend in _BACKENDS,
            "backend",
            backend,
            'one of "auto", "compiled", "torch", "urandom", "torch-chacha20", "triton"',
        )
        if backend == "triton":
            require_extra("triton", feature='backend="triton" (the fused noise kernel)')
        require(
            not (seed is not None and backend == "torch-chacha20"),
            "backend",
            backend,
            'not "torch-chacha20" for seeded noise',
            "ChaCha20 is the secure generator, keyed from os.urandom: pass seed=None for it, "
            "or backend=\"torch\" for torch's seeded generator on the tensor's device",
        )
        require(
            not (seed is None and backend == "torch"),
            "backend",
            backend,
            'not "torch" for secure noise (seed=None)',
            "torch's generator is the seeded one: pass seed=<int> for reproducible noise, "
            'or backend="urandom" for the secure fallback',
        )
        require(
            not (seed is not None and backend == "urandom"),
            "backend",
            backend,
            'not "urandom" for seeded noise',
            "os.urandom cannot be seeded: pass seed=None "
            'for secure noise, or backend="torch" for torch\'s seeded generator',
        )
        self._compiled: ChaChaGaussian | XoshiroGaussian | None = None
        self._generator: torch.Generator | None = None  # the "torch" backend
        self._reproducible = seed is not None
        self._pid = os.getpid()
        self._choice: Backend = backend
        host = "auto" if backend == "triton" else backend  # "triton": the host as "auto"
        self._devices: dict[torch.device, _DeviceStream] = {}  # the device generators
        self._saved_devices: dict[str, torch.Tensor] = {}  # seeded states not yet resumed
        if host in ("auto", "compiled"):
            try:
                self._compiled = XoshiroGaussian(seed) if seed is not None else ChaChaGaussian()
            except NativeUnavailable as err:
                if backend == "compiled":
                    raise
                fallback = (
                    "torch's generator (seeded)"
                    if self._reproducible
                    else "os.urandom: still secure, but tens of times slower"
                )
                warnings.warn(
                    f"dpfy's compiled Gaussian sampler is unavailable ({err}); noise "
                    f"is drawn from {fallback}",
                    RuntimeWarning,
                    stacklevel=2,
                )
        if self._compiled is None and seed is not None:  # seeded: self._reproducible
            self._generator = torch.Generator().manual_seed(seed)

    @property
    def reproducible(self) -> bool:
        """True iff the noise follows from a seed (anyone with the seed can reproduce it)."""
        return self._reproducible

    @property
    def secure(self) -> bool:
        """Not reproducible: drawn from a CSPRNG keyed by the OS."""
        return not self._reproducible

    @property
    def backend(self) -> str:
        """The CPU generator: ``"chacha20"``, ``"urandom"``, ``"torch-chacha20"`` (secure) or
        ``"xoshiro"``, ``"torch"`` (reproducible)."""
        if self._choice == "torch-chacha20":
            return "torch-chacha20"
        if self._compiled is not None:
            return "xoshiro" if self._reproducible else "chacha20"
        return "torch" if self._reproducible else "urandom"

    def generator_for(self, device: torch.device | str) -> str:
        """The generator that draws noise for tensors on ``device``: :attr:`backend` where the
        host draws it; where the device draws it itself, ``"triton-chacha20"`` (``-seeded``: the
        fused kernel), else ``"torch-chacha20"`` or ``"torch-device"`` (seeded: Philox on CUDA)."""
        device = torch.device(device)
        if not self._on_device(device):
            return self.backend
        if self._use_triton(device):
            return "triton-chacha20-seeded" if self._reproducible else "triton-chacha20"
        return "torch-device" if self._reproducible else "torch-chacha20"

    def _on_device(self, device: torch.device) -> bool:
        """Whether noise for tensors on ``device`` is drawn there by a torch generator."""
        if self._choice in ("torch-chacha20", "triton"):
            return True
        return device.type != "cpu" and self._choice in ("auto", "torch")

    def _use_triton(self, device: torch.device) -> bool:
        """Whether the fused Triton kernel draws the noise for ``device``: asked for
        (``backend="triton"``), or by default on a GPU where Triton is installed."""
        return self._choice == "triton" or (self._choice == "auto" and triton_available(device))

    def _device_stream(self, device: torch.device) -> _DeviceStream:
        """The generator on ``device``, made on first use: secure, a fresh ChaCha20 key (and
        fresh keys in a forked child); seeded, torch's generator there, resumed from a
        checkpoint's state or seeded from the host stream."""
        self._rekey_after_fork()
        stream = self._devices.get(device)
        if stream is not None:
            return stream
        triton = self._use_triton(device)
        if not self._reproducible:
            stream = TritonChaChaGaussian(device) if triton else DeviceChaChaGaussian(device)
        elif str(device) in self._saved_devices:
            saved = self._saved_devices.pop(str(device))
            if saved.dtype == torch.int64:  # a seeded ChaCha20 stream's (key, counter, nonce)
                stream = seeded_stream(None, device, saved)
            else:  # a torch generator's state
                stream = DeviceSeededGaussian(0, device)
                stream.set_state(saved)
        elif triton:  # keyed from the host stream: reproducible from the seed
            stream = seeded_stream(self._words(4).numpy().astype("<i8").tobytes(), device)
        else:
            stream = DeviceSeededGaussian(int(self._words(1)[0]), device)
        self._devices[device] = stream
        return stream

    def _rekey_after_fork(self) -> None:
        """In a forked child, fresh keys for every secure generator (else parent and child
        would draw the same noise)."""
        if not self._reproducible and self._pid != os.getpid():
            self._pid, self._devices = os.getpid(), {}
            if self._compiled is not None:
                self._compiled = ChaChaGaussian()

    def _stream(self) -> ChaChaGaussian | XoshiroGaussian:
        """The compiled sampler (re-keyed in a forked child if secure)."""
        self._rekey_after_fork()
        assert self._compiled is not None
        return self._compiled

    def _words(self, n: int) -> torch.Tensor:
        """n random int64 words from this source's CPU generator."""
        if self._choice == "torch-chacha20":
            return self._device_stream(torch.device("cpu")).words(n)
        if self._compiled is not None:
            return self._stream().words(n)
        if self._generator is not None:
            return torch.empty(n, dtype=torch.int64, device="cpu").random_(
                -(2**63), None, generator=self._generator
            )
        return _urandom_words(n)

    def _noise(self, n: int, std: float, buf: torch.Tensor | None = None) -> torch.Tensor:
        """(n,) i.i.d. N(0, std²): float32 from the compiled sampler (into ``buf[:n]`` if
        given), else float64 from the fallback's Box–Muller."""
        if self._compiled is not None:
            out = torch.empty(n, dtype=torch.float32, device="cpu") if buf is None else buf[:n]
            return self._stream().axpy_(out, 0.0, std)
        return _normals_from_words(self._words(n + n % 2))[:n].mul_(std)

    def gaussian(self, like: torch.Tensor, std: float) -> torch.Tensor:
        """A tensor shaped like ``like`` with i.i.d. N(0, std²) entries."""
        if std == 0:
            return torch.zeros_like(like)
        if self._on_device(like.device):
            z = self._device_stream(like.device).normal(like.numel()).mul_(std)
            return z.to(like.dtype).reshape(like.shape)
        z = self._noise(like.numel(), std)
        return z.to(dtype=like.dtype, device=like.device).reshape(like.shape)

    def noisy_mean(
        self, total: torch.Tensor, std: float, normalizer: float, chunk: int = 1 << 16
    ) -> torch.Tensor:
        """(total + N(0, std²)) / normalizer, in place on ``total``: the released update.

        Computed as total/normalizer + N(0, (std/normalizer)²) (the same law). The compiled
        sampler does this in one pass over a float32 CPU ``total``; otherwise each ``chunk`` is
        drawn into one reused chunk-sized buffer, so the extra memory is one chunk. A device
        generator draws ``max(chunk, 2²²)`` values at a time on the tensor's device.
        """
        if std == 0:
            return total.div_(normalizer)
        if self._on_device(total.device):
            stream = self._device_stream(total.device)
            if fused(stream, total):  # one launch: total <- total/b + (std/b)·z
                stream.axpy_(total.view(-1), 1.0 / normalizer, std / normalizer)
                return total
            for part in chunks(total, max(chunk, DEVICE_CHUNK)):
                part.div_(normalizer).add_(stream.normal(part.numel()), alpha=std / normalizer)
            return total
        if self._compiled is not None and _fits_kernel(total):
            self._stream().axpy_(total.view(-1), 1.0 / normalizer, std / normalizer)
            return total
        buf = (
            torch.empty(min(chunk, total.numel()), dtype=torch.float32, device="cpu")
            if self._compiled is not None
            else None
        )
        for part in chunks(total, chunk):
            part.div_(normalizer).add_(
                self._noise(part.numel(), std / normalizer, buf).to(part.device)
            )
        return total

    def add_gaussian_(self, t: torch.Tensor, std: float, chunk: int = 1 << 16) -> torch.Tensor:
        """t += N(0, std²) in place, drawn ``chunk`` entries at a time (bounded extra memory)."""
        if std == 0:
            return t
        if self._on_device(t.device):
            stream = self._device_stream(t.device)
            if fused(stream, t):
                stream.axpy_(t.view(-1), 1.0, std)
                return t
            for part in chunks(t, max(chunk, DEVICE_CHUNK)):
                part.add_(stream.normal(part.numel()), alpha=std)
            return t
        if self._compiled is not None and _fits_kernel(t):
            self._stream().axpy_(t.view(-1), 1.0, std)
            return t
        for part in chunks(t, chunk):
            part.add_(self._noise(part.numel(), std).to(part.device))
        return t

    def state_dict(self) -> dict[str, Any]:
        """The mode and backend, and for a seeded source the generator state (secret).

        A secure source saves no key and no counter. Continuing its stream after a resume
        would replay noise: two continuations from one checkpoint (two learning rates tried,
        a resume after later models were seen) would add the same noise to different batches,
        and the difference of their releases would hold no noise at all. Its resume draws
        fresh noise instead (:meth:`load_state_dict`).
        """
        state: dict[str, Any] = {"reproducible": self._reproducible, "backend": self.backend}
        if self._choice == "triton":
            state["device_noise"] = "triton"
        if not self._reproducible:
            return state  # no key, no counter: not the host's, not any device's
        if self._compiled is not None:
            state["state"] = self._stream().get_state()
        else:
            assert self._generator is not None, "reproducible without the compiled sampler: torch's"
            state["generator"] = self._generator.get_state()
        devices = dict(self._saved_devices)  # resumed from a checkpoint, not used here yet
        for device, stream in self._devices.items():
            assert isinstance(stream, DeviceSeededGaussian | SeededChaChaGaussian), "seeded"
            devices[str(device)] = stream.get_state()
        if devices:
            state["device_generators"] = devices
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Switch to the mode and backend of ``state``: continue a seeded stream, re-key a
        secure one.

        Seeded (``"xoshiro"``, ``"torch"``): the saved streams continue bit-identically, the
        device generators' too (on the device of the same name; unused where there is none);
        a xoshiro one is refused where the compiled sampler cannot be built, since reproducing
        it is its point. Secure (``"chacha20"``, ``"urandom"``, ``"torch-chacha20"``): fresh
        ChaCha20 keys from ``os.urandom``, for the host and for every device (a key a
        checkpoint holds is ignored), so no two resumes of one checkpoint share noise; where
        the sampler cannot be built, os.urandom itself (warned: still secure).
        """
        backend = state["backend"]
        self._reproducible = backend in ("xoshiro", "torch")
        self._compiled, self._generator, self._pid = None, None, os.getpid()
        self._devices, self._saved_devices = {}, {}  # secure: fresh keys on first use
        self._choice = _RESUMED_CHOICE.get(backend, "auto")
        if state.get("device_noise") == "triton":
            self._choice = "triton"
        if self._reproducible:
            self._saved_devices = dict(state.get("device_generators", {}))
        if backend == "torch":
            self._generator = torch.Generator()
            self._generator.set_state(state["generator"])
        elif backend == "xoshiro":
            try:
                self._compiled = XoshiroGaussian(0)
            except NativeUnavailable as err:
                raise RuntimeError(
                    f"this checkpoint's noise was drawn by dpfy's compiled sampler, which "
                    f"cannot be built here ({err}); resume on a machine where it can, "
                    f"to continue the same noise stream"
                ) from err
            self._compiled.set_state(state["state"])
        elif backend == "chacha20":
            try:
                self._compiled = ChaChaGaussian()  # a fresh key from os.urandom
            except NativeUnavailable as err:
                warnings.warn(
                    f"dpfy's compiled sampler cannot be built here ({err}); the "
                    f"resumed run draws its fresh noise from os.urandom (still "
                    f"secure, slower)",
                    RuntimeWarning,
                    stacklevel=2,
                )


class _SecureWords:
    """A process-wide ChaCha20 stream keyed from os.urandom, for :func:`secure_uniform`;
    os.urandom itself where the compiled sampler cannot be built; for another device, a
    ChaCha20 stream on that device. Re-keyed after a fork."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._source: NoiseSource | None = None
        self._devices: dict[torch.device, DeviceChaChaGaussian] = {}
        self._pid = -1

    def __call__(self, n: int, device: torch.device | None = None) -> torch.Tensor:
        with self._lock:
            if self._source is None or self._pid != os.getpid():
                try:
                    self._source = NoiseSource(backend="compiled")
                except NativeUnavailable:
                    self._source = NoiseSource(backend="urandom")
                self._devices, self._pid = {}, os.getpid()
            if device is None or device.type == "cpu":
                return self._source._words(n)
            stream = self._devices.get(device)
            if stream is None:
                stream = self._devices[device] = DeviceChaChaGaussian(device)
        return stream.words(n)  # the stream reserves its counter range under its own lock


_secure_words = _SecureWords()


def secure_uniform(n: int, device: torch.device | str | None = None) -> torch.Tensor:
    """n float64 uniforms (m + ½)·2⁻⁵², m 52 random bits: exactly in (0, 1), from a CSPRNG.

    The bits come from a ChaCha20 stream keyed from ``os.urandom`` (compiled sampler; a
    dataset's worth of Poisson masks costs microseconds), or from ``os.urandom`` directly where
    the sampler cannot be built. With a ``device`` other than the CPU, they are drawn there by
    ChaCha20 in torch operations (its own key). Nothing about them is reproducible or stored.
    """
    return _open_unit(_secure_words(n, None if device is None else torch.device(device)))
