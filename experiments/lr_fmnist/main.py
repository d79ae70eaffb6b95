"""``python -m experiments lr-fmnist``: learning-rate methods and their baselines on Fashion-MNIST.

Issue 12's reproduction (:mod:`experiments.lr_fmnist.spec` says what a run is,
:mod:`experiments.lr_fmnist.baselines` what each method is, :mod:`experiments.lr_fmnist.train` how
a run is trained and accounted). Runs are ordered by priority: per replicate, comparison
000's σ = 2.0 runs first (Monir et al. 2023's review), then comparison 004's table (Bu & Liu
2025) per model and per ε in the order given
(``--lr-epsilons 3 inf 1 8``) in tiers of two ε values (3 and ∞, then 1 and 8), the HyFreeDP
rows of each tier last (its rule may change
during a session; each record keeps its git commit).

Each finished run is appended to ``OUT/lr_fmnist.jsonl`` (no seed in it); a run whose key is
there is skipped, so an interrupted grid resumes. ``--lr-until HH:MM`` (UTC) starts no run after
that time. Progress goes to ``OUT/lr_fmnist_progress.log``; the tables and plots
(:mod:`experiments.lr_fmnist.report`) are rebuilt from the results at the end or with
``--summarize``. Shared options keep their meaning (``--seeds`` = replicates, ``--epochs``,
``--workers``, ``--out``, ``--data-dir``, ``--summarize``); this experiment's own start with
``--lr-``.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import Any, Iterator

import torch
from torch.utils.data import TensorDataset

from dpfy.data import load_dataset
from experiments.lr_fmnist.report import summarize
from experiments.lr_fmnist.spec import FINITE_ONLY, METHODS_000, METHODS_004, NONDP_GS_GRID, LrSpec
from experiments.lr_fmnist.train import train_lr
from experiments.runner import in_workers, load_results, run_pending
from dpfy.train.config import DEFAULT_BATCH_SIZE

__all__ = ["add_arguments", "main", "build_specs", "run_specs", "RESULTS", "LOG"]

RESULTS = "lr_fmnist.jsonl"
LOG = "lr_fmnist_progress.log"
_DATA: Any = None
_UNTIL: float | None = None


def _epsilon(text: str) -> float | None:
    return None if text.lower() in ("inf", "∞") else float(text)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``--lr-*`` options (defaults: the scaled-down settings of experiments/lr_fmnist/README.md)."""
    g = p.add_argument_group("lr-fmnist only")
    d = LrSpec(comparison="004", method="default")
    g.add_argument("--lr-parts", nargs="+", choices=("000", "004"), default=["000", "004"])
    g.add_argument("--lr-epsilons", nargs="+", type=_epsilon, default=[3.0, None],
                   help="004's target ε values, 'inf' for non-private (default: 3 inf)")
    g.add_argument("--lr-models", nargs="+", choices=("tanh_cnn", "groupnorm_cnn"),
                   default=[d.model])
    g.add_argument("--lr-methods", nargs="+", choices=sorted(set(METHODS_004)),
                   default=list(METHODS_004), help="004's methods to run")
    g.add_argument("--lr-sigma", type=float, default=2.0, help="000's σ")
    g.add_argument("--lr-000-seeds", type=int, default=1, help="replicates of 000's comparison")
    g.add_argument("--lr-000-train-size", type=int, default=None,
                   help="000's training subset (default: --lr-train-size)")
    g.add_argument("--lr-000-batch-size", type=int, default=None,
                   help="000's expected batch (default: --lr-batch-size)")
    g.add_argument("--lr-000-epochs", type=int, default=None,
                   help="000's epochs (default: --epochs)")
    g.add_argument("--lr-batch-size", type=int, default=d.batch_size)
    g.add_argument("--lr-train-size", type=int, default=d.train_size)
    g.add_argument("--lr-test-size", type=int, default=d.test_size)
    g.add_argument("--lr-probe-every", type=int, default=d.probe_every, help="HyFreeDP's K")
    g.add_argument("--lr-until", default=None, help="HH:MM UTC: start no run after it")


