"""Does a fixed-noise proxy at B' = B/16 rank learning rates as the batch-B run does?

Sander et al. 2023 ("TAN without a burn", §3) tune at a small batch B' with σ' = σ·B'/B and the
same number of steps S, so the noise on the average gradient, Σ̄ = σC/B, is the large run's.
This script runs ``dpfy tune --recipe guide``'s search-3 probes (:func:`dpfy.train.probe.run_probe`)
on Fashion-MNIST for a few learning rates at B and at B', scores each on a validation split held
out of the training set (never the test set), and reports Spearman's ρ and Kendall's τ between
the two rankings. σ is calibrated so that the batch-B run on the whole training split spends the
target ε (PLD), as the recipe does.

    nice -n 10 python experiments/tan_ranking/run.py --out experiments/tan_ranking/results.jsonl

Each finished probe is appended to ``--out`` (one JSON line); an interrupted run resumes.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from scipy import stats

from dpfy.data import load_dataset
from dpfy.train.config import TrainConfig, resolve
from dpfy.train.grid import validation_split
from dpfy.train.probe import Probe, run_probe
from dpfy.train.recipe import final_noise_multiplier, tan_noise_multiplier
from dpfy.sampling import PoissonSampler


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="logreg")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--tan-batch-size", type=int, default=64)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--lrs", type=float, nargs="+", default=[0.1, 0.3, 1.0, 3.0, 10.0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--epsilon", type=float, default=3.0)
    ap.add_argument("--validation-fraction", type=float, default=0.1)
    ap.add_argument("--out", default="experiments/tan_ranking/results.jsonl")
    ap.add_argument("--summarize", action="store_true", help="print the tables only")
    args = ap.parse_args()
    out = Path(args.out)
    done = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    if not args.summarize:
        _run(args, out, done)
        done = [json.loads(line) for line in out.read_text().splitlines()]
    _summarize(done)


def _run(args, out: Path, done: list[dict]) -> None:
    torch.set_num_threads(1)
    data = load_dataset("fashion_mnist")
    # The validation split is drawn with a public seed (0) so that every probe sees the same one.
    base = TrainConfig(
        dataset="fashion_mnist",
        model=args.model,
        epochs=args.epochs,
        batch_size=args.batch_size,
        clip=args.clip,
        epsilon=args.epsilon,
        seed=0,
        threads=1,
    )
    held, _ = validation_split(data, base, args.validation_fraction)
    cfg, _ = resolve(base, num_examples=data.num_train, reference_delta=data.reference_delta)
    assert cfg.delta is not None
    sampler = PoissonSampler(data.num_train, sample_rate=args.batch_size / data.num_train)
    steps = args.epochs * sampler.steps_per_epoch
    sigma = final_noise_multiplier(cfg, cfg.delta, sampler.sample_rate, steps, data.num_train)
    sigma_tan = tan_noise_multiplier(sigma, args.batch_size, args.tan_batch_size)
    print(f"σ = {sigma:.4f} at B = {args.batch_size}; σ' = {sigma_tan:.5f} at B' = "
          f"{args.tan_batch_size}; {steps} steps; δ = {cfg.delta:g}", flush=True)
    seen = {(r["seed"], r["batch_size"], r["lr"]) for r in done}
    for seed in args.seeds:
        for batch, noise in ((args.tan_batch_size, sigma_tan), (args.batch_size, sigma)):
            for lr in args.lrs:
                if (seed, batch, lr) in seen:
                    continue
                t0 = time.monotonic()
                probe = Probe(lr=lr, clip=args.clip, noise_multiplier=noise, batch_size=batch,
                              steps=steps)
                r = run_probe(
                    TrainConfig(**{**cfg.to_dict(), "seed": seed}),
                    probe, held.train, held.test, input_shape=data.input_shape,
                    num_classes=data.num_classes, delta=cfg.delta,
                )
                row = {
                    "seed": seed, "model": args.model, "epochs": args.epochs, "steps": steps,
                    "batch_size": batch, "noise_multiplier": noise, "clip": args.clip,
                    "lr": lr, "val_accuracy": r.accuracy, "val_loss": r.loss,
                    "epsilon_alone": r.epsilon, "accountant": r.accountant,
                    "delta": cfg.delta, "seconds": round(time.monotonic() - t0, 1),
                }
                with out.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                print(row, flush=True)


def _summarize(rows: list[dict]) -> None:
    by: dict[tuple, dict[float, list[float]]] = {}
    for r in rows:
        by.setdefault((r["batch_size"],), {}).setdefault(r["lr"], []).append(r["val_accuracy"])
    sizes = sorted(k[0] for k in by)
    if len(sizes) < 2:
        print("need both batch sizes")
        return
    small, big = by[(sizes[0],)], by[(sizes[-1],)]
    lrs = sorted(set(small) & set(big))
    print(f"| lr | val acc B'={sizes[0]} | val acc B={sizes[-1]} |")
    print("|---|---|---|")
    for lr in lrs:
        print(f"| {lr:g} | {np.mean(small[lr]):.4f} | {np.mean(big[lr]):.4f} |")
    a = [np.mean(small[lr]) for lr in lrs]
    b = [np.mean(big[lr]) for lr in lrs]
    rho = stats.spearmanr(a, b).statistic
    tau = stats.kendalltau(a, b).statistic
    print(f"Spearman ρ = {rho:.3f}, Kendall τ = {tau:.3f}; best lr at B' = "
          f"{lrs[int(np.argmax(a))]:g}, at B = {lrs[int(np.argmax(b))]:g}")
    for seed in sorted({r["seed"] for r in rows}):
        s = {(r["batch_size"], r["lr"]): r["val_accuracy"] for r in rows if r["seed"] == seed}
        if all((sz, lr) in s for sz in sizes for lr in lrs):
            a = [s[(sizes[0], lr)] for lr in lrs]
            b = [s[(sizes[-1], lr)] for lr in lrs]
            print(f"seed {seed}: Spearman ρ = {stats.spearmanr(a, b).statistic:.3f}, "
                  f"Kendall τ = {stats.kendalltau(a, b).statistic:.3f}")


if __name__ == "__main__":
    main()
