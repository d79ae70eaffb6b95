"""``dpfy experiment NAME``: run a reproduction grid and write its tables and plots.

Names: ``dynamic-fmnist`` (seed 001 Table 1, Fashion-MNIST), ``noise-decay-fmnist`` (review
Table 8 style comparison), ``all``. Results go to ``OUT/results.jsonl`` (resumable: finished
runs are skipped), progress to ``OUT/progress.log``, the tables to ``OUT/*.md`` and plots to
``OUT/*.png``. ``--summarize`` only rebuilds tables and plots from the results file.
``oso-fmnist`` (seed 002's Fashion-MNIST comparison; not part of ``all``) has its own options
and files: :mod:`dpfy.experiments.oso_fmnist`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from dpfy.experiments import idp_fmnist, lr_fmnist, oso_fmnist
from dpfy.experiments.grids import EXPERIMENTS, build_grid
from dpfy.experiments.runner import run_grid
from dpfy.experiments.summary import summarize

__all__ = ["register", "run"]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("experiment", help="run a paper reproduction (tables + plots)",
                              description=__doc__.splitlines()[0])
    p.add_argument("name", choices=sorted(EXPERIMENTS) + ["oso-fmnist", "idp-fmnist", "lr-fmnist",
                                                       "all"])
    p.add_argument("--seeds", type=int, default=3, help="seeds per cell (default 3)")
    p.add_argument("--epochs", type=int, default=3, help="epochs per run (default 3)")
    p.add_argument("--workers", type=int, default=1, help="parallel processes (1 thread each)")
    p.add_argument("--out", default="docs/results", help="output directory")
    p.add_argument("--data-dir", default=None, help="Fashion-MNIST IDX directory")
    p.add_argument("--summarize", action="store_true", help="only rebuild tables and plots")
    oso_fmnist.add_arguments(p)
    idp_fmnist.add_arguments(p)
    lr_fmnist.add_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.name == "oso-fmnist":
        return oso_fmnist.main(args)
    if args.name == "idp-fmnist":
        return idp_fmnist.main(args)
    if args.name == "lr-fmnist":
        return lr_fmnist.main(args)
    out = Path(args.out)
    names = sorted(EXPERIMENTS) if args.name == "all" else [args.name]
    if not args.summarize:
        specs = [s for n in names for s in build_grid(n, seeds=args.seeds, epochs=args.epochs)]
        print(f"{len(specs)} runs; progress in {out / 'progress.log'}")
        run_grid(specs, results=out / "results.jsonl", log=out / "progress.log",
                 workers=args.workers, data_dir=args.data_dir)
    for path in summarize(out / "results.jsonl", out):
        print(f"wrote {path}")
    return 0
