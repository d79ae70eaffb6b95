"""Markdown tables and claim verdicts from run.py's results.json.

    .venv/bin/python experiments/correlated_noise/table.py experiments/correlated_noise/results.json
"""

from __future__ import annotations

import json
import statistics
import sys


def main(path: str) -> None:
    results = json.loads(open(path).read())
    eps = sorted({r["epsilon"] for r in results.values()})
    mechs = list(dict.fromkeys(r["mechanism"] for r in results.values()))
    mean = {(r["mechanism"], r["epsilon"]): statistics.mean(r["test_accuracy"])
            for r in results.values()}
    print("| mechanism | " + " | ".join(f"ε = {e:g}: test acc (σ, lr)" for e in eps) + " |")
    print("|---|" + "---|" * len(eps))
    for m in mechs:
        cells = []
        for e in eps:
            r = results.get(f"{m}@{e:g}")
            if r is None:
                cells.append("not run")
                continue
            acc = r["test_accuracy"]
            sd = statistics.stdev(acc) if len(acc) > 1 else 0.0
            cells.append(f"{100 * statistics.mean(acc):.1f} ± {100 * sd:.1f} "
                         f"(σ {r['noise_multiplier']:.3g}, lr {r['lr']:g})")
        print(f"| {m} | " + " | ".join(cells) + " |")
    print()
    for e in eps:
        tree, unamp = mean.get(("tree_shuffle", e)), mean.get(("dpsgd_shuffle_unamplified", e))
        if tree is not None and unamp is not None:
            print(f"- ε = {e:g}: tree − unamplified DP-SGD = {100 * (tree - unamp):+.1f} points")
        base = mean.get(("dpsgd_poisson", e))
        for m in mechs:
            if m.startswith("bandmf") and (m, e) in mean and base is not None:
                print(f"- ε = {e:g}: {m} − DP-SGD (Poisson) = "
                      f"{100 * (mean[(m, e)] - base):+.1f} points")
    per_step = {m: statistics.median(s for r in results.values() if r["mechanism"] == m
                                     for s in r["seconds_per_step"]) for m in mechs}
    print("\nmedian wall seconds per step (shared machine, see README):",
          {m: round(v, 3) for m, v in per_step.items()})


if __name__ == "__main__":
    main(sys.argv[1])
