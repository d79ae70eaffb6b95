"""``dpfy report``: write the privacy report of a ledger or of a run directory.

    dpfy report runs/fmnist                     # re-renders runs/fmnist's report from its ledger
    dpfy report ledger.json --delta 1e-5 --out report/

On a run directory the report is re-rendered from the run's ledger with the context its
``privacy_report.json`` saved (model section, sampling note, warnings, what was released), so
the Markdown comes out the same as the one ``dpfy train`` wrote. Without a saved report, the
unit of privacy and the sampling note come from the run spec in its ``config.json`` when it
has one. Flags given explicitly override both.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from dpfy.cli import add_command
from dpfy._require import require
from dpfy.cli.account import load_ledger
from dpfy.privacy.accountants import ACCOUNTANTS, RIGOROUS
from dpfy.privacy.report import PrivacyReport
from dpfy.privacy.report_text import sampling_note, unit_text

__all__ = ["register", "run"]

DEFAULTS = {"accountant": "pld", "released": "final model weights"}


def register(subparsers: argparse._SubParsersAction) -> None:
    p = add_command(subparsers, "report", __doc__)
    p.add_argument("path", metavar="LEDGER_OR_RUN_DIR", help="ledger.json or a run directory")
    p.add_argument(
        "--delta",
        type=float,
        metavar="D",
        help="δ of the statement (default: from config.json or privacy_report.json)",
    )
    p.add_argument(
        "--accountant",
        choices=ACCOUNTANTS,
        help="headline accountant (default: the saved report's when rigorous, else "
        "pld); gdp is an approximation and needs --approximate",
    )
    p.add_argument(
        "--approximate",
        action="store_true",
        help="allow --accountant gdp (a CLT approximation, not a guarantee)",
    )
    p.add_argument(
        "--out",
        metavar="DIR",
        help="output directory (default: the run directory, or next to the ledger)",
    )
    p.add_argument(
        "--released",
        help="what is published (default: the saved report's, else 'final model weights')",
    )
    p.add_argument(
        "--unit-of-privacy",
        help="default: the saved report's, else the ledger's "
        "unit ('one example', or one user for a "
        "user-level ledger)",
    )
    p.add_argument("--group-size", type=int, help="also state the guarantee for groups of k")
    p.set_defaults(func=run)


def _spec_context(spec: Any) -> dict[str, str]:
    """The unit of privacy and the sampling note of the run spec a run directory's config.json
    carries (its ``"spec"``, :meth:`dpfy.spec.RunSpec.to_dict`); {} without one (a run written
    before config.json held it, or a bare ledger). The loader's steps per epoch are not in the
    spec, so this note leaves them out; the saved report's note, when there is one, is kept."""
    resolved = (spec or {}).get("sampling", {}).get("resolved")
    if not resolved:
        return {}
    return {
        "unit_of_privacy": unit_text(spec["unit"]["unit"]),
        "sampling_note": sampling_note(resolved["sampling"], resolved["sample_rate"]),
    }


def _saved(directory: Path, name: str) -> dict[str, Any]:
    file = directory / name
    return json.loads(file.read_text()) if file.is_file() else {}


def run(args: argparse.Namespace) -> int:
    path = Path(args.path)
    directory = path if path.is_dir() else path.parent
    ledger = load_ledger(args.path)
    saved = _saved(directory, "privacy_report.json")
    config = _saved(directory, "config.json")
    delta = next(
        (float(d) for d in (args.delta, config.get("delta"), saved.get("delta")) if d is not None),
        None,
    )
    require(delta is not None, "delta", None, "given", "Add --delta D (no config.json found)")
    assert delta is not None  # the require above refused None
    require(
        args.accountant != "gdp" or args.approximate,
        "accountant",
        args.accountant,
        "a rigorous accountant (pld or rdp) for a published report",
        "GDP's CLT value is not a guarantee: add --approximate to write it anyway, with "
        "--out elsewhere to keep the run's report",
    )
    context = {**_spec_context(config.get("spec")), **PrivacyReport.context_from_dict(saved)}
    if context.get("accountant") not in RIGOROUS:  # an approximate headline is never the default
        context["accountant"] = DEFAULTS["accountant"]
    for key in ("accountant", "released", "unit_of_privacy", "group_size"):
        value = getattr(args, key)
        if value is not None:
            context[key] = value
        elif key in DEFAULTS:
            context.setdefault(key, saved.get(key, DEFAULTS[key]))
    out = Path(args.out) if args.out else directory
    report = PrivacyReport.from_ledger(ledger, delta=delta, **context)
    paths = report.write(out)
    print(report.statement())
    for p in paths.values():
        print(f"wrote {p}")
    return 0
