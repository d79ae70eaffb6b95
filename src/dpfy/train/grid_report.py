"""The published result of a grid: the winner's privacy report with the grid's tuning cost.

The winner's report is re-rendered from its own ledger with a "Tuning grid" section and the
whole grid's ε as the tuning cost (:func:`publish_grid`); ``grid.json`` keeps every run's
ledger so anyone can re-account the composition.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Sequence

from dpfy.privacy.ledger import Ledger
from dpfy.privacy.report import PrivacyReport, ReportSection, TuningCost
from dpfy.privacy.statement import stated_delta, stated_epsilon
from dpfy.train.config import TrainConfig
from dpfy.train.grid_axes import GridAxis, GridRun
from dpfy.train.rundir import write_atomic

__all__ = ["publish_grid", "republish_report"]


def publish_grid(
    win_dir: Path,
    runs: Sequence[GridRun],
    winner: GridRun,
    eps_grid: float,
    delta: float,
    sigma: float,
    base: TrainConfig,
    select: str,
    selected_on: str,
    axes: Sequence[GridAxis],
    ledgers: Sequence[Ledger],
    test: dict[str, float] | None,
) -> None:
    """Re-render the winner's privacy report with the tuning cost and the grid table; write
    ``grid.json`` (the table's numbers and every run's ledger, so anyone can re-account)."""
    k = len(runs)
    names = [a.name for a in axes]
    target = f"target ε = {base.epsilon:g}" if base.epsilon is not None else "fixed σ"
    lines = [
        f"{k} configurations, each trained at σ = {sigma:.4g} ({target} for the whole "
        f"grid, per-grid budget of Galli et al. 2024). The grid's ε = "
        f"{stated_epsilon(eps_grid)} at δ = {stated_delta(delta)} is the "
        f"{base.accountant.upper()} accountant's ε of all {k} runs' ledgers composed. "
        f"Winner: run {winner.index} ({select} {winner.metric:.4g}), chosen "
        f"on the final epoch's {select} of {selected_on}.",
        "",
        "| run | " + " | ".join(names) + f" | {select} | ε of the run alone |",
        "|---|" + "---|" * len(names) + "---|---|",
    ]
    for r in runs:
        mark = " (winner)" if r is winner else ""
        lines.append(
            f"| {r.index}{mark} | "
            + " | ".join(
                f"{r.settings[n]:.6g}" if isinstance(r.settings[n], float) else str(r.settings[n])
                for n in names
            )
            + f" | {r.metric:.4g} | {stated_epsilon(r.epsilon)} |"
        )
    if test is not None:
        lines += [
            "",
            f"The published model (run {winner.index}) on the test split, which did "
            f"not take part in the selection ({test['examples']} examples): accuracy "
            f"{test['accuracy']:.4g}, loss {test['loss']:.4g}.",
        ]
    data = {
        "runs": [dataclasses.asdict(r) for r in runs],
        "winner": winner.index,
        "winner_on_test": test,
        "epsilon": eps_grid,
        "delta": delta,
        "noise_multiplier": sigma,
        "target_epsilon": base.epsilon,
        "accountant": base.accountant,
        "select": select,
        "selected_on": selected_on,
        "axes": {a.name: list(a.values) for a in axes},
    }
    section = ReportSection("Tuning grid", tuple(lines), data)
    tuning = TuningCost(
        method=f"per-grid budget: {k} runs composed ({base.accountant.upper()}; Mohapatra et al. "
        f"2022; Galli et al. 2024)",
        epsilon=eps_grid,
        delta=delta,
        details=f"Grid over {', '.join(names)} (see 'Tuning grid'); the winner was chosen on "
        f"{selected_on}. The grid was fixed before any run (a non-adaptive search).",
    )
    republish_report(win_dir, delta=delta, section=section, tuning=tuning, public_data=selected_on)
    ledger_dicts = [run_ledger.to_dict() for run_ledger in ledgers]
    write_atomic(
        win_dir / "grid.json", json.dumps({**data, "ledgers": ledger_dicts}, indent=1) + "\n"
    )


def republish_report(
    run_dir: Path,
    *,
    delta: float,
    section: ReportSection,
    tuning: TuningCost | None,
    public_data: str,
) -> None:
    """Re-render a finished run's privacy report from its own ledger, with a tuning section,
    the tuning statement (``None``: the search is not accounted) and what public data did."""
    saved = json.loads((run_dir / "privacy_report.json").read_text())
    context = PrivacyReport.context_from_dict(saved)
    context["sections"] = (*context.get("sections", ()), section)
    context["tuning"] = tuning
    context["public_data"] = public_data
    ledger = Ledger.from_json((run_dir / "ledger.json").read_text())
    PrivacyReport.from_ledger(ledger, delta=delta, accountant=saved["accountant"], **context).write(
        run_dir
    )
