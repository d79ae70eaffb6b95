"""Where dpfy's Triton kernels can run, and their modules loaded for the interpreter or not.

Triton is optional (``pip install "dpfy[gpu]"``). Its kernels compile for a GPU (CUDA, ROCm);
under ``TRITON_INTERPRET=1`` they run on the CPU in numpy instead (slow: for tests, which is how
CI checks a GPU kernel without a GPU). ``triton.jit`` reads that variable when a function is
decorated, so a kernel module is reloaded when it changes (:func:`kernel_module`).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import threading
from contextlib import AbstractContextManager, nullcontext
from types import ModuleType

import torch

__all__ = [
    "triton_installed",
    "triton_interpreted",
    "triton_available",
    "kernel_module",
    "launching_on",
]

_lock = threading.Lock()
_modules: dict[str, ModuleType] = {}


@functools.cache
def triton_installed() -> bool:
    """Whether Triton can be imported (looked up once: the private step asks every step)."""
    return importlib.util.find_spec("triton") is not None


def triton_interpreted() -> bool:
    """Whether ``TRITON_INTERPRET`` is set: kernels then run on the CPU, in numpy."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def triton_available(device: torch.device | str) -> bool:
    """Whether a Triton kernel can run for tensors on ``device``: Triton is installed and the
    device is a GPU Triton compiles for (CUDA, ROCm), or any device under the interpreter."""
    if not triton_installed():
        return False
    device = torch.device(device)
    if triton_interpreted():
        return True
    return device.type == "cuda" and torch.cuda.is_available()


def kernel_module(name: str) -> ModuleType:
    """The kernel module ``name`` (it must set ``INTERPRETED`` from Triton's knob), decorated
    for the current ``TRITON_INTERPRET``: imported once, reloaded when the variable changed."""
    with _lock:
        mod = _modules.get(name)
        if mod is None:
            mod = importlib.import_module(name)
        if bool(mod.INTERPRETED) != triton_interpreted():
            mod = importlib.reload(mod)
        _modules[name] = mod
        return mod


def launching_on(device: torch.device) -> AbstractContextManager[object]:
    """Make ``device`` current while a kernel for its tensors is launched: Triton launches on
    the current CUDA device, which for tensors on ``cuda:1`` need not be theirs."""
    return torch.cuda.device(device) if device.type == "cuda" else nullcontext()
