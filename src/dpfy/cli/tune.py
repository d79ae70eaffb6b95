"""``dpfy tune``: a grid of ``dpfy train`` runs under one privacy budget; publishes the winner.

    dpfy tune --dataset digits --model logreg --epochs 3 --batch-size 128 --epsilon 3 \\
        --grid lr=logspace:-2.5:1.5:7 --out runs/tuned

Every ``dpfy train`` flag sets the configuration all runs share; ``--epsilon`` is the **whole
grid's** target ε (per-grid budget, Galli et al. 2024): σ is calibrated so that the k runs
together spend it, and the report's tuning statement is the accountant's ε of all k ledgers
composed. ``--grid NAME=logspace:LO:HI:K`` (``np.logspace``, both ends included) or
``--grid NAME=V1,V2,...`` for NAME in lr, clip, momentum, weight_decay or a method option
(``method.KEY``, or ``NAME.KEY`` in a chain); repeat ``--grid`` for a product grid.

The winner is chosen on the final epoch's validation accuracy (``--select loss``: lowest loss)
of a split held out of the training data (``--validation-fraction``), or of the test split
when it is declared public (``--public-validation test``). Details: docs/tuning.md.
"""

from __future__ import annotations

import argparse
import time

from dpfy.cli import SUBCOMMANDS
from dpfy.cli import train as train_cli
from dpfy.train.config import TrainConfig
from dpfy.train.grid import SELECT, parse_axis, run_grid

__all__ = ["register", "run"]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "tune",
        parents=[train_cli.train_parser()],
        conflict_handler="resolve",
        help=SUBCOMMANDS["tune"],
        description=__doc__.splitlines()[0],
        epilog="Example: dpfy tune --dataset digits --model logreg --epsilon 3 "
        "--grid lr=logspace:-2.5:1.5:7",
    )
    p.add_argument(
        "--epsilon",
        type=float,
        default=argparse.SUPPRESS,
        metavar="EPSILON",
        help="target ε of the WHOLE grid: σ is calibrated so that all runs "
        "together spend it (default: 3.0)",
    )
    p.add_argument(
        "--grid",
        action="append",
        required=True,
        metavar="NAME=SPEC",
        help="a gridded hyperparameter: NAME=logspace:LO:HI:K or NAME=V1,V2,...; "
        "repeat for a product grid",
    )
    p.add_argument(
        "--select",
        choices=sorted(SELECT),
        default="accuracy",
        help="validation metric that picks the winner (default: accuracy)",
    )
    p.add_argument(
        "--validation-fraction",
        type=float,
        default=0.1,
        metavar="F",
        help="share of the training split held out for selection unless "
        "--public-validation test (default: 0.1)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.resume:
        raise ValueError(
            f"resume must be unset for dpfy tune, got resume = '{args.resume}'. "
            f"An interrupted grid cannot be continued; see docs/tuning.md"
        )
    cfg = TrainConfig.from_mapping(train_cli.explicit_settings(args), source="settings")
    axes = [parse_axis(g) for g in args.grid]
    out = args.out or f"runs/tune-{cfg.dataset}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_grid(
        cfg,
        axes,
        out=out,
        select=args.select,
        validation_fraction=args.validation_fraction,
        progress=not args.no_progress,
    )
    return 0
