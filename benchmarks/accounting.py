"""Benchmark (not a test): time and ε of privacy accounting, dpfy vs dp_accounting vs Opacus.

Two ledgers, both with q = 256/60000 (Fashion-MNIST/MNIST batch 256) and δ = 1e-5:

  (a) 10,000 identical steps at σ = 1.1;
  (b) 1,000 distinct σ's: an exponential decay from 2.0 to 0.8 over 15 epochs (3,516 steps),
      the level changing every ~3.5 steps.

For each, the time of one ε computation and of one noise calibration (σ for ε = 3 in (a), the
schedule's scale s for ε = 1.2 in (b)), for dpfy's RDP / PLD / GDP accountants (default
settings: (b) is coarsened, σ rounded down) and, in the same run, dp_accounting's RDP and PLD
accountants and Opacus's RDP and PRV accountants on the exact ledger. Runs are interleaved
(one pass over all tools, repeated) so that load from other processes hits all tools alike;
the table reports the median time.

    .venv/bin/python benchmarks/accounting.py                  # full run (~10 min on 2 cores)
    .venv/bin/python benchmarks/accounting.py --quick          # skip the slow references
    .venv/bin/python benchmarks/accounting.py --smoke          # tiny ledgers, seconds (tests)

A second table times ``calibrate_noise_multiplier(accountant="pld")`` (what
``make_private(target_epsilon=...)`` runs) on a few homogeneous Poisson runs, cold caches, CPU
seconds, and checks each σ with dp_accounting's PLD at the fine 1e-4 grid (ε ≤ target). With
``--before-src DIR`` the same runs are timed, in a subprocess, with the dpfy found in DIR (e.g.
an older checkout's ``src``), and shown beside:

    .venv/bin/python benchmarks/accounting.py --calibration-only --before-src /tmp/old/src
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from typing import Callable

import numpy as np

Q, DELTA, N, BATCH = 256 / 60000, 1e-5, 60000, 256
STEPS_A, SIGMA_A = 10_000, 1.1
EPOCHS_B, LEVELS_B = 15, 1000


def schedule_b() -> np.ndarray:
    steps = int(np.ceil(EPOCHS_B * N / BATCH))                     # 3516
    levels = np.geomspace(2.0, 0.8, LEVELS_B)
    return levels[(np.arange(steps) * LEVELS_B) // steps]          # (steps,)


# -- the tools ------------------------------------------------------------------------------
def dpfy_epsilon(accountant: str, sigmas: np.ndarray, **kw) -> float:
    from dpfy.privacy import Ledger, epsilon
    ledger = Ledger.from_schedule(sample_rates=[Q] * len(sigmas), noise_multipliers=sigmas)
    return epsilon(ledger, delta=DELTA, accountant=accountant, **kw)


def dpfy_homogeneous(accountant: str) -> float:
    from dpfy.privacy import Ledger, epsilon
    return epsilon(Ledger.homogeneous(sample_rate=Q, noise_multiplier=SIGMA_A, steps=STEPS_A),
                   delta=DELTA, accountant=accountant)


def _dp_event(sigmas: np.ndarray):
    import dp_accounting
    values, counts = _runs(sigmas)
    return dp_accounting.ComposedDpEvent([
        dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(Q, dp_accounting.GaussianDpEvent(float(s))), c)
        for s, c in zip(values, counts)])


def _runs(sigmas: np.ndarray) -> tuple[list[float], list[int]]:
    values, counts = [], []
    for s in sigmas:
        if values and values[-1] == s:
            counts[-1] += 1
        else:
            values.append(float(s))
            counts.append(1)
    return values, counts


def dp_accounting_epsilon(kind: str, sigmas: np.ndarray) -> float:
    from dp_accounting import pld, rdp
    acc = rdp.RdpAccountant() if kind == "rdp" else pld.PLDAccountant(
        value_discretization_interval=1e-4)
    acc.compose(_dp_event(sigmas))
    return float(acc.get_epsilon(DELTA))


def opacus_epsilon(kind: str, sigmas: np.ndarray) -> float:
    from opacus.accountants import PRVAccountant, RDPAccountant
    acc = RDPAccountant() if kind == "rdp" else PRVAccountant()
    values, counts = _runs(sigmas)
    acc.history = [(s, Q, c) for s, c in zip(values, counts)]
    return float(acc.get_epsilon(DELTA))


def dpfy_calibrate_a(accountant: str) -> float:
    from dpfy.privacy.calibration import calibrate_noise_multiplier
    return calibrate_noise_multiplier(target_epsilon=3.0, delta=DELTA, sample_rate=Q,
                                      steps=STEPS_A, accountant=accountant,
                                      approximate=accountant == "gdp")


def dp_accounting_calibrate_a() -> float:
    import dp_accounting
    from dp_accounting import rdp

    def make_event(sigma: float):
        return dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(Q, dp_accounting.GaussianDpEvent(sigma)),
            STEPS_A)
    return float(dp_accounting.calibrate_dp_mechanism(
        rdp.RdpAccountant, make_event, 3.0, DELTA,
        dp_accounting.LowerEndpointAndGuess(0.1, 1.0), tol=1e-3))


def opacus_calibrate_a(kind: str) -> float:
    from opacus.accountants.utils import get_noise_multiplier
    return float(get_noise_multiplier(target_epsilon=3.0, target_delta=DELTA, sample_rate=Q,
                                      steps=STEPS_A, accountant=kind, epsilon_tolerance=0.003))


def dpfy_calibrate_b(accountant: str) -> float:
    from dpfy.privacy.calibration import calibrate_schedule_scale
    return calibrate_schedule_scale(shape=schedule_b(), target_epsilon=1.2, delta=DELTA,
                                    sample_rate=Q, accountant=accountant,
                                    approximate=accountant == "gdp")


# -- calibration of homogeneous runs (issue 31 §4: ≤ 2 s) --------------------------------------
CALIBRATION_RUNS = [  # (q, steps, target ε) at δ = 1e-5
    (256 / 60000, 9400, 3.0),    # Fashion-MNIST batch 256, 40 epochs
    (0.01, 1000, 3.0),
    (1.0, 100, 3.0),             # full batch: no sampling, closed form
    (0.128, 16, 1.0),            # tests/integration's re-cut scenario a
    (0.001, 10000, 8.0),         # small q, small σ: the slowest PLD evaluations
]
SMOKE_CALIBRATION_RUNS = [(0.5, 10, 3.0)]


def time_calibrations(runs: list[tuple[float, int, float]]) -> list[dict]:
    """σ, CPU and wall seconds of each PLD calibration, caches emptied before each."""
    from dpfy.privacy import accountants as _acc
    from dpfy.privacy import pld as _pld
    from dpfy.privacy import rdp as _rdp
    from dpfy.privacy.calibration import calibrate_noise_multiplier
    out = []
    for q, steps, target in runs:
        for cache in (_rdp.atom_rdp, _pld._atom_pld, _pld._mixture_pld, _acc._epsilon_cached):
            cache.cache_clear()
        t0, c0 = time.perf_counter(), time.process_time()
        sigma = calibrate_noise_multiplier(target_epsilon=target, delta=DELTA, sample_rate=q,
                                           steps=steps, accountant="pld")
        out.append({"q": q, "steps": steps, "target": target, "sigma": sigma,
                    "cpu": time.process_time() - c0, "wall": time.perf_counter() - t0})
    return out


def dp_accounting_fine_epsilon(q: float, sigma: float, steps: int) -> float:
    """ε of ``steps`` Poisson-subsampled Gaussian steps by dp_accounting's PLD at 1e-4."""
    import dp_accounting
    from dp_accounting import pld
    acc = pld.PLDAccountant(value_discretization_interval=1e-4)
    acc.compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps))
    return float(acc.get_epsilon(DELTA))


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            model = next(l.split(":", 1)[1].strip() for l in fh if l.startswith("model name"))
    except (OSError, StopIteration):
        import platform
        model = platform.processor() or platform.machine()
    import os
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return f"{model}, {os.cpu_count()} logical cores, load average {load:.2f}"


