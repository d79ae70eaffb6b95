"""The audit's power curve on the default Fashion-MNIST CNN run: noise planted at F = 0, 0.1,
0.25, 0.5, 0.75 and 1 × the claimed σ, read by every statistic of `dpfy.audit`.

Two parts (docs/audit.md, "Power on the default Fashion-MNIST run"):

1. **The full default run, simulated exactly.** A Dirac canary's coordinate is touched by no
   real example, so what the adversary sees of canary j at step t is exactly
   1[j in batch t] + F·σ·N(0, 1) in units of C, whatever the model and the data. This draws
   that view for the default `dpfy train` run as audited (60,000 images + ~500 included canary
   rows, b = 2,048, 40 epochs: T = 1,200 steps, σ calibrated by PLD to ε = 3 at δ = 1e-5),
   scores it with dpfy's per-step score and reads both lower bounds under both guessing rules
   (hull, grid) and the GDP estimate. SEEDS seeds per F, with m = 1,000 (the default) and
   4,000 canaries.
2. **The real runs** of fmnist_cnn_runs.py (the CNN, one epoch, through `audit_config`),
   re-read from their saved scores with both guessing rules.

Usage (about 5 CPU-minutes; ``--real-only`` skips the simulation):

    cd experiments/audit_power && PYTHONPATH=../../src python fmnist_cnn_curve.py \
        > fmnist_cnn_curve.txt
"""

from __future__ import annotations

import json
import resource
import sys
from pathlib import Path

import numpy as np
import torch
from dp_accounting import dp_event, pld

import dpfy
from dpfy.audit.canaries import step_scores
from dpfy.audit.fdp import fdp_epsilon
from dpfy.audit.gdp_estimate import gdp_estimate
from dpfy.audit.stats import one_run_epsilon
from dpfy.privacy.ledger import Sampling

HERE = Path(__file__).resolve().parent
SCALES = (1.0, 0.75, 0.5, 0.25, 0.1, 0.0)
SEEDS = 20
DELTA = 1e-5
N_AUDITED = 60_000 + 502  # the training set plus the included canaries (502 of 1,000 at seed 0)
BATCH = 2048


def view(q: float, sigma: float, steps: int, m: int, scale: float, seed: int) -> tuple:
    """Summed per-step scores of m Dirac canaries and their secret bits (module docstring)."""
    rng = np.random.default_rng(seed)
    included = rng.random(m) < 0.5
    total = torch.zeros(m, dtype=torch.float64)
    for _ in range(steps):
        x = (included & (rng.random(m) < q)) + scale * sigma * rng.standard_normal(m)
        total += step_scores(torch.from_numpy(x), sample_rate=q, noise_multiplier=sigma)
    return total.numpy(), included


def read(scores: np.ndarray, included: np.ndarray) -> dict:
    """Every statistic the audit has, on one run's scores."""
    out = {}
    for rule in ("hull", "grid"):
        out[f"one_run_{rule}"] = one_run_epsilon(
            scores, included, delta=DELTA, guesses=rule
        ).epsilon
        out[f"fdp_{rule}"] = fdp_epsilon(scores, included, delta=DELTA, guesses=rule).epsilon
    est = gdp_estimate(scores, included, delta=DELTA)
    out["gdp"], out["gdp_low"] = est.epsilon, est.epsilon_low
    return out


def summarize(rows: list[dict], claim: float) -> str:
    """Median bounds and how often each exceeds the claim (rigorous) / flags (estimate)."""

    def cell(key: str) -> str:
        vals = np.array([r[key] for r in rows])
        return f"{np.median(vals):.3g} ({int((vals > claim).sum())}/{len(vals)})"

    hull = max_of(rows, "one_run_hull", "fdp_hull", claim)
    two = max_of(rows, "one_run_grid", "fdp_grid", claim)
    low = np.array([r["gdp_low"] for r in rows])
    return (
        f"| {cell('one_run_hull')} | {cell('fdp_hull')} | {hull} | {cell('one_run_grid')} "
        f"| {cell('fdp_grid')} | {two} | {np.median([r['gdp'] for r in rows]):.3g} "
        f"| {int((low > claim).sum())}/{len(low)} |"
    )


def max_of(rows: list[dict], a: str, b: str, claim: float) -> str:
    hit = sum(max(r[a], r[b]) > claim for r in rows)
    return f"**{hit}/{len(rows)}**"


HEADER = (
    "| F | one-run, hull: median (runs above the claim) | f-DP, hull | caught, hull | "
    "one-run, grid | f-DP, grid | caught, grid | GDP estimate (median) "
    "| flagged by the estimate |\n|---|---|---|---|---|---|---|---|---|"
)


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    torch.set_num_threads(1)
    q = BATCH / N_AUDITED
    simulated = () if "--real-only" in sys.argv else ((40, (1000, 4000), SEEDS),)
    for epochs, m_values, seeds in simulated:
        steps = epochs * -(-N_AUDITED // BATCH)
        sigma = dpfy.calibrate_noise_multiplier(
            target_epsilon=3.0,
            delta=DELTA,
            sample_rate=q,
            steps=steps,
            accountant="pld",
            sampling=Sampling.POISSON,
        )
        acc = pld.PLDAccountant(value_discretization_interval=1e-4)  # the claim, independently
        acc.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma)), steps)
        claim = acc.get_epsilon(DELTA)
        for m in m_values:
            print(
                f"\n### Simulated: q = {q:.5f}, σ = {sigma:.4f}, T = {steps}, δ = {DELTA:g}, "
                f"m = {m}, claimed ε = {claim:.3f}, {seeds} seeds per F\n\n{HEADER}",
                flush=True,
            )
            for scale in SCALES:
                rows = [read(*view(q, sigma, steps, m, scale, 1000 + s)) for s in range(seeds)]
                print(f"| {scale:g} {summarize(rows, claim)}  cpu {cpu():.0f}s", flush=True)
    runs_file, scores_file = HERE / "fmnist_cnn_runs.json", HERE / "fmnist_cnn_scores.npz"
    if not scores_file.exists():
        print("\n(no real runs saved yet: run fmnist_cnn_runs.py)")
        return
    runs = (
        {r["F"]: r for r in json.loads(runs_file.read_text())["runs"]} if runs_file.exists() else {}
    )
    saved = np.load(scores_file)
    print("\n### Real runs (the CNN, 1 epoch, 30 steps, seed 0, m = 1,000), re-read\n")
    print(
        "| F | claimed ε | one-run hull | f-DP hull | one-run grid | f-DP grid | "
        "GDP estimate [lower limit] |\n|---|---|---|---|---|---|---|"
    )
    for scale in SCALES:
        key = f"F{scale:g}"
        if f"{key}_scores" not in saved:
            continue
        r = read(saved[f"{key}_scores"], saved[f"{key}_included"])
        c = runs.get(scale, {}).get("claimed_epsilon", float("nan"))
        print(
            f"| {scale:g} | {c:.3f} | {r['one_run_hull']:.3f} | {r['fdp_hull']:.3f} | "
            f"{r['one_run_grid']:.3f} | {r['fdp_grid']:.3f} | {r['gdp']:.3g} "
            f"[{r['gdp_low']:.3g}] |",
            flush=True,
        )
    print(f"\ncpu {cpu():.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
