"""Tables and plots of ``python -m experiments oso-fmnist`` from its results file.

Writes ``<stem>_tables.md`` (winners with mean ± std over replicates, the per-grid budget
and the grid's PLD ε, the FixedThreshold / FixedQuantile grids cell by cell, the winning cells
beside Table 3 of Galli et al. 2024 ("002") for the autoencoder, that paper's only
Fashion-MNIST task),
``<stem>_metric_vs_eps.png`` and ``<stem>_online_trajectories.png`` (C_t and ρ_t of Online
over training; released values, so publishing them is post-processing). ``<stem>`` is
:func:`stem`: one set of files per (task, k), so the classifier's or a k = 7 grid's summary
never overwrites the autoencoder's k = 5 files.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from experiments.oso_fmnist.grid import (CLIP_RANGE, LR_RANGE, METHODS, PAPER_NAMES, QUANTILES,
                                       RunSpec, Settings)
from experiments.oso_fmnist.train import lower_is_better
from dpfy.privacy.tuning import log_grid

__all__ = ["summarize", "winner_rows", "stem", "PAPER_TABLE3"]

# Galli et al. 2024 Table 3 (Fashion-MNIST, k = 7): ε → winning hyperparameters
PAPER_TABLE3: dict[float, dict[str, str]] = {
    1.0: {"online": "ρ=0.3162", "threshold": "ρ=0.0681, C=0.010", "quantile": "all diverge",
          "adamwosm": "C=0.01"},
    2.0: {"online": "ρ=1.467", "threshold": "ρ=1.467, C=0.010", "quantile": "ρ=0.3162, γ=0.3",
          "adamwosm": "C=0.01"},
    3.0: {"online": "ρ=1.467", "threshold": "ρ=6.812, C=0.010", "quantile": "ρ=1.467, γ=0.1",
          "adamwosm": "C=0.0464"},
    4.0: {"online": "ρ=1.467", "threshold": "ρ=1.467, C=0.0464", "quantile": "ρ=1.467, γ=0.3",
          "adamwosm": "C=0.01"},
}


def stem(settings: Settings) -> str:
    """File-name stem of ``settings``' tables and plots: ``oso_fmnist`` for the committed
    autoencoder at k = 5, with ``_classifier`` and/or ``_k<k>`` appended otherwise."""
    task = "" if settings.task == "autoencoder" else f"_{settings.task}"
    k = "" if settings.k == Settings().k else f"_k{settings.k}"
    return f"oso_fmnist{task}{k}"


def _mine(records: list[dict], settings: Settings) -> list[tuple[RunSpec, dict]]:
    out = []
    for r in records:
        spec = RunSpec.from_dict(r["spec"])
        if spec.settings == settings:
            out.append((spec, r))
    return out


def _hp(spec: RunSpec) -> str:
    parts = [f"ρ={spec.lr:.4g}"] if spec.method != "adamwosm" else []
    if spec.clip is not None:
        parts.append(f"C={spec.clip:.4g}")
    if spec.quantile is not None:
        parts.append(f"γ={spec.quantile:g}")
    return ", ".join(parts)


def _fmt(x: float | None, digits: int = 4) -> str:
    return "diverged" if x is None else f"{x:.{digits}f}"


def _worse(record: dict, settings: Settings) -> bool:
    """The run ended worse than the untrained model (its step-0 evaluation)."""
    first, last = record["evals"][0][1], record["evals"][-1][1]
    return last > first if lower_is_better(settings) else last < first


def winner_rows(records: list[dict], settings: Settings) -> list[dict[str, Any]]:
    """One row per (method, ε): winning cell, its replicates' values, the grid's facts."""
    runs = _mine(records, settings)
    sign = 1.0 if lower_is_better(settings) else -1.0
    by_method_eps: dict[tuple, list] = defaultdict(list)
    for spec, r in runs:
        by_method_eps[(spec.method, spec.epsilon)].append((spec, r))
    rows = []
    for (method, eps), items in by_method_eps.items():
        first = [(s, r) for s, r in items if s.replicate == 0]
        ok = [(s, r) for s, r in first if r["best"] is not None]
        row: dict[str, Any] = {
            "method": method, "epsilon": eps, "configs": len(first),
            "diverged": sum(r["diverged"] for _, r in first),
            "worse": sum(r["diverged"] or _worse(r, settings) for _, r in first),
            "noise_multiplier": first[0][1]["noise_multiplier"] if first else None,
            "runs": first[0][1]["runs"] if first else None,
            "max_eps_grid": max((r.get("epsilon_grid_pld") or 0.0) for _, r in items)
            if method != "nodp" else None,
            "winner": None, "values": [],
        }
        if ok:
            spec, _ = min(ok, key=lambda sr: sign * sr[1]["best"])
            row["winner"] = spec
            row["values"] = [r["best"] for s, r in items if s.cell() == spec.cell()]
            row["trace"] = [r.get("trace") for s, r in items if s.cell() == spec.cell()]
        rows.append(row)
    order = {m: i for i, m in enumerate(METHODS)}
    return sorted(rows, key=lambda r: (r["epsilon"] or 0.0, order[r["method"]]))


def _mean_std(values: list) -> tuple[float | None, float | None]:
    vals = [v for v in values if v is not None]
    if not vals:
        return None, None
    return statistics.fmean(vals), statistics.stdev(vals) if len(vals) > 1 else 0.0


def _winner_table(rows: list[dict], settings: Settings) -> list[str]:
    metric = "test MSE" if lower_is_better(settings) else "test accuracy %"
    out = [f"| ε | method | configs (runs sharing ε) | ν per run | max grid ε (PLD) | "
           f"non-finite | ended worse than untrained | winner | {metric}, replicate 0 | "
           f"mean ± std (n) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        spec = r["winner"]
        mean, std = _mean_std(r["values"])
        nu = "—" if r["noise_multiplier"] is None else f"{r['noise_multiplier']:.3f}"
        grid_eps = "—" if r["max_eps_grid"] is None else f"{r['max_eps_grid']:.4f}"
        eps = "—" if r["epsilon"] is None else f"{r['epsilon']:g}"
        first = r["values"][0] if r["values"] else None
        summary = ("—" if mean is None
                   else f"{mean:.4f} ± {std:.4f} ({len([v for v in r['values'] if v is not None])})")
        out.append(f"| {eps} | {PAPER_NAMES[r['method']]} | {r['configs']} ({r['runs']}) | {nu} "
                   f"| {grid_eps} | {r['diverged']}/{r['configs']} | {r['worse']}/{r['configs']} | "
                   f"{_hp(spec) if spec else '—'} | {_fmt(first)} | {summary} |")
    return out


def _cell_table(runs: list[tuple[RunSpec, dict]], method: str, eps: float,
                settings: Settings) -> list[str]:
    """Replicate-0 values of a 2-D grid: rows ρ, columns C (threshold) or γ (quantile)."""
    lrs = [float(x) for x in log_grid(*LR_RANGE, settings.k)]
    cols = ([float(x) for x in log_grid(*CLIP_RANGE, settings.k)] if method == "threshold"
            else list(QUANTILES))
    name = "C" if method == "threshold" else "γ"
    val = {}
    for spec, r in runs:
        if spec.method == method and spec.epsilon == eps and spec.replicate == 0:
            val[(spec.lr, spec.clip if method == "threshold" else spec.quantile)] = r["best"]
    if not val:
        return []
    out = [f"**{PAPER_NAMES[method]}, ε = {eps:g}** (best test value per cell; rows ρ, "
           f"columns {name})", "", "| ρ \\ " + name + " | " + " | ".join(f"{c:.4g}" for c in cols)
           + " |", "|---" * (len(cols) + 1) + "|"]
    for lr in lrs:
        cells = [_fmt(val.get((lr, c)), 3) if (lr, c) in val else "" for c in cols]
        out.append(f"| {lr:.4g} | " + " | ".join(cells) + " |")
    return out + [""]


def _paper_table(rows: list[dict], settings: Settings) -> list[str]:
    if settings.task != "autoencoder":
        return ["002 has no Fashion-MNIST classifier (its Table 3 is the autoencoder's): "
                "nothing to compare."]
    out = ["| ε | method | winner here (k grid of these runs) | 002 Table 3 (k = 7) |",
           "|---|---|---|---|"]
    for r in rows:
        if r["epsilon"] in PAPER_TABLE3 and r["method"] in PAPER_TABLE3[r["epsilon"]]:
            here = _hp(r["winner"]) if r["winner"] else "all diverged"
            out.append(f"| {r['epsilon']:g} | {PAPER_NAMES[r['method']]} | {here} | "
                       f"{PAPER_TABLE3[r['epsilon']][r['method']]} |")
    return out


def _plot_metric(rows: list[dict], settings: Settings, path: Path) -> None:
    import matplotlib  # local: only the figures need matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.6), dpi=90)
    nodp = [r for r in rows if r["method"] == "nodp" and r["values"]]
    for method in METHODS[:-1]:
        pts = [(r["epsilon"], *_mean_std(r["values"])) for r in rows
               if r["method"] == method and r["values"]]
        pts = [p for p in pts if p[1] is not None]
        if pts:
            x, m, s = zip(*sorted(pts))
            ax.errorbar(x, m, yerr=s, marker="o", capsize=3, label=PAPER_NAMES[method])
    if nodp:
        mean, _ = _mean_std(nodp[0]["values"])
        ax.axhline(mean, color="k", ls="--", lw=1, label="NoDP")
    ax.set_xlabel("ε per grid (δ = %g)" % settings.delta)
    ax.set_ylabel("best test MSE" if lower_is_better(settings) else "best test accuracy %")
    if lower_is_better(settings):
        ax.set_yscale("log")
    ax.legend(fontsize=7)
    ax.set_title(f"002 Fashion-MNIST comparison, {settings.task}, k = {settings.k} "
                 "(scaled down)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _plot_trajectories(rows: list[dict], path: Path) -> None:
    import matplotlib  # local: only the figures need matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(8, 3.2), dpi=90)
    for r in rows:
        if r["method"] != "online" or not r["winner"]:
            continue
        for i, tr in enumerate(t for t in r.get("trace", []) if t):
            label = f"ε={r['epsilon']:g}, ρ₁={r['winner'].lr:.3g}" if i == 0 else None
            color = f"C{sorted(PAPER_TABLE3).index(r['epsilon']) if r['epsilon'] in PAPER_TABLE3 else 5}"
            a.plot(tr["step"], tr["clip"], color=color, lw=1, label=label)
            b.plot(tr["step"], [r["winner"].lr * s for s in tr["lr_scale"]], color=color, lw=1,
                   label=label)
    a.set_ylabel("C_t")
    b.set_ylabel("ρ_t")
    for ax in (a, b):
        ax.set_xlabel("step")
        ax.set_yscale("log")
        ax.legend(fontsize=7)
    fig.suptitle("Online (OSO-DPSGD) winners: threshold and learning rate over training "
                 "(replicates overlaid)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def summarize(records: list[dict], settings: Settings, out: Path) -> list[Path]:
    """Write the tables and the two plots for ``settings``' runs; returns the paths."""
    out.mkdir(parents=True, exist_ok=True)
    rows = winner_rows(records, settings)
    runs = _mine(records, settings)
    s = settings
    lines = [f"# oso-fmnist tables (generated by `python -m experiments oso-fmnist --summarize`)", "",
             f"Task {s.task}; N = {s.train_size} training and {s.test_size} test images; "
             f"b = {s.batch_size} (q = {s.sample_rate:.4g}); T = {s.steps} steps; k = {s.k}; "
             f"δ = {s.delta:g}; Online ρ_c = ρ_r = {s.online_rate:.4g}.", "",
             "## Winners", ""] + _winner_table(rows, s) + ["", "## Winning cells vs 002 Table 3",
                                                            ""] + _paper_table(rows, s) + [
             "", "## Grids", ""]
    for eps in sorted({r["epsilon"] for r in rows if r["epsilon"] is not None}):
        for method in ("threshold", "quantile"):
            lines += _cell_table(runs, method, eps, s)
    for method in ("online", "adamwosm", "nodp"):
        for eps in sorted({sp.epsilon for sp, _ in runs if sp.method == method},
                          key=lambda e: -1 if e is None else e):
            cells = sorted((sp.lr if method != "adamwosm" else sp.clip, r["best"])
                           for sp, r in runs if sp.method == method and sp.epsilon == eps
                           and sp.replicate == 0)
            name = "C" if method == "adamwosm" else "ρ"
            eps_txt = "" if eps is None else f", ε = {eps:g}"
            lines.append(f"**{PAPER_NAMES[method]}{eps_txt}**: " + "; ".join(
                f"{name}={v:.4g}: {_fmt(b, 3)}" for v, b in cells) + "")
            lines.append("")
    name = stem(s)
    table = out / f"{name}_tables.md"
    table.write_text("\n".join(lines) + "\n")
    paths = [table]
    if any(r["values"] for r in rows):
        paths.append(out / f"{name}_metric_vs_eps.png")
        _plot_metric(rows, s, paths[-1])
        paths.append(out / f"{name}_online_trajectories.png")
        _plot_trajectories(rows, paths[-1])
    return paths
