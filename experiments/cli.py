"""``python -m experiments NAME``: run a paper reproduction and write its tables and plots.

Run from the root of a dpfy checkout (the reproductions are not part of the installed package;
their extra requirements are in ``experiments/requirements.txt``). Names: ``dynamic-fmnist``
(Dynamic DP-SGD, Du et al. 2021, Table 1, on Fashion-MNIST), ``noise-decay-fmnist`` (the
noise-decay comparison), ``all`` (both), and ``oso-fmnist``, ``idp-fmnist``, ``lr-fmnist``,
each with its own options. Results go to ``experiments/<name>/results/`` unless ``--out`` says
otherwise: ``results.jsonl`` (resumable: finished runs are skipped), a progress log, the tables
(``*.md``) and plots (``*.png``). ``--summarize`` only rebuilds tables and plots.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from experiments.dynamic_fmnist.grids import EXPERIMENTS, build_grid
from experiments.dynamic_fmnist.summary import summarize
from experiments.idp_fmnist import main as idp_fmnist
from experiments.lr_fmnist import main as lr_fmnist
from experiments.oso_fmnist import main as oso_fmnist
from experiments.runner import run_grid

__all__ = ["build_parser", "main", "results_dir"]

HERE = Path(__file__).resolve().parent
OWN_RUNNERS = {"oso-fmnist": oso_fmnist.main, "idp-fmnist": idp_fmnist.main,
               "lr-fmnist": lr_fmnist.main}


def results_dir(name: str) -> Path:
    """Where a reproduction's results are kept: ``experiments/<name>/results``."""
    folder = "dynamic_fmnist" if name in (*EXPERIMENTS, "all") else name.replace("-", "_")
    return HERE / folder / "results"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m experiments", description=__doc__.splitlines()[0])
    p.add_argument("name", choices=sorted(EXPERIMENTS) + sorted(OWN_RUNNERS) + ["all"])
    p.add_argument("--seeds", type=int, default=3, help="seeds per cell (default 3)")
    p.add_argument("--epochs", type=int, default=3, help="epochs per run (default 3)")
    p.add_argument("--workers", type=int, default=1, help="parallel processes (1 thread each)")
    p.add_argument("--out", default=None,
                   help="output directory (default: experiments/<name>/results)")
    p.add_argument("--data-dir", default=None, help="Fashion-MNIST IDX directory")
    p.add_argument("--summarize", action="store_true", help="only rebuild tables and plots")
    oso_fmnist.add_arguments(p)
    idp_fmnist.add_arguments(p)
    lr_fmnist.add_arguments(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.out is None:
        args.out = str(results_dir(args.name))
    if args.name in OWN_RUNNERS:
        return OWN_RUNNERS[args.name](args)
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
