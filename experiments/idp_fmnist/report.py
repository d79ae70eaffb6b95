"""Tables and plots of ``python -m experiments idp-fmnist`` from its results file.

- ``idp_fmnist_table.md``: per (case, variant), over replicates: test accuracy (mean ± sample
  std), each group's training-set accuracy (mean) and ε by PLD (the largest over replicates),
  each group's budget.
- ``idp_<case>_<variant>_epsilon.png``: each group's ε over steps with its budget (as in
  Figs. 13/14 of Monir, Fauzan & Ghinita 2023), drawn by
  :meth:`dpfy.privacy.group_ledger.GroupLedgers.plot` from the group ledgers of the first
  replicate of each IDP variant.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from experiments.idp_fmnist.spec import VARIANTS
from dpfy.privacy.group_ledger import GroupLedgers

__all__ = ["summarize", "table"]


def _cells(records: list[dict]) -> dict[tuple[str, str], list[dict]]:
    cells: dict[tuple[str, str], list[dict]] = {}
    for r in sorted(records, key=lambda r: r["spec"]["replicate"]):
        cells.setdefault((r["spec"]["case"], r["spec"]["variant"]), []).append(r)
    return dict(sorted(cells.items(), key=lambda kv: (kv[0][0], VARIANTS.index(kv[0][1]))))


def _mean_sd(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


def table(records: list[dict]) -> list[str]:
    """The markdown table's lines (one row per case and variant)."""
    lines = ["| case | variant | runs | test acc. % | train acc. % per group | "
             "ε (PLD) per group, max over runs | budgets |", "|---|---|---:|---:|---|---|---|"]
    for (case, variant), runs in _cells(records).items():
        groups = range(len(runs[0]["groups"]))
        acc = " / ".join(f"{statistics.mean(r['groups'][p]['train_accuracy'] for r in runs):.2f}"
                         for p in groups)
        eps = " / ".join(f"{max(r['groups'][p]['epsilon_pld'] for r in runs):.3f}"
                         for p in groups)
        budgets = " / ".join(f"{g['budget']:g}" for g in runs[0]["groups"])
        lines.append(f"| {case} | {variant} | {len(runs)} | "
                     f"{_mean_sd([r['test_accuracy'] for r in runs])} | {acc} | {eps} | "
                     f"{budgets} |")
    return lines


def summarize(records: list[dict], out: Path) -> list[Path]:
    """Write the table and the per-group ε plots; returns the paths written."""
    if not records:
        return []
    out.mkdir(parents=True, exist_ok=True)
    path = out / "idp_fmnist_table.md"
    path.write_text("\n".join(table(records)) + "\n")
    written = [path]
    for (case, variant), runs in _cells(records).items():
        if runs[0]["group_ledgers"] is None:
            continue
        png = out / f"idp_{case}_{variant}_epsilon.png"
        GroupLedgers.from_dict(runs[0]["group_ledgers"]).plot(
            png, delta=runs[0]["spec"]["delta"], accountant="pld")
        written.append(png)
    return written
