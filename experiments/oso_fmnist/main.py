"""``python -m experiments oso-fmnist``: the Fashion-MNIST comparison of
Galli, Palamidessi & Cucinotta 2024 at a CPU scale.

Online (OSO-DPSGD) vs FixedThreshold (DP-SGD) vs FixedQuantile vs AdamWOSM vs NoDP, each
method tuned on its own grid under a per-grid budget (:mod:`experiments.oso_fmnist.grid`), every
run accounted by PLD from its own ledger (:mod:`experiments.oso_fmnist.train`). Galli et al.
2024, Experiments section: the grid-search protocol, Table 3 and the findings of Figure 4.

Phases (each resumable: a run whose key is already in the results file is skipped):

1. ``grid``: replicate 0 of every configuration of every method at every ε (ε in the order
   given, so the first ε's are complete first), and NoDP's grid once;
2. ``seeds``: the winning configuration of each (method, ε) (best replicate-0 value) again,
   replicates 1 … seeds−1;
3. ``report``: tables, plots (:mod:`experiments.oso_fmnist.report`) and, with ``--diagnostic``,
   the Figure-1 cosine diagnostic (:mod:`experiments.oso_fmnist.cosine`).

``--methods`` restricts phases 1 and 2 to some methods (e.g. ``--k 7 --methods online``).

Files in ``--out``: ``oso_fmnist.jsonl`` (one record per run of every task and k: each record's
key hashes its whole spec, settings included, so they never collide; no seed in it),
``oso_fmnist_progress.log``, and per (task, k) ``<stem>_tables.md`` and ``<stem>_*.png``
(:func:`experiments.oso_fmnist.report.stem`).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import torch
from torch.utils.data import TensorDataset

from dpfy.data import load_dataset
from experiments.oso_fmnist.cosine import cosine_figure
from experiments.oso_fmnist.grid import (METHODS, PRIVATE_METHODS, RunSpec, Settings, grid,
                                       grid_noise_multiplier)
from experiments.oso_fmnist.report import summarize
from experiments.oso_fmnist.train import lower_is_better, train_spec
from experiments.runner import load_results as load_records

__all__ = ["add_arguments", "main", "grid_specs", "seed_specs", "run_specs", "load_records",
           "winners", "RESULTS", "LOG"]

RESULTS = "oso_fmnist.jsonl"
LOG = "oso_fmnist_progress.log"
PHASES = ("grid", "seeds", "report", "all")

_DATA: Any = None


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``oso-fmnist`` (the shared ``--seeds/--epochs/--workers/--out/--data-dir
    /--summarize`` keep their meaning: seeds = replicates of each winner)."""
    g = p.add_argument_group("oso-fmnist only")
    d = Settings()
    g.add_argument("--task", choices=("autoencoder", "classifier"), default=d.task)
    g.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 3.0, 2.0, 4.0],
                   help="grid budgets, run in this order (default 1 3 2 4)")
    g.add_argument("--k", type=int, default=d.k, help="grid granularity (default 5)")
    g.add_argument("--methods", choices=METHODS, nargs="+", default=list(METHODS),
                   help="run only these methods' grids and winners (default: all five); "
                        "e.g. --k 7 --methods online for 002's k = 7 Online grid alone")
    g.add_argument("--train-size", type=int, default=d.train_size)
    g.add_argument("--test-size", type=int, default=d.test_size)
    g.add_argument("--batch-size", type=int, default=d.batch_size)
    g.add_argument("--delta", type=float, default=d.delta)
    g.add_argument("--hyper-rate", type=float, default=None,
                   help="Online's ρ_c = ρ_r (default: 2.5e-3 × 1172 / T)")
    g.add_argument("--eval-every", type=int, default=d.eval_every)
    g.add_argument("--phase", choices=PHASES, default="all")
    g.add_argument("--diagnostic", action="store_true",
                   help="also draw the Figure-1 cosine-vs-C diagnostic")


def settings_from(args: argparse.Namespace) -> Settings:
    return Settings(task=args.task, train_size=args.train_size, test_size=args.test_size,
                    batch_size=args.batch_size, epochs=args.epochs, k=args.k, delta=args.delta,
                    hyper_rate=args.hyper_rate, eval_every=args.eval_every)


def grid_specs(settings: Settings, epsilons: Iterable[float],
               methods: Iterable[str] = METHODS) -> list[RunSpec]:
    """Phase 1: every configuration of ``methods`` at every ε (replicate 0), then NoDP's grid
    (if ``methods`` has it)."""
    chosen = set(methods)
    out = [s for eps in epsilons for m in PRIVATE_METHODS if m in chosen
           for s in grid(m, float(eps), settings)]
    return out + (grid("nodp", None, settings) if "nodp" in chosen else [])


