"""``python -m experiments idp-fmnist``: individualized privacy budgets on Fashion-MNIST (issue 13).

Monir, Fauzan & Ghinita 2023 (the review), §6.2: for each case of Table 9 (privacy
groups of 34 %, 43 %, 23 % of the data), uniform DP-SGD at the strictest budget and at the
fraction-weighted budget, IDP-SGD Sample and IDP-SGD Scale, on the tanh CNN
(:mod:`experiments.idp_fmnist.spec`, :mod:`experiments.idp_fmnist.train`).

Runs are ordered replicate-major (replicate 0 of every case and variant first). Each finished
run is appended to ``OUT/idp_fmnist.jsonl`` (no seed in it); a run whose key is already there is
skipped, so an interrupted grid resumes. Progress goes to ``OUT/idp_fmnist_progress.log``; the
summary (``OUT/idp_fmnist_table.md``, ``OUT/idp_<case>_<variant>_epsilon.png``) is rebuilt from
the results file at the end or with ``--summarize``.

Shared options keep their meaning (``--seeds`` = replicates, ``--epochs``, ``--workers``,
``--out``, ``--data-dir``, ``--summarize``); this experiment's own start with ``--idp-``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Iterator

import torch
from torch.utils.data import TensorDataset

from dpfy.data import load_dataset
from experiments.idp_fmnist.report import summarize
from experiments.idp_fmnist.spec import CASES, VARIANTS, IdpSpec
from experiments.idp_fmnist.train import train_idp
from experiments.runner import in_workers, load_results, run_pending

__all__ = ["add_arguments", "main", "build_specs", "run_specs", "RESULTS", "LOG"]

RESULTS = "idp_fmnist.jsonl"
LOG = "idp_fmnist_progress.log"

_DATA: Any = None


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``--idp-*`` options (defaults: the MNIST settings inferred from the
    review's §6.2 numbers, Cases 1 and 3)."""
    g = p.add_argument_group("idp-fmnist only")
    d = IdpSpec.of_case("case1", VARIANTS[0])
    g.add_argument("--idp-cases", nargs="+", choices=sorted(CASES), default=["case1", "case3"])
    g.add_argument("--idp-variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    g.add_argument("--idp-batch-size", type=int, default=d.batch_size)
    g.add_argument("--idp-train-size", type=int, default=d.train_size)
    g.add_argument("--idp-test-size", type=int, default=d.test_size)
    g.add_argument("--idp-lr", type=float, default=d.lr)
    g.add_argument("--idp-clip", type=float, default=d.clip)
    g.add_argument("--idp-accountant", choices=("rdp", "pld"), default=d.accountant,
                   help="calibration accountant (the paper's: rdp); ε is reported by both")


def build_specs(args: argparse.Namespace) -> list[IdpSpec]:
    """Every run the options ask for, replicate-major."""
    common = dict(epochs=args.epochs, batch_size=args.idp_batch_size,
                  train_size=args.idp_train_size, test_size=args.idp_test_size, lr=args.idp_lr,
                  clip=args.idp_clip, accountant=args.idp_accountant)
    return [IdpSpec.of_case(case, variant, replicate=rep, **common)
            for rep in range(args.seeds) for case in args.idp_cases
            for variant in args.idp_variants]


def _load_fmnist(spec: IdpSpec, data_dir: str | None) -> tuple:
    """(train, test): the first train_size / test_size Fashion-MNIST images."""
    full = load_dataset("fashion_mnist", data_dir=data_dir)
    return (TensorDataset(*(t[:spec.train_size] for t in full.train.tensors)),
            TensorDataset(*(t[:spec.test_size] for t in full.test.tensors)))


def _init_worker(spec_dict: dict, data_dir: str | None, data: tuple | None) -> None:
    global _DATA
    torch.set_num_threads(1)
    _DATA = data if data is not None else _load_fmnist(IdpSpec.from_dict(spec_dict), data_dir)


def _work(spec_dict: dict) -> dict:
    return train_idp(IdpSpec.from_dict(spec_dict), *_DATA)


def _records(todo: list[IdpSpec], workers: int, data_dir: str | None,
             data: tuple | None) -> Iterator[dict]:
    """Records of ``todo`` as they finish: in this process, or in forked workers."""
    return in_workers(todo, workers, _init_worker, _work, (todo[0].to_dict(), data_dir, data))


def run_specs(specs: list[IdpSpec], *, results: Path, log: Path, workers: int = 1,
              data_dir: str | None = None, data: tuple | None = None) -> list[dict]:
    """Train every spec whose key is not in ``results`` yet, appending each record as it ends.

    ``data`` = (train, test) TensorDatasets replaces Fashion-MNIST (tests use tiny ones).
    """
    def describe(rec: dict) -> str:
        sp = rec["spec"]
        eps = ", ".join(f"{g['epsilon_pld']:.3f}/{g['budget']:g}" for g in rec["groups"])
        return (f"{sp['case']} {sp['variant']} rep {sp['replicate']}: test acc "
                f"{rec['test_accuracy']:.2f}%, group ε (PLD)/budget {eps}")

    return run_pending(specs, results=results, log=log, workers=workers,
                       records=lambda todo: _records(todo, workers, data_dir, data),
                       describe=describe)


def main(args: argparse.Namespace) -> int:
    """Run (unless ``--summarize``) and summarize; print the files written."""
    out = Path(args.out)
    if not args.summarize:
        run_specs(build_specs(args), results=out / RESULTS, log=out / LOG,
                  workers=args.workers, data_dir=args.data_dir)
    for path in summarize(load_results(out / RESULTS), out):
        print(f"wrote {path}")
    return 0
