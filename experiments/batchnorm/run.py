"""BatchNorm with public statistics against the GroupNorm swap on Fashion-MNIST (issue 38, 2).

A small BatchNorm CNN (two stride-2 3x3 convolutions, 16 and 32 channels, each followed by a
BatchNorm and ReLU, global average pooling, a linear layer) trained with DP-SGD on a subset of
Fashion-MNIST's training set at ε ∈ {0.1, 0.5, 3}, δ = 1e-5, in three forms:

  gn           every BatchNorm swapped for GroupNorm by dpfy.validate(fix=True) (today's fix);
  pub-digits   dpfy.layers.public_batchnorm with scikit-learn's bundled digits (1,797 8x8
               images, upscaled to 28x28 bilinearly, scaled to [0, 1] and standardized with
               Fashion-MNIST's public constants): a disjoint public dataset shipped offline;
  pub-split    the same with 2,000 Fashion-MNIST training images declared public (disjoint
               from the private and validation rows): an assumption that such a split exists.

Splits of the 60,000 training images, one fixed permutation (seed 0): private train = the first
N_TRAIN, validation = the next 2,000, public split = the next 2,000. The learning rate is chosen
per (form, ε) on validation (seed 0); the test set is then read once per (form, ε, seed) with
that learning rate. σ is calibrated (PLD) for each run's own length, so every run spends ε.

  PYTHONPATH=src nice -n 10 python experiments/batchnorm/run.py --out experiments/batchnorm/results
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from dpfy.data.fashion_mnist import MEAN, STD, load_fashion_mnist
from dpfy.data.public_digits import digits_images
from dpfy.layers import public_batchnorm
from dpfy.models.batchnorm_cnn import batchnorm_cnn

N_TRAIN, N_VAL, N_PUB = 10_000, 2_000, 2_000
BATCH, EPOCHS, C, DELTA = 500, 4, 1.0, 1e-5


def bn_cnn() -> nn.Module:
    """The BatchNorm CNN of the module docstring (dpfy.models.batchnorm_cnn) for 1x28x28."""
    return batchnorm_cnn((1, 28, 28), 10)


def digits_public() -> torch.Tensor:
    """scikit-learn's bundled digits (no download), as 1x28x28 Fashion-MNIST-like inputs."""
    return digits_images(28, 28, mean=MEAN, std=STD)


def splits() -> tuple[dict, torch.Tensor]:
    """The private train, validation and test sets of the module docstring, and the training
    images after the validation ones (the public split takes its first N_PUB)."""
    fmnist = load_fashion_mnist()
    x, y = fmnist.train.tensors
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    tr, va = perm[:N_TRAIN], perm[N_TRAIN : N_TRAIN + N_VAL]
    data = {"train": (x[tr], y[tr]), "val": (x[va], y[va]), "test": fmnist.test.tensors}
    return data, x[perm[N_TRAIN + N_VAL :]]


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    with torch.no_grad():
        pred = torch.cat([model(xb).argmax(1) for xb in x.split(2000)])
    return float((pred == y).float().mean())


def train(form, eps, lr, seed, data, public):
    torch.manual_seed(seed)
    model = bn_cnn()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    if form == "gn":
        model = dpfy.validate(model, fix=True)
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    else:
        public_batchnorm(model, public[form], batch_size=256, description=form, seed=seed)
    return fit_private(model, opt, data["train"], eps, seed, batch=BATCH, epochs=EPOCHS)


def fit_private(model, opt, train, eps, seed, *, batch, epochs, attach: Callable | None = None):
    """make_private on ``train`` = (x, y) at (ε, DELTA), σ calibrated for ``epochs`` epochs of
    expected batch ``batch``, clip C; ``attach(opt)`` (the statistics' set-up) runs after it;
    then the DP-SGD steps. Returns the private model and optimizer."""
    loader = DataLoader(TensorDataset(*train), batch_size=batch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the seed warning
        model, opt, loader = dpfy.make_private(
            model,
            opt,
            loader,
            target_epsilon=eps,
            target_delta=DELTA,
            epochs=epochs,
            max_grad_norm=C,
            seed=seed,
        )
        if attach is not None:
            attach(opt)
        for _ in range(epochs):
            model.train()
            for x, y in loader:
                F.cross_entropy(model(x), y).backward()
                opt.step()
                opt.zero_grad()
    return model, opt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="experiments/batchnorm/results")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--lrs", default="0.5,1,2")
    args = ap.parse_args()
    torch.set_num_threads(1)
    data, rest = splits()
    public = {"pub-digits": digits_public(), "pub-split": rest[:N_PUB]}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    lrs = [float(v) for v in args.lrs.split(",")]
    for eps in (0.1, 0.5, 3.0):
        for form in ("gn", "pub-digits", "pub-split"):
            val = {}
            for lr in lrs:  # validation: seed 0
                t0 = time.process_time()
                model, opt = train(form, eps, lr, 0, data, public)
                val[lr] = accuracy(model, *data["val"])
                print(
                    f"val eps={eps} {form} lr={lr}: {val[lr]:.4f} "
                    f"sigma={opt.noise_multiplier:.3f} cpu={time.process_time() - t0:.1f}s",
                    flush=True,
                )
            best = max(val, key=val.get)
            tests = []
            for seed in range(args.seeds):  # the test set, once per seed at the chosen lr
                model, opt = train(form, eps, best, 100 + seed, data, public)
                tests.append(accuracy(model, *data["test"]))
            row = {
                "eps": eps,
                "form": form,
                "val": val,
                "lr": best,
                "test": tests,
                "test_mean": float(np.mean(tests)),
                "test_std": float(np.std(tests)),
                "epsilon_spent": opt.epsilon(DELTA),
            }
            print(json.dumps(row), flush=True)
            rows.append(row)
            (out / "results.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