def winners(records: list[dict], settings: Settings) -> dict[tuple, RunSpec]:
    """(method, ε) → the replicate-0 configuration with the best value (diverged: never)."""
    sign = 1.0 if lower_is_better(settings) else -1.0
    best: dict[tuple, tuple[float, RunSpec]] = {}
    for r in records:
        spec = RunSpec.from_dict(r["spec"])
        if spec.settings != settings or spec.replicate != 0 or r["best"] is None:
            continue
        cell = (spec.method, spec.epsilon)
        if cell not in best or sign * r["best"] < best[cell][0]:
            best[cell] = (sign * r["best"], spec)
    return {cell: spec for cell, (_, spec) in best.items()}


def seed_specs(records: list[dict], settings: Settings, seeds: int,
               methods: Iterable[str] = METHODS) -> list[RunSpec]:
    """Phase 2: replicates 1 … seeds−1 of the winner of every (method, ε) of ``methods``."""
    chosen = set(methods)
    return [replace(spec, replicate=i) for spec in winners(records, settings).values()
            if spec.method in chosen for i in range(1, seeds)]


def _init_worker(settings: Settings, data_dir: str | None) -> None:
    global _DATA
    torch.set_num_threads(1)
    full = load_dataset("fashion_mnist", data_dir=data_dir)
    _DATA = (TensorDataset(*(t[:settings.train_size] for t in full.train.tensors)),
             TensorDataset(*(t[:settings.test_size] for t in full.test.tensors)))


def _work(spec_dict: dict) -> dict:
    return train_spec(RunSpec.from_dict(spec_dict), *_DATA)


def run_specs(specs: list[RunSpec], *, results: Path, log: Path, workers: int = 1,
              data_dir: str | None = None, data: tuple | None = None) -> list[dict]:
    """Train every spec whose key is not yet in ``results``; append each record as it ends.

    ``workers`` > 1: that many forked processes, one torch thread each, each loading
    Fashion-MNIST; ``workers == 1``: in this process, on ``data`` = (train, test) if given
    (tests pass a tiny synthetic set) or else on Fashion-MNIST.
    """
    results.parent.mkdir(parents=True, exist_ok=True)
    done = {r["key"] for r in load_records(results)}
    todo = [s for s in dict.fromkeys(specs) if s.key() not in done]
    say = _logger(log)
    if not todo:
        return load_records(results)
    for spec in todo:                       # calibrate in the parent: workers fork the cache
        if spec.epsilon is not None:
            grid_noise_multiplier(spec)
    say(f"{len(todo)} runs to do ({len(done)} already in {results}), {workers} worker(s)")
    t0 = time.time()
    for i, rec in enumerate(_records(todo, workers, data_dir, data), 1):
        with results.open("a") as f:
            f.write(json.dumps(rec) + "\n")
        sp = rec["spec"]
        say(f"[{i}/{len(todo)}] {sp['method']} eps={sp['epsilon']} lr={sp['lr']:.4g} "
            f"C={sp['clip']} q={sp['quantile']} rep={sp['replicate']}: best={rec['best']} "
            f"eps_grid_pld={rec.get('epsilon_grid_pld')} "
            f"{'DIVERGED ' if rec['diverged'] else ''}({rec['seconds']:.0f}s; "
            f"elapsed {time.time() - t0:.0f}s)")
    return load_records(results)


def _records(todo: list[RunSpec], workers: int, data_dir: str | None,
             data: tuple | None) -> Iterator[dict]:
    """The records of ``todo`` as they finish (in this process, or from a pool)."""
    global _DATA
    if workers == 1:
        if data is None:
            _init_worker(todo[0].settings, data_dir)
        else:
            _DATA = data
        yield from (_work(s.to_dict()) for s in todo)
        return
    ctx = mp.get_context("fork")
    with ctx.Pool(workers, initializer=_init_worker,
                  initargs=(todo[0].settings, data_dir)) as pool:
        yield from pool.imap_unordered(_work, [s.to_dict() for s in todo])


def _logger(log: Path) -> Callable[[str], None]:
    def say(msg: str) -> None:
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("a") as f:
            f.write(f"{time.strftime('%H:%M:%S')} {msg}\n")
    return say


def main(args: argparse.Namespace) -> int:
    """Run the phases ``args.phase`` asks for; print the files written."""
    out = Path(args.out)
    settings = settings_from(args)
    results, log = out / RESULTS, out / LOG
    phase = "report" if args.summarize else args.phase
    kw = dict(results=results, log=log, workers=args.workers, data_dir=args.data_dir)
    if phase in ("grid", "all"):
        specs = grid_specs(settings, args.epsilons, args.methods)
        print(f"grid: {len(specs)} runs; progress in {log}")
        run_specs(specs, **kw)
    if phase in ("seeds", "all"):
        specs = seed_specs(load_records(results), settings, args.seeds, args.methods)
        print(f"seeds: {len(specs)} runs; progress in {log}")
        run_specs(specs, **kw)
    if phase in ("report", "all"):
        for path in summarize(load_records(results), settings, out):
            print(f"wrote {path}")
        if args.diagnostic:
            for path in cosine_figure(settings, out, data_dir=args.data_dir):
                print(f"wrote {path}")
    return 0
