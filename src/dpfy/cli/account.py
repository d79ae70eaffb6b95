"""``dpfy account``: ε (or δ) of a DP-SGD run, or of a recorded ledger.

Examples::

    dpfy account --sample-rate 0.005 --noise-multiplier 1 --steps 20000 --delta 1e-6
    dpfy account --batch-size 256 --dataset-size 60000 --epochs 15 --noise-multiplier 1.1 \\
        --delta 1e-5 --accountant pld --json
    dpfy account --ledger runs/x/ledger.json --delta 1e-5
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from dpfy.cli import add_command
from dpfy.cli.account_individual import (
    add_flags as add_individual_flags,
    refuse_without_individual,
    run_individual,
)
from dpfy._require import require
from dpfy.privacy.accountants import (
    ACCOUNTANTS,
    APPROXIMATE,
    accountant_label,
    delta,
    epsilon,
)
from dpfy.privacy.ledger import Ledger, Sampling

__all__ = [
    "register",
    "run",
    "add_run_shape_arguments",
    "resolve_run_shape",
    "resolve_noise",
    "shape_ledger",
    "DEFAULT_ACCOUNTANT",
]

# The accountant of `dpfy account` and `dpfy calibrate` when none is named: PLD, as for
# `dpfy train` and make_private (one default, so a plan and its run state the same ε).
DEFAULT_ACCOUNTANT = "pld"


def add_run_shape_arguments(p: argparse.ArgumentParser, *, steps_required: bool = True) -> None:
    """--sample-rate/--steps, or --batch-size/--dataset-size/--epochs, plus --sampling."""
    g = p.add_argument_group("run shape (give Q and T, or B, N and E)")
    g.add_argument("--sample-rate", type=float, metavar="Q", help="q = batch size / dataset size")
    g.add_argument("--steps", type=int, metavar="T", help="number of optimizer updates")
    g.add_argument("--batch-size", type=int, metavar="B", help="(expected) batch size")
    g.add_argument("--dataset-size", type=int, metavar="N", help="number of private examples")
    g.add_argument("--epochs", type=float, metavar="E", help="passes over the data")
    g.add_argument(
        "--sampling",
        choices=[s.value for s in Sampling],
        default="poisson",
        help="how batches are formed (default: poisson; uls/els: user level, "
        "docs/guide/user_level.md)",
    )
    g.add_argument(
        "--max-examples-per-user",
        type=int,
        metavar="K",
        help="k, the most examples one user keeps (--sampling els only)",
    )
    g.add_argument(
        "--noise",
        choices=["gaussian", "tree", "bandmf"],
        default="gaussian",
        help="noise mechanism: gaussian (DP-SGD, default), tree (DP-FTRL over "
        "shuffled passes of ceil(1/Q) steps) or bandmf (cyclic Poisson, "
        "--bands B; Q stays the expected batch fraction)",
    )
    g.add_argument(
        "--bands",
        type=int,
        metavar="B",
        help="BandMF's band count (--noise bandmf; default min(8, floor(1/Q)))",
    )


def resolve_noise(args: argparse.Namespace, q: float) -> tuple[Sampling, float, dict[str, Any]]:
    """(sampling, recorded rate, ledger keywords) of --noise: DP-SGD as --sampling says; the
    tree on shuffled passes of ⌈1/q⌉ steps; BandMF on cyclic Poisson at the group rate b·q."""
    noise, bands = getattr(args, "noise", "gaussian"), getattr(args, "bands", None)
    require(
        bands is None or noise == "bandmf",
        "bands",
        bands,
        "left unset without --noise bandmf",
        "Add --noise bandmf, or drop --bands",
    )
    if noise == "gaussian":
        require(
            args.sampling != "cyclic_poisson",
            "sampling",
            args.sampling,
            "poisson, fixed_size, shuffle, none, uls or els with --noise gaussian",
            "Cyclic Poisson is BandMF's sampling: use --noise bandmf --bands B",
        )
        return Sampling(args.sampling), q, {}
    require(
        args.sampling == "poisson",
        "sampling",
        args.sampling,
        f"left at its default with --noise {noise} (the mechanism decides it)",
        "Drop --sampling",
    )
    if noise == "tree":
        period = math.ceil(1 / q - 1e-9)
        return Sampling.SHUFFLE, q, {"noise": "tree", "period": period}
    if bands is None:
        from dpfy.sampling.cyclic import DEFAULT_BANDS  # local: only BandMF needs it

        # make_private's default, min(8, ⌊N/B⌋) with N/B = 1/q
        bands = max(1, min(DEFAULT_BANDS, math.floor(1 / q + 1e-9)))  # 1e-9: 1/q's rounding
    require(
        bands >= 1 and bands * q <= 1,
        "bands",
        bands,
        f"an integer in [1, 1/q = {1 / q:.6g}] (each group must hold the expected batch)",
    )
    return Sampling.CYCLIC_POISSON, bands * q, {"noise": "bandmf", "period": bands}


def shape_ledger(
    args: argparse.Namespace,
    sampling: Sampling,
    rate: float,
    sigma: float,
    steps: int,
    **keywords: Any,
) -> Ledger:
    """The ledger of ``steps`` steps at ``rate`` with σ = ``sigma`` on ``sampling`` over
    --dataset-size examples; ``keywords`` (k, the noise mechanism) go to
    :meth:`Ledger.homogeneous` as they are."""
    return Ledger.homogeneous(
        sample_rate=rate,
        noise_multiplier=sigma,
        steps=steps,
        sampling=sampling,
        dataset_size=args.dataset_size,
        **keywords,
    )


def resolve_run_shape(
    args: argparse.Namespace, *, need_steps: bool = True, need_rate: bool = True
) -> tuple[float | None, int | None]:
    """(q, T) from --sample-rate/--steps or from --batch-size/--dataset-size/--epochs.

    T = ceil(E·N/B): a partial last epoch still counts as a step (the conservative choice).
    """
    q, steps = args.sample_rate, args.steps
    if args.batch_size is not None or args.epochs is not None:
        require(
            q is None,
            "sample_rate",
            q,
            "omitted when --batch-size is given",
            "Give either --sample-rate or --batch-size with --dataset-size",
        )
        require(
            args.dataset_size is not None,
            "dataset_size",
            None,
            "given with --batch-size / --epochs",
            "Add --dataset-size N",
        )
        require(args.dataset_size >= 1, "dataset_size", args.dataset_size, ">= 1")
        if args.batch_size is not None:
            require(
                1 <= args.batch_size <= args.dataset_size,
                "batch_size",
                args.batch_size,
                f"in [1, dataset_size = {args.dataset_size}]",
            )
            q = args.batch_size / args.dataset_size
        if args.epochs is not None:
            require(
                steps is None,
                "steps",
                steps,
                "omitted when --epochs is given",
                "Give either --steps or --epochs",
            )
            require(
                math.isfinite(args.epochs) and args.epochs > 0,
                "epochs",
                args.epochs,
                "> 0 and finite",
            )
            require(q is not None, "batch_size", None, "given with --epochs", "Add --batch-size B")
            steps = math.ceil(args.epochs / q - 1e-9)
    if need_rate:
        require(
            q is not None,
            "sample_rate",
            None,
            "given",
            "Add --sample-rate Q, or --batch-size B --dataset-size N",
        )
        require(0 < q <= 1, "sample_rate", q, "in (0, 1]", "Use batch_size / dataset_size")
    if need_steps:
        require(steps is not None, "steps", None, "given", "Add --steps T, or --epochs E")
        require(steps >= 1, "steps", steps, ">= 1")
    return q, steps


def register(subparsers: argparse._SubParsersAction) -> None:
    p = add_command(
        subparsers,
        "account",
        __doc__,
        "dpfy account --sample-rate 0.005 --noise-multiplier 1 --steps 20000 --delta 1e-6",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_run_shape_arguments(p)
    p.add_argument(
        "--noise-multiplier",
        type=float,
        metavar="S",
        help="σ: noise std / L2 sensitivity (clip norm)",
    )
    p.add_argument("--ledger", metavar="FILE", help="account a ledger.json (or a run directory)")
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--delta", type=float, metavar="D", help="report ε at this δ")
    target.add_argument("--epsilon", type=float, metavar="E", help="report δ at this ε")
    p.add_argument(
        "--accountant",
        choices=ACCOUNTANTS,
        default=None,
        help="rdp, pld, or gdp (an approximation); default: with --ledger of a run "
        "directory, the run's own accountant (its config.json), the others "
        f"shown beside it; else {DEFAULT_ACCOUNTANT} (as dpfy train)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_individual_flags(p)
    p.set_defaults(func=run)


def load_ledger(path: str) -> Ledger:
    """A ledger from ledger.json or from a run directory that contains one."""
    p = Path(path)
    if p.is_dir():
        p = p / "ledger.json"
    require(
        p.is_file(),
        "ledger",
        str(p),
        "an existing ledger.json file",
        "Pass the file written by `dpfy train` or Ledger.to_json()",
    )
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(
            f"ledger must be a readable UTF-8 JSON file, got '{p}' ({e}). Pass "
            f"the ledger.json written by dpfy train"
        ) from None
    return Ledger.from_json(text, source=f"ledger '{p}'")


def run_accountant(path: str) -> str | None:
    """The accountant a run directory's config.json names (that of ``path`` or of the directory
    holding the ledger file), or None when there is none."""
    p = Path(path)
    config = (p if p.is_dir() else p.parent) / "config.json"
    try:
        name = json.loads(config.read_text(encoding="utf-8")).get("accountant")
    except (OSError, ValueError, AttributeError):
        return None
    return name if name in ACCOUNTANTS else None


def run(args: argparse.Namespace) -> int:
    if getattr(args, "individual", None):
        return run_individual(args, load_ledger)
    refuse_without_individual(args)
    from dpfy.privacy.statement import (  # local: not for --help
        epsilon_statement,
        inapplicable,
        stated_epsilon,
    )

    others: dict[str, float] = {}
    left_out: dict[str, str] = {}
    if args.ledger:
        ledger = load_ledger(args.ledger)
        shape: dict[str, Any] = {"ledger": args.ledger, "steps": ledger.num_steps}
        if args.accountant is None:
            args.accountant = run_accountant(args.ledger) or DEFAULT_ACCOUNTANT
            if args.delta is not None:  # the other accountants' ε, beside the run's own
                left_out = {
                    a: why for a in ACCOUNTANTS if (why := inapplicable(ledger, a)) is not None
                }
                others = {
                    a: epsilon(ledger, delta=args.delta, accountant=a)
                    for a in ACCOUNTANTS
                    if a != args.accountant and a not in left_out
                }
    else:
        q, steps = resolve_run_shape(args)
        assert q is not None and steps is not None  # resolve_run_shape required both
        args.accountant = args.accountant or DEFAULT_ACCOUNTANT
        require(
            args.noise_multiplier is not None,
            "noise_multiplier",
            None,
            "given",
            "Add --noise-multiplier S",
        )
        require(
            math.isfinite(args.noise_multiplier) and args.noise_multiplier >= 0,
            "noise_multiplier",
            args.noise_multiplier,
            ">= 0 and finite",
            "Pass the noise std divided by the clipping norm",
        )
        sampling, rate, noise = resolve_noise(args, q)
        k = args.max_examples_per_user
        ledger = shape_ledger(
            args, sampling, rate, args.noise_multiplier, steps, max_examples_per_user=k, **noise
        )
        shape = {
            "sample_rate": rate,
            "noise_multiplier": args.noise_multiplier,
            "steps": steps,
            "sampling": sampling.value,
            **noise,
        }
    why = inapplicable(ledger, args.accountant)
    require(why is None, "accountant", args.accountant, "one that applies to this run", why or "")
    out: dict[str, Any] = {
        **shape,
        "accountant": args.accountant,
        "accountant_label": accountant_label(args.accountant),
        "approximate": args.accountant == "gdp",
        "adjacency": ledger.adjacency(),
        "unit": ledger.unit(),
    }
    if args.delta is not None:
        out["delta"] = args.delta
        out["epsilon"] = epsilon(ledger, delta=args.delta, accountant=args.accountant)
    else:
        out["epsilon"] = args.epsilon
        out["delta"] = delta(ledger, epsilon=args.epsilon, accountant=args.accountant)
    if others:
        out["others"] = others
        out["others_labels"] = {a: accountant_label(a) for a in others}
    if left_out:
        out["left_out"] = left_out
    out["statement"] = epsilon_statement(  # rounded up: never smaller than computed
        out["epsilon"],
        out["delta"],
        unit=out["unit"],
        adjacency=out["adjacency"],
        accountant_label=out["accountant_label"],
    )
    if args.json:
        print(
            json.dumps(
                {
                    k: (v if not (isinstance(v, float) and math.isinf(v)) else "inf")
                    for k, v in out.items()
                }
            )
        )
        return 0
    what = (
        f"{ledger.num_steps} recorded steps"
        if args.ledger
        else f"{out['steps']} steps of sampling rate q = {out['sample_rate']:.6g} "
        f"({out['sampling']}) with noise multiplier σ = {out['noise_multiplier']:g}"
    )
    beside = "".join(  # the GDP CLT may under-report: it says so wherever it is shown
        f"; {a}: ε = {stated_epsilon(e)}" + (" (approximation)" if a in APPROXIMATE else "")
        for a, e in others.items()
    )
    print(
        f"{what} satisfy {out['statement']}"
        + (f" (the run's accountant{beside})" if others else "")
    )
    for name, reason in left_out.items():
        print(f"{name} left out: {reason}")
    return 0
