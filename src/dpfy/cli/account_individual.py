"""``dpfy account --individual RUN``: per-example ε of a run from its recorded norms.

RUN is a directory holding ``ledger.json`` and ``per_example_norms.npz`` (written by
:meth:`dpfy.norm_tracker.NormTracker.save`), or the ``.npz`` itself with ``--ledger``. Prints
the quantiles, the correlation with the final training loss and the statement that these
values are data-dependent (an analysis, not a guarantee); ``--histogram FILE`` writes the plot.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from typing import Callable

import numpy as np

from dpfy._require import require
from dpfy.individual_tracking import NORMS_FILE
from dpfy.privacy.ledger import Ledger
from dpfy.privacy.per_example_accounting import DATA_DEPENDENT_WARNING, per_example_epsilons

__all__ = ["add_flags", "run_individual", "refuse_without_individual", "NORMS_FILE"]


def add_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("individual accounting (docs/individual_accounting.md)")
    g.add_argument(
        "--individual",
        metavar="RUN",
        help=f"per-example ε (data-dependent, not a guarantee) from RUN/{NORMS_FILE} and "
        "RUN/ledger.json, or from an .npz with --ledger",
    )
    g.add_argument("--rounding", type=float, metavar="R", help="round norm ratios up to R")
    g.add_argument(
        "--all-orders",
        action="store_true",
        default=None,
        help="compose each example's RDP at dp_accounting's fractional orders too (slower; "
        "the default integer orders give a bound a few percent larger)",
    )
    g.add_argument("--histogram", metavar="PNG", help="write the per-example ε histogram")


def refuse_without_individual(args: argparse.Namespace) -> None:
    """--rounding and --histogram mean nothing without --individual: refused, not ignored."""
    for name in ("rounding", "all_orders", "histogram"):
        require(
            getattr(args, name, None) is None,
            name,
            getattr(args, name, None),
            "unset without --individual",
            f"Add --individual RUN, or drop --{name.replace('_', '-')}",
        )


def run_individual(args: argparse.Namespace, load_ledger: Callable[[str], Ledger]) -> int:
    """The per-example analysis; ``load_ledger`` is ``dpfy account``'s ledger reader."""
    require(
        args.delta is not None,
        "delta",
        None,
        "given with --individual",
        "Add --delta, the run's δ",
    )
    path = Path(args.individual)
    norms = path / NORMS_FILE if path.is_dir() else path
    require(
        norms.is_file(),
        "individual",
        str(norms),
        "an existing per_example_norms.npz",
        "Train with --individual-accounting K (make_private(individual_accounting=K))",
    )
    ledger = load_ledger(args.ledger or str(path))
    with np.load(norms) as f:
        ratios, final_losses = f["ratios"], f["final_losses"]
        k = int(f["refresh_every"])
    res = per_example_epsilons(
        ledger,
        ratios,
        refresh_every=k,
        delta=args.delta,
        rounding=args.rounding,
        orders="all" if args.all_orders else "integer",
    )
    if args.histogram:
        res.plot(args.histogram)
    if args.json:
        out = {
            "run_epsilon": res.run_epsilon,
            "delta": args.delta,
            "quantiles": {str(q): v for q, v in res.quantiles().items()},
            "loss_correlation": res.loss_correlation(final_losses),
            "note": DATA_DEPENDENT_WARNING,
        }
        print(json.dumps(out))
    else:
        print(res.report(final_losses), end="")
    return 0
