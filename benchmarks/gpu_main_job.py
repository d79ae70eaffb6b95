"""The main job's recipe on one device, dpfy against Opacus in the same loop: seconds per epoch
and test accuracy.

Tramèr & Boneh's tanh CNN on Fashion-MNIST (command 1's model, clip 0.1, SGD lr 4 with momentum
0.9, expected batch 2048, Poisson sampling), 10 epochs at ε = 3, δ = 1e-5. One σ serves every
row: dpfy's PLD calibration for the 10-epoch run, given to Opacus as its noise multiplier, so the
rows differ only in the engine. The training data are held on the device for every row (as
``dpfy train`` does when they fit), and each row runs the same loop: draw a batch, forward, mean
cross-entropy, backward, step. The first epoch includes each engine's one-time probes and
warm-up; the table reports the median of the later epochs. The non-private row is the time
baseline only: it keeps the private rows' learning rate, too large without clipping, so its
accuracy is no reference.

Run it where the GPU is (``benchmarks/gpu.sh`` calls it after ``gpu.py``); on a machine without
CUDA it runs on the CPU. ``--smoke``: a 512-image training subset, batch 128, two epochs, accuracy
on the first 512 test images (the test suite runs it; its numbers measure nothing).
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
import warnings
from typing import Any, Callable

import torch
import torch.nn.functional as F
from _machine import cpu_name
from _smoke import HELP, require, size
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from dpfy.data import load_dataset
from dpfy.models import build_model
from dpfy.privacy.calibration import calibrate_noise_multiplier

EPOCHS = size(10, 2)
BATCH = size(2048, 128)
SUBSET = size(None, 512)  # training images
TEST_SUBSET = size(None, 512)  # test images
CLIP, LR, MOMENTUM, EPSILON, DELTA = 0.1, 4.0, 0.9, 3.0, 1e-5

Epoch = Callable[[], None]


def _data(device: torch.device) -> tuple[TensorDataset, torch.Tensor, torch.Tensor]:
    splits = load_dataset("fashion_mnist")
    x, y = splits.train.tensors  # type: ignore[attr-defined]
    if SUBSET is not None:
        x, y = x[:SUBSET], y[:SUBSET]
    xt, yt = splits.test.tensors  # type: ignore[attr-defined]
    if TEST_SUBSET is not None:
        xt, yt = xt[:TEST_SUBSET], yt[:TEST_SUBSET]
    return TensorDataset(x.to(device), y.to(device)), xt.to(device), yt.to(device)


def _model(device: torch.device) -> nn.Module:
    torch.manual_seed(0)  # the same initialization for every row
    return build_model("tanh_cnn", input_shape=(1, 28, 28), num_classes=10).to(device)


def _epoch(model: nn.Module, opt: Any, loader: Any) -> Epoch:
    def run() -> None:
        model.train()
        for x, y in loader:
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            opt.step()

    return run


def dpfy_row(data: TensorDataset, device: torch.device, sigma: float, seed: int | None) -> tuple:
    model = _model(device)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    model, opt, loader = dpfy.make_private(
        model, opt, DataLoader(data, batch_size=BATCH), noise_multiplier=sigma,
        max_grad_norm=CLIP, seed=seed)  # fmt: skip
    return model, _epoch(model, opt, loader)


def opacus_row(data: TensorDataset, device: torch.device, sigma: float) -> tuple:
    from opacus import PrivacyEngine

    model = _model(device)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    model, opt, loader = PrivacyEngine().make_private(
        module=model, optimizer=opt, data_loader=DataLoader(data, batch_size=BATCH),
        noise_multiplier=sigma, max_grad_norm=CLIP, poisson_sampling=True)  # fmt: skip
    return model, _epoch(model, opt, loader)


class _Batches:
    """Shuffled batches of a device-held dataset by one index operation each: the fastest
    non-private loop, the baseline the private rows are divided by."""

    def __init__(self, data: TensorDataset) -> None:
        self.x, self.y = data.tensors

    def __iter__(self):
        order = torch.randperm(self.x.shape[0], device=self.x.device)
        return ((self.x[i], self.y[i]) for i in order.split(BATCH))


def non_private_row(data: TensorDataset, device: torch.device) -> tuple:
    model = _model(device)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    return model, _epoch(model, opt, _Batches(data))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(build: Callable[[], tuple], device: torch.device, xt, yt) -> tuple[float, float]:
    """(median seconds per epoch after the first, test accuracy after the last epoch)."""
    model, epoch = build()
    times = []
    for _ in range(EPOCHS):
        _sync(device)
        t0 = time.perf_counter()
        epoch()
        _sync(device)
        times.append(time.perf_counter() - t0)
    model.eval()
    with torch.no_grad():
        acc = float((model(xt).argmax(1) == yt).float().mean())
    return statistics.median(times[1:] or times), acc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help=HELP)
    ap.add_argument("--device", default="auto", help="auto (CUDA when available), cpu, cuda[:k]")
    args = ap.parse_args()
    require("opacus")
    device = torch.device(
        ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    )
    warnings.simplefilter("ignore")
    data, xt, yt = _data(device)
    n = len(data)
    q = BATCH / n
    steps = math.ceil(EPOCHS / q)
    sigma = calibrate_noise_multiplier(
        target_epsilon=EPSILON, delta=DELTA, sample_rate=q, steps=steps, accountant="pld")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
    print(f"device: {device} ({name}), torch {torch.__version__}; "
          f"N = {n}, batch {BATCH}, {EPOCHS} epochs ({steps} steps), σ = {sigma:.4f} "
          f"(ε = {EPSILON}, δ = {DELTA}, PLD)")  # fmt: skip
    rows = {
        "non-private": lambda: non_private_row(data, device),
        "dpfy (default: secure noise)": lambda: dpfy_row(data, device, sigma, None),
        "dpfy seed=0": lambda: dpfy_row(data, device, sigma, 0),
        "opacus hooks": lambda: opacus_row(data, device, sigma),
    }
    results = {label: measure(build, device, xt, yt) for label, build in rows.items()}
    base = results["non-private"][0]
    print("\n| row | s per epoch | × non-private | test accuracy |\n|---|---:|---:|---:|")
    for label, (sec, acc) in results.items():
        print(f"| {label} | {sec:.3f} | {sec / base:.2f} | {100 * acc:.2f} % |")


if __name__ == "__main__":
    main()