def build_specs(args: argparse.Namespace) -> list[LrSpec]:
    """Every run the options ask for, in priority order (see the module docstring)."""
    # dpfy train's default batch (2048 of 60000) scaled to the subset: the same q per step
    default_batch = max(1, round(DEFAULT_BATCH_SIZE * args.lr_train_size / 60000))
    common = dict(epochs=args.epochs, train_size=args.lr_train_size,
                  test_size=args.lr_test_size, probe_every=args.lr_probe_every)
    sizes_000 = {"train_size": args.lr_000_train_size or args.lr_train_size,
                 "batch_size": args.lr_000_batch_size or args.lr_batch_size,
                 "epochs": args.lr_000_epochs or args.epochs}
    out: list[LrSpec] = []
    for rep in range(args.seeds):
        if "000" in args.lr_parts and rep < args.lr_000_seeds:
            out += [LrSpec(comparison="000", method=m, noise_multiplier=args.lr_sigma,
                           replicate=rep, **{**common, **sizes_000}) for m in METHODS_000]
        if "004" not in args.lr_parts:
            continue
        for model in args.lr_models:
            # priority tiers of two ε values each (3 and ∞, then 1 and 8): HyFreeDP last in each
            for tier in range(0, len(args.lr_epsilons), 2):
                cells = [spec for eps in args.lr_epsilons[tier:tier + 2]
                         for spec in _cell(args, model, eps, rep, default_batch, common)]
                out += [s for s in cells if s.method != "hyfree"] + [s for s in cells
                                                                      if s.method == "hyfree"]
    return out


def _cell(args: argparse.Namespace, model: str, eps: float | None, rep: int, default_batch: int,
          common: dict) -> list[LrSpec]:
    """004's runs of one (model, ε, replicate): every method, AdamW at each grid rate."""
    out = []
    for m in args.lr_methods:
        if m in FINITE_ONLY and eps is None:
            continue                                  # no ε = ∞ row (see lr_spec)
        lrs = NONDP_GS_GRID if m == "adamw" else (None,)
        out += [LrSpec(comparison="004", method=m, epsilon=eps, lr=lr, model=model,
                       batch_size=default_batch if m == "default" else args.lr_batch_size,
                       replicate=rep, **common) for lr in lrs]
    return out


def _init_worker(train_size: int, test_size: int, data_dir: str | None, data: tuple | None,
                 until: float | None) -> None:
    global _DATA, _UNTIL
    torch.set_num_threads(1)
    _UNTIL = until
    if data is not None:
        _DATA = data
        return
    full = load_dataset("fashion_mnist", data_dir=data_dir)
    _DATA = (TensorDataset(*(t[:train_size] for t in full.train.tensors)),
             TensorDataset(*(t[:test_size] for t in full.test.tensors)))


def _work(spec_dict: dict) -> dict | None:
    if _UNTIL is not None and time.time() > _UNTIL:
        return None                                           # past --lr-until: not started
    spec = LrSpec.from_dict(spec_dict)
    train, test = (TensorDataset(*(t[:size] for t in part.tensors))   # the spec's subsets
                   for part, size in zip(_DATA, (spec.train_size, spec.test_size)))
    return train_lr(spec, train, test)


def _records(todo: list[LrSpec], workers: int, init: tuple) -> Iterator[dict | None]:
    return in_workers(todo, workers, _init_worker, _work, init)


def _until(text: str | None) -> float | None:
    """``HH:MM`` UTC today (or tomorrow if already past by more than 12 h) as a timestamp."""
    if text is None:
        return None
    hh, mm = (int(v) for v in text.split(":"))
    now = time.time()
    day = now - now % 86400
    t = day + hh * 3600 + mm * 60
    return t + 86400 if t < now - 43200 else t


def run_specs(specs: list[LrSpec], *, results: Path, log: Path, workers: int = 1,
              data_dir: str | None = None, data: tuple | None = None,
              until: str | None = None) -> list[dict]:
    """Train every spec whose key is not in ``results`` yet, appending each record as it ends.

    ``data`` = (train, test) TensorDatasets replaces Fashion-MNIST (tests use tiny ones).
    """
    def records(todo: list[LrSpec]) -> Iterator[dict | None]:
        init = (max(s.train_size for s in todo), max(s.test_size for s in todo), data_dir,
                data, _until(until))
        return _records(todo, workers, init)

    return run_pending(specs, results=results, log=log, workers=workers, records=records,
                       describe=lambda rec: (
                           f"{LrSpec.from_dict(rec['spec']).label}: test acc "
                           f"{rec['test_accuracy']:.2f}%, ε (PLD) {_fmt(rec['epsilon_pld'])} "
                           f"at {rec['git_commit']}"))


def _fmt(eps: float) -> str:
    return "∞" if math.isinf(eps) else f"{eps:.3f}"


def main(args: argparse.Namespace) -> int:
    """Run (unless ``--summarize``) and summarize; print the files written."""
    out = Path(args.out)
    if not args.summarize:
        run_specs(build_specs(args), results=out / RESULTS, log=out / LOG,
                  workers=args.workers, data_dir=args.data_dir, until=args.lr_until)
    for path in summarize(load_results(out / RESULTS), out):
        print(f"wrote {path}")
    return 0
