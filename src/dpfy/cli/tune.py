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

``--recipe guide`` runs the guide's tuning recipe instead of a grid (Ponomareva et al. 2023,
§5.4.1; :mod:`dpfy.train.recipe`): lr at σ = 0, ClipSearch at σ = 0, σ calibrated to
``--epsilon`` for the final run, an lr sweep at that σ (optionally at a small
``--tan-batch-size``), then the final run on the whole training split. Its searches are NOT
covered by the guarantee (the report says which); ``--private-selection`` accounts an lr sweep
instead and refuses the σ = 0 searches. Details: docs/guide/tuning_recipe.md.
"""

from __future__ import annotations

import argparse
import time

from dpfy.cli import train as train_cli
from dpfy.privacy.tuning import log_grid
from dpfy.train.config import TrainConfig
from dpfy.train.device import resolve_device
from dpfy.train import recipe as guide_recipe
from dpfy.train.grid import SELECT, GridAxis, parse_axis, run_grid

__all__ = ["register", "run"]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = train_cli.add_train_like_parser(
        subparsers,
        "tune",
        __doc__,
        "dpfy tune --dataset digits --model logreg --epsilon 3 --grid lr=logspace:-2.5:1.5:7",
    )
    p.add_argument(
        "--epsilon",
        type=float,
        default=argparse.SUPPRESS,
        metavar="EPSILON",
        help="target ε of the WHOLE grid: σ is calibrated so that all runs "
        "together spend it (default: 3.0); with --recipe guide (without "
        "--private-selection), the final run's target ε",
    )
    p.add_argument(
        "--grid",
        action="append",
        metavar="NAME=SPEC",
        help="a gridded hyperparameter: NAME=logspace:LO:HI:K or NAME=V1,V2,...; "
        "repeat for a product grid (required unless --recipe guide)",
    )
    p.add_argument(
        "--recipe",
        choices=["guide"],
        default=None,
        help="'guide': the guide's recipe (lr at σ=0, ClipSearch at σ=0, σ for --epsilon, "
        "lr sweep at σ, final run); its searches are NOT covered by the guarantee unless "
        "--private-selection (docs/guide/tuning_recipe.md)",
    )
    p.add_argument(
        "--lr-grid",
        default=None,
        metavar="SPEC",
        help="--recipe guide: learning rates of the σ=0 search, logspace:LO:HI:K or V1,V2,... "
        "(default: logspace:-3:1:9)",
    )
    p.add_argument(
        "--clip-grid",
        default=None,
        metavar="SPEC",
        help="--recipe guide: ClipSearch's C values (default: logspace:-2:2:5, the guide's "
        "0.01 ... 100)",
    )
    p.add_argument(
        "--lr-factors",
        default=None,
        metavar="SPEC",
        help="--recipe guide: the private lr sweep as multiples of the σ=0 learning rate "
        "(or of --lr with --private-selection) (default: logspace:-1:1:5)",
    )
    p.add_argument(
        "--clip-tolerance",
        type=float,
        default=None,
        metavar="T",
        help="--recipe guide: ClipSearch keeps the smallest C within T of the best validation "
        f"metric (default: {guide_recipe.CLIP_TOLERANCE:g}, one accuracy point)",
    )
    p.add_argument(
        "--tan-batch-size",
        type=int,
        default=None,
        metavar="B'",
        help="--recipe guide: run the private lr sweep at batch B' with σ' = σ·B'/B for the "
        "same steps (fixed noise Σ̄ = σC/B, Sander et al. 2023); proxies, not private at "
        "--epsilon",
    )
    p.add_argument(
        "--private-selection",
        action="store_true",
        help="--recipe guide: account the search (per-grid budget over the lr sweep at --lr "
        "and --clip, which must come from public data); the σ=0 searches are refused",
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
    settings = train_cli.explicit_settings(args)
    cfg = TrainConfig.from_mapping(settings, source="settings")
    resolve_device(cfg.device)  # an unusable --device is refused before any work
    out = args.out or f"runs/tune-{cfg.dataset}-{time.strftime('%Y%m%d-%H%M%S')}"
    if args.recipe == "guide":
        return _run_recipe(args, cfg, settings, out)
    recipe_only = [
        flag
        for flag, value in (
            ("--lr-grid", args.lr_grid),
            ("--clip-grid", args.clip_grid),
            ("--lr-factors", args.lr_factors),
            ("--tan-batch-size", args.tan_batch_size),
            ("--private-selection", args.private_selection or None),
            ("--clip-tolerance", args.clip_tolerance),
        )
        if value is not None
    ]
    if recipe_only:
        raise ValueError(
            f"recipe must be 'guide' with {', '.join(recipe_only)}, got recipe = None. Add "
            f"--recipe guide, or drop {', '.join(recipe_only)} (a --grid tune is always "
            f"accounted)"
        )
    if not args.grid:
        raise ValueError(
            "grid must be given for dpfy tune, got grid = None. Add --grid NAME=SPEC "
            "(e.g. --grid lr=logspace:-2.5:1.5:7), or use --recipe guide"
        )
    axes = [parse_axis(g) for g in args.grid]
    run_grid(
        cfg,
        axes,
        out=out,
        select=args.select,
        validation_fraction=args.validation_fraction,
        progress=not args.no_progress,
    )
    return 0


def _values(spec: str | None, name: str, default: tuple[float, ...]) -> tuple[float, ...]:
    """A --lr-grid/--clip-grid/--lr-factors SPEC (``--grid``'s syntax) as floats."""
    if spec is None:
        return default
    flag = "--" + name.replace("_", "-")
    try:
        if spec.startswith("logspace:"):
            lo, hi, num = spec.split(":")[1:]
            return tuple(float(v) for v in log_grid(float(lo), float(hi), int(num)))
        return tuple(float(v) for v in spec.split(",") if v != "")
    except ValueError:
        raise ValueError(
            f"{name} must be logspace:LO:HI:K or V1,V2,... with numbers, got {name} = "
            f"{spec!r}. Write e.g. {flag} logspace:-2:2:5 or {flag} 0.1,1,10"
        ) from None


def _run_recipe(args: argparse.Namespace, cfg: TrainConfig, settings: dict, out: str) -> int:
    """``dpfy tune --recipe guide``: the recipe, or with --private-selection an accounted lr
    sweep (the σ = 0 searches refused: their releases have ε = ∞)."""
    if args.grid:
        raise ValueError(
            f"grid must be unset with --recipe guide, got grid = {args.grid}. The recipe "
            f"chooses its own searches: use --lr-grid, --clip-grid and --lr-factors"
        )
    factors = _values(args.lr_factors, "lr_factors", guide_recipe.DEFAULT_LR_FACTORS)
    if args.private_selection:
        given = [f for f, v in (("--lr-grid", args.lr_grid), ("--clip-grid", args.clip_grid)) if v]
        if given:
            raise ValueError(
                f"private_selection excludes {', '.join(given)}: the σ = 0 searches release "
                f"non-private models (ε = ∞) that no accountant can cover. Choose lr and C on "
                f"public data (e.g. dpfy tune --recipe guide on a public dataset) and pass "
                f"--lr and --clip"
            )
        missing = [f for f, key in (("--lr", "lr"), ("--clip", "clip")) if key not in settings]
        if missing:
            raise ValueError(
                f"private_selection needs {' and '.join(missing)}: the σ = 0 searches that "
                f"would choose them cannot be accounted. Pass --lr and --clip chosen on "
                f"public data"
            )
        if args.tan_batch_size is not None:
            raise ValueError(
                f"tan_batch_size must be unset with --private-selection, got tan_batch_size = "
                f"{args.tan_batch_size}. The per-grid budget calibrates one σ for identical "
                f"runs; fixed-noise proxies at σ' = σB'/B are not calibrated to it"
            )
        assert cfg.lr is not None, "--lr was given"
        run_grid(
            cfg,
            [GridAxis("lr", tuple(cfg.lr * f for f in factors))],
            out=out,
            select=args.select,
            validation_fraction=args.validation_fraction,
            progress=not args.no_progress,
        )
        return 0
    guide_recipe.run_recipe(
        cfg,
        out=out,
        lr_grid=_values(args.lr_grid, "lr_grid", guide_recipe.DEFAULT_LR_GRID),
        clip_grid=_values(args.clip_grid, "clip_grid", guide_recipe.DEFAULT_CLIP_GRID),
        lr_factors=factors,
        tolerance=guide_recipe.CLIP_TOLERANCE
        if args.clip_tolerance is None
        else args.clip_tolerance,
        select=args.select,
        validation_fraction=args.validation_fraction,
        tan_batch=args.tan_batch_size,
        progress=not args.no_progress,
    )
    return 0
