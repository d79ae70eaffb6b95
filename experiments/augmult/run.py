"""Augmentation multiplicity and parameter averaging on Fashion-MNIST (issue 28 §3-4).

The end-to-end tanh CNN (dpfy's default recipe: batch 2048, SGD lr 4 momentum 0.9, C = 0.1,
ε = 3, δ = 1e-5, PLD) against the same recipe with augmentation multiplicity K (random crops,
optionally flips) and an EMA of the parameters, shortened to fit a shared 2-core machine.

  phase "val":  train on 50,000 training images, evaluate on the other 10,000 (a fixed public
                split of the training set, permutation seed 0): this chooses the augmentation.
  phase "test": train on all 60,000, evaluate on the test set, once per configuration.

Every run spends ε = 3 (σ calibrated for its own length and N). Each run's raw and EMA
accuracy come from the same run (the EMA is post-processing, evaluated beside the weights).

  PYTHONPATH=src nice -n 10 python experiments/augmult/run.py --phase val --epochs 8 \\
      --configs k1,k4crop,k4flip --out experiments/augmult/results
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
from torch.utils.data import Subset

from dpfy.data import load_dataset
from dpfy.data.splits import DataSplits
from dpfy.train.config import TrainConfig
from dpfy.train.trainer import train

CONFIGS = {
    "k1": dict(augmult=1),
    "k2crop": dict(augmult=2, augment="crop", augment_padding=2),
    "k4crop": dict(augmult=4, augment="crop", augment_padding=2),
    "k4flip": dict(augmult=4, augment="crop_flip", augment_padding=2),
}
VALIDATION = 10_000  # images of the training set held out in phase "val"


def validation_splits(data: DataSplits) -> DataSplits:
    """Train on 50,000 training images, 'test' on the other 10,000 (never the test set)."""
    order = np.random.default_rng(0).permutation(len(data.train))  # type: ignore[arg-type]
    val, fit = order[:VALIDATION].tolist(), order[VALIDATION:].tolist()
    return DataSplits(
        name=data.name,
        train=Subset(data.train, fit),
        test=Subset(data.train, val),
        input_shape=data.input_shape,
        num_classes=data.num_classes,
        description=f"{data.description}; 50,000 of its training images (validation run)",
        reference_delta=data.reference_delta,
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--phase", choices=("val", "test"), required=True)
    p.add_argument("--epochs", type=int, required=True)
    p.add_argument("--configs", default="k1,k4crop,k4flip")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--ema", type=float, default=0.999)
    p.add_argument("--out", default="experiments/augmult/results")
    args = p.parse_args()
    data = load_dataset("fashion_mnist")
    if args.phase == "val":
        data = validation_splits(data)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in args.configs.split(","):
        cfg = TrainConfig(
            epochs=args.epochs, seed=args.seed, threads=args.threads, ema=args.ema,
            **CONFIGS[name],  # type: ignore[arg-type]
        )
        start = time.time()
        with tempfile.TemporaryDirectory() as tmp:
            result = train(cfg, out=Path(tmp) / "run", data=data, progress=False,
                           echo=lambda *_: None)
            metrics = json.loads((result.out / "metrics.json").read_text())
        last = metrics[-1] if isinstance(metrics, list) else metrics
        row = {
            "phase": args.phase, "config": name, "epochs": args.epochs, "seed": args.seed,
            "epsilon": result.epsilon, "delta": result.delta,
            "acc": result.test_acc, "acc_ema": last.get("test_acc_ema") if isinstance(
                last, dict) else None,
            "wall_s": round(time.time() - start, 1), **CONFIGS[name],
        }
        print(json.dumps(row), flush=True)
        with open(out / f"{args.phase}.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
