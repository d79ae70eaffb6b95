"""Scattering + linear on Fashion-MNIST at ε = 3, δ = 1e-5: validation sweep and ablation.

    DPFY_CACHE_DIR=experiments/fmnist_accuracy/.cache PYTHONPATH=src \\
        nice -n 10 python experiments/fmnist_accuracy/run.py {val|test} NAME [NAME ...] \\
        [--seeds 0 1 2]

``val``: train on 50,000 training images, evaluate on the other 10,000 (a fixed public
permutation of the training set, torch seed 0); the test set is not loaded. ``test``: train on
all 60,000, evaluate once on the test set. Each run is ``dpfy train`` (the Python entry point
``dpfy.train.train``) with the configuration named below; one JSON line per run is appended to
``results_<split>.jsonl`` beside this file.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.data import Subset

from dpfy.data import DataSplits, load_dataset
from dpfy.train import TrainConfig
from dpfy.train.trainer import train

HERE = Path(__file__).parent
# Tramèr & Boneh 2021's ScatterNet + linear recipe for Fashion-MNIST, with the values their
# repository's README gives (ftramer/Handcrafted-DP, "ScatterNet models"): batch 8192, lr 16,
# GroupNorm with 27 groups, σ = 4.05 (RDP, for 40 epochs at ε = 3, δ = 1e-5), and the
# defaults of its script: SGD with momentum 0.9, C = 0.1, 40 epochs. An earlier session used
# lr 4 from memory: those rows are kept in results_test.jsonl as "lr4_recalled".
PUBLISHED = dict(dataset="fashion_mnist_scattering", model="scatter_linear", epsilon=3.0,
                 delta=1e-5, batch_size=8192, lr=16.0, momentum=0.9, clip=0.1, epochs=40,
                 accountant="rdp", threads=2)
PLD = {**PUBLISHED, "accountant": "pld", "ema": 0.999}
# The validation sweep, fixed before any run: the averaging decay, the batch size (at the
# published lr) and the learning rate (at the published batch), one at a time around PLD.
CONFIGS = {
    # σ = 4.05 exactly as the authors' README gives it: their RDP-to-(ε, δ) conversion is the
    # classic one, looser than dp_accounting's, so at the same ε = 3 it adds more noise than
    # "published" below (σ = 3.65 by dp_accounting's RDP). dpfy's ledger reports this run's ε.
    "published_sigma": {**PUBLISHED, "epsilon": None, "noise_multiplier": 4.05},
    "published": PUBLISHED,
    "pld_ema": PLD,
    "pld_ema99": {**PLD, "ema": 0.99},
    "pld_ema_b4096": {**PLD, "batch_size": 4096},
    "pld_ema_b16384": {**PLD, "batch_size": 16384},
    "pld_ema_lr8": {**PLD, "lr": 8.0},
    "pld_ema_lr32": {**PLD, "lr": 32.0},
}


def splits(which: str) -> DataSplits:
    data = load_dataset("fashion_mnist_scattering")
    if which == "test":
        return data
    order = torch.randperm(data.num_train, generator=torch.Generator().manual_seed(0))
    return DataSplits(name="fashion_mnist_scattering",   # the validation split of its train set
                      train=Subset(data.train, order[:50_000].tolist()),
                      test=Subset(data.train, order[50_000:].tolist()),
                      input_shape=data.input_shape, num_classes=data.num_classes,
                      description=data.description + "; 50,000 for training, 10,000 held out "
                      "from the training set for validation", reference_delta=1e-5)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("split", choices=["val", "test"])
    p.add_argument("names", nargs="+", choices=sorted(CONFIGS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0])
    args = p.parse_args()
    data = splits(args.split)
    for name in args.names:
        for seed in args.seeds:
            cfg = TrainConfig.from_mapping({**CONFIGS[name], "seed": seed})
            out = Path(tempfile.mkdtemp()) / "run"
            t0 = time.time()
            result = train(cfg, out=out, data=data, progress=False, echo=lambda s: None)
            summary = json.loads((out / "summary.json").read_text())
            row = {"split": args.split, "config": name, "seed": seed,
                   "epsilon": round(result.epsilon, 4), "test_acc": summary["test_acc"],
                   "test_acc_ema": summary.get("test_acc_ema"),
                   "wall_s": round(time.time() - t0, 1), "settings": CONFIGS[name]}
            print(json.dumps(row), flush=True)
            with open(HERE / f"results_{args.split}.jsonl", "a") as f:
                f.write(json.dumps(row) + "\n")
            shutil.rmtree(out.parent, ignore_errors=True)


if __name__ == "__main__":
    main()
