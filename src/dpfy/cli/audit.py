"""``dpfy audit``: train a ``dpfy train`` configuration with canaries and audit it empirically.

Takes every flag of ``dpfy train`` (the same parser: see :mod:`dpfy.cli.train`) plus
``--canaries M``, ``--canary-kind``, ``--plant-noise-scale F`` and ``--json``. The run trains
through ``make_private`` exactly as the configuration says, with M white-box gradient canaries
(each in the training set with probability ½; Dirac canaries by default), then prints the
claimed ε (its ledger) beside the one-run and f-DP lower bounds and the Gaussian-DP estimate
at 95 % confidence, and writes the privacy report with an audit section, the ledger and
``audit.json`` into ``--out``. No checkpoints: ``--resume`` is refused. With
``--plant-noise-scale F`` the noise is scaled by F behind the ledger's back (a power test):
that run is never published, and only ``audit.json`` and ``config.json`` are written.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from dpfy._require import require
from dpfy.audit.canaries import KINDS
from dpfy.audit.run import DEFAULT_CANARIES, DEFAULT_KIND, audit_config
from dpfy.cli.train import add_train_like_parser, explicit_settings
from dpfy.train.config import TrainConfig

__all__ = ["register", "run"]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = add_train_like_parser(
        subparsers,
        "audit",
        __doc__,
        "dpfy audit --dataset digits --model logreg --epochs 5 --batch-size 256 "
        "--out runs/audit-digits",
    )
    p.add_argument(
        "--canaries",
        type=int,
        default=DEFAULT_CANARIES,
        metavar="M",
        help=f"number of canaries, each included with probability 1/2 "
        f"(default: {DEFAULT_CANARIES})",
    )
    p.add_argument(
        "--canary-kind",
        choices=KINDS,
        default=DEFAULT_KIND,
        help="dirac: one coordinate no real example touches per canary (tight); "
        "direction: a random direction over the model's own parameters "
        f"(default: {DEFAULT_KIND})",
    )
    p.add_argument(
        "--plant-noise-scale",
        type=float,
        default=None,
        metavar="F",
        help="power test: scale the noise std by F behind the ledger's back (the "
        "run is never published; no privacy report is written)",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    require(
        not args.resume,
        "resume",
        args.resume,
        "unset for dpfy audit",
        "An audit is one uninterrupted run; start it again with --out",
    )
    require(args.canaries >= 2, "canaries", args.canaries, ">= 2", "Use 1000 or more")
    planted = args.plant_noise_scale
    cfg = TrainConfig.from_mapping(explicit_settings(args), source="settings")
    out = args.out or f"runs/{cfg.dataset}-audit-{time.strftime('%Y%m%d-%H%M%S')}"
    echo = (lambda line: print(line, file=sys.stderr)) if args.json else print
    result = audit_config(
        cfg,
        canaries=args.canaries,
        out=out,
        progress=not (args.no_progress or args.json),
        echo=echo,
        canary_kind=args.canary_kind,
        plant_noise_scale=planted,
    )
    if args.json:
        print(json.dumps({**result.to_dict(), "out": str(out)}, indent=2))
        return 0
    print(
        f"dpfy audit: claimed ε        {result.claimed_epsilon:.4f}  "
        f"({result.accountant.upper()}, δ = {result.delta:.3g}, {result.steps} steps)"
    )
    print(
        f"dpfy audit: lower bound (one-run) {result.one_run.epsilon:.4f}  "
        f"(95 % confidence, {result.canaries} canaries, {result.canaries_in} in)"
    )
    print(f"dpfy audit: lower bound (f-DP)    {result.fdp.epsilon:.4f}")
    if result.gdp is not None:
        print(
            f"dpfy audit: GDP estimate        {result.gdp.epsilon:.4f}  (lower limit "
            f"{result.gdp.epsilon_low:.4f} at 95 % confidence; Nasr et al. 2023)"
        )
    verdict = result.summary().rsplit(" — ", 1)[-1]
    if planted is not None:
        print(
            f"dpfy audit: {verdict}; audit: {out}/audit.json (no privacy report: this run "
            f"is never published)"
        )
    else:
        print(f"dpfy audit: {verdict}; report: {out}/privacy_report.md")
    return 0
