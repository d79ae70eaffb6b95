"""Device comparisons that hold wherever a tensor was made (issue 36 §7).

``torch.device("cuda") != torch.device("cuda", 0)``, while every tensor made with
``device="cuda"`` reports ``cuda:0`` (the current device). The CUDA tests compared the two and 8
of 95 failed on a GPU for that alone. The ``device`` fixture (conftest.py) returns the indexed
form, and tests compare through :func:`same_device`.
"""

from __future__ import annotations

import torch


def indexed_device(device: torch.device | str) -> torch.device:
    """``device`` with the index its tensors carry: ``cuda`` becomes ``cuda:<current device>``
    (the device a bare ``device="cuda"`` allocates on). The CPU has no index (its tensors
    report ``cpu``), and an explicit index is kept."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def same_device(a: torch.device | str, b: torch.device | str) -> bool:
    """Whether ``a`` and ``b`` name the same device once both carry their index."""
    return indexed_device(a) == indexed_device(b)
