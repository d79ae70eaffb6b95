"""Where ``dpfy train``, ``dpfy tune`` and ``dpfy audit`` run: ``--device auto|cpu|cuda[:k]``.

``auto`` (the default) is the first CUDA device when torch sees one, else the CPU; ``cuda`` or
``cuda:k`` on a machine without that device is refused before anything runs, naming the fix.
The model is moved there before ``make_private`` (so the engine, the noise and the sums run
there: ``docs/guide/gpu.md``), each batch is moved there once by the training loop, and a
training set of tensors that fits in a quarter of the device's free memory is copied there
once (:func:`hold_on_device`), so that the private loader indexes it in place: no batch
crosses the bus, no host work per example (``sampling/fetch.py``). The device changes where
the run computes, not what it accounts: the same sampler, clip and noise; the privacy report
names it.
"""

from __future__ import annotations

import dataclasses
import re

import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from dpfy.data import DataSplits

__all__ = [
    "DEVICE_PATTERN",
    "DEVICE_HELP",
    "resolve_device",
    "device_description",
    "hold_on_device",
    "model_device",
    "fits",
    "HOLD_FRACTION",
]

DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:\d+)?")
DEVICE_HELP = "where to train: auto (CUDA when available, else the CPU), cpu, cuda or cuda:K"
# A training set is held on a CUDA device when it takes at most this share of its free memory:
# the rest stays for the model, its activations and the engine's per-example work.
HOLD_FRACTION = 0.25


def resolve_device(name: str) -> torch.device:
    """The device ``--device name`` means here; ``cuda[:k]`` refused when torch cannot use it."""
    if not DEVICE_PATTERN.fullmatch(name):
        raise ValueError(
            f"device must be auto, cpu, cuda or cuda:K, got device = {name!r}. "
            f"Write e.g. --device cuda:0"
        )
    if name == "auto":
        return torch.device("cuda", torch.cuda.current_device()) if _cuda() else torch.device("cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if not _cuda():
            raise ValueError(
                f"device must be one torch can use, got device = {name!r} but "
                f"torch.cuda.is_available() is False ({_why_no_cuda()}). Train with "
                f"--device cpu (or --device auto, which picks CUDA only when it is there), "
                f"or install a CUDA build of torch on a machine with an NVIDIA GPU"
            )
        count = torch.cuda.device_count()
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index >= count:
            raise ValueError(
                f"device must be one of cuda:0..cuda:{count - 1}, got device = {name!r}. "
                f"Pick a listed index (CUDA_VISIBLE_DEVICES renumbers them)"
            )
        device = torch.device("cuda", index)
    return device


def _cuda() -> bool:
    return bool(torch.cuda.is_available())


def _why_no_cuda() -> str:
    if torch.version.cuda is None:
        return f"this torch {torch.__version__} is built without CUDA"
    return "no CUDA device is visible to this process"


def device_description(device: torch.device) -> str:
    """One line naming the device for the report: ``cpu`` or ``cuda:0 (NVIDIA H200)``."""
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return str(device)


def model_device(model: nn.Module) -> torch.device:
    """Where the model's parameters live (the CPU for a model without any)."""
    return next((p.device for p in model.parameters()), torch.device("cpu"))


def hold_on_device(data: DataSplits, device: torch.device) -> DataSplits:
    """``data`` with its training and test splits copied to ``device`` once, where each is a
    ``TensorDataset`` and the two fit in :data:`HOLD_FRACTION` of the device's free memory;
    ``data`` unchanged on the CPU, or when they do not fit (the loop then moves each batch)."""
    if device.type != "cuda" or not fits(data, torch.cuda.mem_get_info(device)[0]):
        return data
    train, test = (
        TensorDataset(*(t.to(device) for t in s.tensors))  # type: ignore[attr-defined]
        for s in (data.train, data.test)
    )
    return dataclasses.replace(data, train=train, test=test)


def fits(data: DataSplits, free: int) -> bool:
    """Whether both splits are ``TensorDataset`` s whose tensors take at most
    :data:`HOLD_FRACTION` of ``free`` bytes together."""
    splits = (data.train, data.test)
    if not all(type(s) is TensorDataset for s in splits):
        return False
    return sum(_nbytes(s) for s in splits) <= HOLD_FRACTION * free


def _nbytes(dataset: Dataset) -> int:
    return sum(t.numel() * t.element_size() for t in dataset.tensors)  # type: ignore[attr-defined]
