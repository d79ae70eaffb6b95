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

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from dpfy.data.fashion_mnist import MEAN, STD, load_fashion_mnist
from dpfy.layers import public_batchnorm

N_TRAIN, N_VAL, N_PUB = 10_000, 2_000, 2_000
BATCH, EPOCHS, C, DELTA = 500, 4, 1.0, 1e-5


def bn_cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, stride=2, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 10),
    )


def digits_public() -> torch.Tensor:
    """scikit-learn's bundled digits (no download), as 1x28x28 Fashion-MNIST-like inputs."""
    from sklearn.datasets import load_digits

    img = torch.from_numpy(load_digits().images.astype(np.float32) / 16.0)[:, None]
    img = F.interpolate(img, size=(28, 28), mode="bilinear", align_corners=False)
    return (img - MEAN) / STD


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
    xtr, ytr = data["train"]
    loader = DataLoader(TensorDataset(xtr, ytr), batch_size=BATCH)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, opt, loader = dpfy.make_private(
            model,
            opt,
            loader,
            target_epsilon=eps,
            target_delta=DELTA,
            epochs=EPOCHS,
            max_grad_norm=C,
            seed=seed,
        )
        for _ in range(EPOCHS):
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
    splits = load_fashion_mnist()
    x, y = splits.train.tensors
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    tr, va, pu = perm[:N_TRAIN], perm[N_TRAIN : N_TRAIN + N_VAL], perm[N_TRAIN + N_VAL :][:N_PUB]
    data = {"train": (x[tr], y[tr]), "val": (x[va], y[va]), "test": splits.test.tensors}
    public = {"pub-digits": digits_public(), "pub-split": x[pu]}
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