def calibration_table(runs: list[tuple[float, int, float]], before_src: str | None) -> None:
    before = None
    if before_src:
        import os
        import subprocess
        env = {**os.environ, "PYTHONPATH": before_src}
        done = subprocess.run([sys.executable, __file__, "--calibration-json", json.dumps(runs)],
                              env=env, capture_output=True, text=True, check=True)
        before = json.loads(done.stdout.strip().splitlines()[-1])
    after = time_calibrations(runs)
    print(f"\nPLD calibration, σ for a target ε at δ = {DELTA:g}, cold caches; CPU: {cpu_name()}")
    head = "| q | steps | target ε |"
    if before:
        head += " before σ | before CPU s |"
    head += " σ | CPU s | wall s | dp_accounting ε at σ (1e-4) |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for i, r in enumerate(after):
        row = f"| {r['q']:.4g} | {r['steps']} | {r['target']:g} |"
        if before:
            b = before[i]
            row += f" {b['sigma']:.5f} | {b['cpu']:.2f} |"
        fine = dp_accounting_fine_epsilon(r["q"], r["sigma"], r["steps"])
        row += f" {r['sigma']:.5f} | {r['cpu']:.2f} | {r['wall']:.2f} | {fine:.4f} |"
        print(row, flush=True)


# -- harness ---------------------------------------------------------------------------------
def measure(tasks: dict[str, Callable[[], float]], repeats: dict[str, int]) -> dict[str, dict]:
    """Run every task ``repeats[name]`` times, interleaved round-robin.

    Reports the median wall time and the median CPU time of the process (``process_time``):
    on a machine shared with other jobs the wall time grows with the load, the CPU time much
    less, so both are shown.
    """
    times: dict[str, list[float]] = {k: [] for k in tasks}
    cpu: dict[str, list[float]] = {k: [] for k in tasks}
    values: dict[str, float] = {}
    for r in range(max(repeats.values())):
        for name, fn in tasks.items():
            if r >= repeats[name]:
                continue
            t0, c0 = time.perf_counter(), time.process_time()
            values[name] = fn()
            times[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
            print(f"  {name}: {values[name]:.4f} in {times[name][-1]:.2f} s "
                  f"(cpu {cpu[name][-1]:.2f} s)", file=sys.stderr, flush=True)
    return {k: {"value": values[k], "seconds": statistics.median(times[k]),
                "cpu_seconds": statistics.median(cpu[k]), "runs": len(times[k])}
            for k in tasks}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="skip the slow references on ledger (b) (dp_accounting PLD, "
                             "Opacus PRV, exact dpfy)")
    parser.add_argument("--repeats", type=int, default=3, help="repeats of the fast tasks")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny ledgers (50 and 40 steps), one repeat, no slow references: "
                             "checks that the script runs (the test suite runs it)")
    parser.add_argument("--calibration-only", action="store_true",
                        help="print only the PLD calibration table")
    parser.add_argument("--before-src", metavar="DIR",
                        help="also time the calibrations with the dpfy in DIR (its src/)")
    parser.add_argument("--calibration-json", metavar="RUNS", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.calibration_json:   # the --before-src subprocess
        print(json.dumps(time_calibrations([tuple(r) for r in json.loads(args.calibration_json)])))
        return
    runs = SMOKE_CALIBRATION_RUNS if args.smoke else CALIBRATION_RUNS
    if args.calibration_only:
        calibration_table(runs, args.before_src)
        return
    if args.smoke:
        global STEPS_A, EPOCHS_B, LEVELS_B
        STEPS_A, EPOCHS_B, LEVELS_B = 50, 0.2, 10
        args.quick, args.repeats = True, 1
    warnings.filterwarnings("ignore")
    sig_b = schedule_b()
    sig_a = np.full(STEPS_A, SIGMA_A)
    fast, slow = args.repeats, 1

    tasks: dict[str, Callable[[], float]] = {
        "a/eps/dpfy rdp": lambda: dpfy_homogeneous("rdp"),
        "a/eps/dpfy pld": lambda: dpfy_homogeneous("pld"),
        "a/eps/dpfy gdp (approx.)": lambda: dpfy_homogeneous("gdp"),
        "a/eps/dp_accounting rdp": lambda: dp_accounting_epsilon("rdp", sig_a),
        "a/eps/dp_accounting pld": lambda: dp_accounting_epsilon("pld", sig_a),
        "a/eps/opacus rdp": lambda: opacus_epsilon("rdp", sig_a),
        "a/eps/opacus prv": lambda: opacus_epsilon("prv", sig_a),
        "a/cal/dpfy rdp": lambda: dpfy_calibrate_a("rdp"),
        "a/cal/dpfy pld": lambda: dpfy_calibrate_a("pld"),
        "a/cal/dpfy gdp (approx.)": lambda: dpfy_calibrate_a("gdp"),
        "a/cal/dp_accounting rdp": dp_accounting_calibrate_a,
        "a/cal/opacus rdp": lambda: opacus_calibrate_a("rdp"),
        "a/cal/opacus prv": lambda: opacus_calibrate_a("prv"),
        "b/eps/dpfy rdp": lambda: dpfy_epsilon("rdp", sig_b),
        "b/eps/dpfy pld": lambda: dpfy_epsilon("pld", sig_b),
        "b/eps/dpfy gdp (approx.)": lambda: dpfy_epsilon("gdp", sig_b),
        "b/eps/dpfy rdp exact": lambda: dpfy_epsilon("rdp", sig_b, sigma_resolution=None),
        "b/eps/dp_accounting rdp": lambda: dp_accounting_epsilon("rdp", sig_b),
        "b/eps/opacus rdp": lambda: opacus_epsilon("rdp", sig_b),
        "b/cal/dpfy rdp": lambda: dpfy_calibrate_b("rdp"),
        "b/cal/dpfy pld": lambda: dpfy_calibrate_b("pld"),
        "b/cal/dpfy gdp (approx.)": lambda: dpfy_calibrate_b("gdp"),
    }
    if not args.quick:
        tasks.update({
            "b/eps/dpfy pld exact (1e-3)": lambda: dpfy_epsilon(
                "pld", sig_b, sigma_resolution=None, value_discretization=1e-3),
            "b/eps/dp_accounting pld": lambda: dp_accounting_epsilon("pld", sig_b),
            "b/eps/opacus prv": lambda: opacus_epsilon("prv", sig_b),
        })
    if args.smoke:   # dpfy's own fast tasks only: the harness and each code path run
        tasks = {k: fn for k, fn in tasks.items() if "dpfy" in k and "exact" not in k
                 and not (k.startswith("b/cal") and "gdp" not in k)}
    slow_names = {k for k in tasks if ("exact" in k or k.startswith("b/cal") or
                                        k in ("b/eps/dp_accounting pld", "b/eps/opacus prv",
                                              "b/eps/dp_accounting rdp", "b/eps/opacus rdp"))}
    repeats = {k: (slow if k in slow_names else fast) for k in tasks}
    # The dpfy timings must not profit from caches filled by an earlier identical call: clear
    # dpfy's per-atom caches before each dpfy task.
    from dpfy.privacy import accountants as _acc
    from dpfy.privacy import pld as _pld
    from dpfy.privacy import rdp as _rdp

    def cold(fn: Callable[[], float]) -> Callable[[], float]:
        def run() -> float:
            _rdp.atom_rdp.cache_clear()
            _pld._atom_pld.cache_clear()
            _acc._epsilon_cached.cache_clear()
            return fn()
        return run
    tasks = {k: (cold(fn) if "dpfy" in k else fn) for k, fn in tasks.items()}
    results = measure(tasks, repeats)

    print("| ledger | task | tool | result | wall s | CPU s |")
    print("|---|---|---|---|---|---|")
    for name, r in results.items():
        ledger, task, tool = name.split("/")
        what = {"eps": "ε", "cal": "σ for ε=3" if ledger == "a" else "scale s for ε=1.2"}[task]
        print(f"| ({ledger}) | {what} | {tool} | {r['value']:.4f} | {r['seconds']:.2f} | "
              f"{r['cpu_seconds']:.2f} |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=2)
    calibration_table(runs, args.before_src)


if __name__ == "__main__":
    main()
