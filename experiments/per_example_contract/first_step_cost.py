"""First-step cost of dpfy's per-example checks: one private step on a fresh model (the probes
run) against the next steps (they do not), tanh CNN and MLP, batch 256, one CPU thread.

Run from the repository root: PYTHONPATH=src python experiments/per_example_contract/first_step_cost.py
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from dpfy.models import build_model

torch.set_num_threads(1)
B, REPEATS, LATER = 256, 5, 6


def steps(name: str) -> tuple[float, float]:
    """(first step, median of later steps) in ms on a fresh model."""
    shape = (1, 28, 28) if name == "tanh_cnn" else (784,)
    g = torch.Generator().manual_seed(0)
    ds = TensorDataset(torch.randn(B * (LATER + 1), *shape, generator=g),
                       torch.randint(0, 10, (B * (LATER + 1),), generator=g))
    model = build_model(name, input_shape=shape, num_classes=10)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt, loader = dpfy.make_private(model, opt, DataLoader(ds, batch_size=B),
                                           noise_multiplier=1.0, max_grad_norm=1.0, seed=0,
                                           poisson_sampling=False)
    times = []
    it = iter(loader)
    for _ in range(LATER + 1):
        x, y = next(it)
        t = time.perf_counter()
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        times.append((time.perf_counter() - t) * 1e3)
    return times[0], statistics.median(times[1:])


if __name__ == "__main__":
    for name in ("tanh_cnn", "mlp"):
        runs = [steps(name) for _ in range(REPEATS)]
        first = statistics.median(r[0] for r in runs)
        later = statistics.median(r[1] for r in runs)
        print(f"{name}: first step {first:.1f} ms, later steps {later:.1f} ms, "
              f"first-step extra {first - later:.1f} ms (median of {REPEATS} fresh models)")
