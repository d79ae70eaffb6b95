"""Train one :class:`RunSpec` on Fashion-MNIST with ``dpfy.make_private`` and a schedule.

The loop is plain PyTorch (the engine's contract): Poisson batches from the private loader,
one ``optimizer.step()`` per logical batch, the schedule's plan applied by the engine. After
training, the run's own ledger is read by the accountants: ε by PLD (the guarantee) and by the
paper's GDP CLT (an approximation, reported beside it).

Per-step diagnostics (issue 5, item 4) are taken from ``optimizer.last_step_info`` every
``trace_every`` steps: C_t, σ_t, and the mean per-sample gradient norm, which is NOT private
(a debug statistic of raw gradients; it is only written to the results file, never fed back).
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from dpfy.adaptive import make_schedule
from dpfy.data import DataSplits
from dpfy.experiments.spec import RunSpec
from dpfy.models import build_model
from dpfy.privacy import epsilon, epsilon_curve

__all__ = ["train_run", "steps_per_epoch"]


def steps_per_epoch(n: int, expected_batch: int) -> int:
    """Logical batches per pass, ⌈N/b⌉: the same count the engine's Poisson loader yields."""
    return math.ceil(n / expected_batch - 1e-9)


@torch.no_grad()
def accuracy(model: torch.nn.Module, data, batch: int = 2000) -> float:
    """Test accuracy in % (the test set is public for evaluation purposes)."""
    x, y = data.tensors
    model.eval()
    correct = sum(int((model(x[i:i + batch]).argmax(1) == y[i:i + batch]).sum())
                  for i in range(0, len(x), batch))
    model.train()
    return 100.0 * correct / len(x)


def build_schedule(spec: RunSpec, *, n: int):
    """The spec's schedule for a dataset of ``n`` examples (Poisson rate b/N)."""
    q = spec.expected_batch / n
    spe = steps_per_epoch(n, spec.expected_batch)
    return make_schedule(spec.schedule, target_epsilon=spec.target_epsilon, delta=spec.delta,
                         sample_rate=q, total_steps=spec.epochs * spe, steps_per_epoch=spe,
                         max_grad_norm=spec.max_grad_norm, accountant=spec.calibration,
                         **dict(spec.options))


def train_run(spec: RunSpec, data: DataSplits, *, trace_every: int = 5,
              progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Train, evaluate and account one run; returns a JSON-able record."""
    import dpfy

    t0 = time.time()
    n = len(data.train)
    schedule = build_schedule(spec, n=n)
    torch.manual_seed(spec.seed)                          # model init
    model = build_model(spec.model, input_shape=data.input_shape, num_classes=data.num_classes)
    opt = torch.optim.SGD(model.parameters(), lr=spec.lr, momentum=spec.momentum)
    loader = DataLoader(data.train, batch_size=spec.expected_batch)
    model, opt, loader = dpfy.make_private(model, opt, loader, schedule=schedule,
                                           max_grad_norm=spec.max_grad_norm, seed=spec.seed,
                                           accountant="pld")
    trace: list[dict[str, float]] = []
    epochs: list[dict[str, float]] = []
    for epoch in range(spec.epochs):
        for x, y in loader:
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            info = opt.last_step_info
            if info["step"] % trace_every == 0 or info["step"] == schedule.total_steps - 1:
                trace.append({k: info[k] for k in ("step", "noise_multiplier", "clip",
                                                    "mean_grad_norm_nonprivate")})
        epochs.append({"epoch": epoch + 1, "step": opt.step_count,
                       "test_accuracy": accuracy(model, data.test)})
        if progress:
            progress(f"  epoch {epoch + 1}/{spec.epochs}: acc {epochs[-1]['test_accuracy']:.2f}%"
                     f" ({time.time() - t0:.0f}s)")
    ledger = opt.ledger
    record = {
        "spec": spec.to_dict(), "key": spec.key(),
        "test_accuracy": epochs[-1]["test_accuracy"], "epochs": epochs,
        "steps": ledger.num_steps, "sample_rate": spec.expected_batch / n,
        "epsilon_pld": epsilon(ledger, delta=spec.delta, accountant="pld"),
        "epsilon_gdp": epsilon(ledger, delta=spec.delta, accountant="gdp"),
        "epsilon_curve_pld": epsilon_curve(ledger, delta=spec.delta, accountant="pld",
                                           num_points=12),
        "epsilon_curve_gdp": epsilon_curve(ledger, delta=spec.delta, accountant="gdp",
                                           num_points=12),
        "trace": trace, "seconds": time.time() - t0,
    }
    return record
