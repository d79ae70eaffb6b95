"""``dpfy report``: write the privacy report of a ledger or of a run directory.

    dpfy report runs/fmnist                     # uses runs/fmnist/ledger.json and its δ
    dpfy report ledger.json --delta 1e-5 --out report/
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dpfy._validate import require
from dpfy.cli.account import load_ledger
from dpfy.privacy.accountants import ACCOUNTANTS
from dpfy.privacy.report import PrivacyReport

__all__ = ["register", "run"]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "report", help="write privacy_report.md/.json and epsilon_over_steps.png for a ledger",
        description=__doc__.splitlines()[0])
    p.add_argument("path", metavar="LEDGER_OR_RUN_DIR", help="ledger.json or a run directory")
    p.add_argument("--delta", type=float, metavar="D",
                   help="δ of the statement (default: from config.json or privacy_report.json)")
    p.add_argument("--accountant", choices=ACCOUNTANTS, default="pld")
    p.add_argument("--out", metavar="DIR",
                   help="output directory (default: the run directory, or next to the ledger)")
    p.add_argument("--released", default="final model weights", help="what is published")
    p.add_argument("--unit-of-privacy", default="one example")
    p.add_argument("--group-size", type=int, help="also state the guarantee for groups of k")
    p.set_defaults(func=run)


def _run_delta(path: Path) -> float | None:
    """δ of the run: its config.json, else an earlier privacy_report.json, else None."""
    directory = path if path.is_dir() else path.parent
    for name in ("config.json", "privacy_report.json"):
        file = directory / name
        if file.is_file():
            value = json.loads(file.read_text()).get("delta")
            if value is not None:
                return float(value)
    return None


def run(args: argparse.Namespace) -> int:
    path = Path(args.path)
    ledger = load_ledger(args.path)
    delta = args.delta if args.delta is not None else _run_delta(path)
    require(delta is not None, "delta", None, "given", "Add --delta D (no config.json found)")
    out = Path(args.out) if args.out else (path if path.is_dir() else path.parent)
    report = PrivacyReport.from_ledger(ledger, delta=delta, accountant=args.accountant,
                                       released=args.released,
                                       unit_of_privacy=args.unit_of_privacy,
                                       group_size=args.group_size)
    paths = report.write(out)
    print(report.statement())
    for p in paths.values():
        print(f"wrote {p}")
    return 0
