"""Per-forward cost of the state guard (dpfy.buffers.BufferGuard): forwards of the tanh CNN
(batch 64, one thread) with and without the guard, interleaved, minimum over N each.

Run from the repository root: PYTHONPATH=src python experiments/per_example_contract/guard_cost.py
"""

from __future__ import annotations

import time

import torch
from torch import nn

from dpfy.buffers import BufferGuard
from dpfy.models import build_model

torch.set_num_threads(1)
N = 300


def best(model: nn.Module, x: torch.Tensor) -> float:
    t = time.perf_counter()
    model(x)
    return time.perf_counter() - t


if __name__ == "__main__":
    for name, buffers in (("tanh_cnn", 0), ("tanh_cnn + 8 buffers", 8)):
        plain = build_model("tanh_cnn", input_shape=(1, 28, 28), num_classes=10)
        guarded = build_model("tanh_cnn", input_shape=(1, 28, 28), num_classes=10)
        for m in (plain, guarded):
            for k in range(buffers):
                m.register_buffer(f"b{k}", torch.randn(64))
        BufferGuard(guarded)
        x = torch.randn(64, 1, 28, 28)
        a, b = [], []
        for _ in range(N):
            a.append(best(plain, x))
            b.append(best(guarded, x))
        print(f"{name}: +{(min(b) - min(a)) * 1e6:.1f} µs per forward "
              f"(min {min(a) * 1e3:.2f} ms without the guard)")
