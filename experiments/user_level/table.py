"""Render run.py's rows.jsonl as a Markdown table: mean ± std over seeds per cell and ε.

    PYTHONPATH=src python experiments/user_level/table.py experiments/user_level/results
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def _mean_std(values):
    if not values:
        return "—"
    if len(values) == 1:
        return f"{values[0]:.4g}"
    return f"{statistics.mean(values):.4g} ± {statistics.stdev(values):.2g}"


def render(rows) -> str:
    cells = defaultdict(list)
    for r in rows:
        if "target_user_epsilon" in r:
            cells[(r["cell"], r["target_user_epsilon"])].append(r)
    out = ["| cell | target ε | seeds | test accuracy | user-level ε (PLD) | unit | note |",
           "|---|---|---|---|---|---|---|"]
    for (cell, eps), rs in sorted(cells.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        done = [r for r in rs if r.get("test_accuracy") is not None]
        note = rs[0].get("status", "")
        if cell.startswith("a:") and done:
            r0 = done[0]
            note = (f"target is the example-level ε; example-level ε (PLD) "
                    f"{_mean_std([r['example_level_epsilon'] for r in done])}, read at the "
                    f"user level by group privacy over k = {r0['group_size']} examples, "
                    f"user-level δ = {r0['user_level_delta']:.3g}")
        if cell.startswith("b: ELS") and "(σ by PLD)" not in cell and done and "k=1" not in cell:
            note = "σ by the RDP bound (far from tight for ELS, k > 1): not used to compare"
        out.append(f"| {cell} | {eps:g} | {len(done)} | "
                   f"{_mean_std([r['test_accuracy'] for r in done])} | "
                   f"{_mean_std([r['user_level_epsilon'] for r in done])} | {rs[0]['unit']} | "
                   f"{note[:160]} |")
    failed = [r for r in rows if "target_user_epsilon" not in r]
    for r in failed:
        out.append(f"| {r['cell']} (seed {r['seed']}) | — | 0 | — | — | — | {r['status'][:160]} |")
    return "\n".join(out)


if __name__ == "__main__":
    folder = Path(sys.argv[1])
    rows = [json.loads(line) for line in (folder / "rows.jsonl").read_text().splitlines()
            if line.strip()]
    print(render(rows))
