"""Benchmark (not a test): what a new user waits for on the first day.

Three waits, each the median of ``--repeats`` runs, wall and CPU seconds (on a machine shared
with other jobs the wall time grows with the load, the CPU time much less):

- calibration: σ for ε = 3 at δ = 1e-5 with PLD for a homogeneous Poisson run (q = 256/60000,
  40 epochs = 9,400 steps: ``make_private(target_epsilon=3, ...)``'s search); target ≤ 2 s;
- ``optimizer.epsilon(δ)`` with PLD after a few private steps, called again with nothing changed
  since the last call; target ≤ 20 ms;
- ``dpfy --help`` in a fresh process; target ≤ 1 s.

    .venv/bin/python benchmarks/first_day.py              # full sizes
    .venv/bin/python benchmarks/first_day.py --smoke      # tiny sizes, seconds (tests)
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import warnings
from typing import Callable

Q, DELTA, STEPS = 256 / 60000, 1e-5, 9400


def _cpu() -> float:
    """CPU seconds of this process and its finished children (``dpfy --help`` runs in one)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def timed(fn: Callable[[], object], repeats: int) -> tuple[float, float]:
    """Median wall and CPU seconds of ``repeats`` calls of ``fn``."""
    wall, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), _cpu()
        fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(_cpu() - c0)
    return statistics.median(wall), statistics.median(cpu)


def calibration(steps: int) -> Callable[[], float]:
    from dpfy.privacy import accountants, calibrate_noise_multiplier, pld, rdp

    def run() -> float:   # cold: no ε cached from an earlier repeat
        rdp.atom_rdp.cache_clear()
        pld._atom_pld.cache_clear()
        accountants._epsilon_cached.cache_clear()
        return calibrate_noise_multiplier(target_epsilon=3.0, delta=DELTA, sample_rate=Q,
                                          steps=steps, accountant="pld")
    return run


def repeated_epsilon(steps: int) -> Callable[[], float]:
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    import dpfy

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(512, 10), torch.randint(0, 2, (512,)))
    model = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 2))
    model, opt, loader = dpfy.make_private(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                           DataLoader(data, batch_size=64),
                                           noise_multiplier=1.0)
    it = iter(loader)
    for _ in range(steps):
        x, y = next(it)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    opt.epsilon(DELTA)    # the first call after the last step composes the ledger
    return lambda: opt.epsilon(DELTA)


def cli_help() -> None:
    subprocess.run([sys.executable, "-m", "dpfy", "--help"], check=True,
                   stdout=subprocess.DEVNULL)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--smoke", action="store_true",
                    help="200 calibration steps, 2 training steps, one repeat (the test suite)")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    repeats = 1 if args.smoke else args.repeats
    rows = [   # (name, set-up returning the timed call, target); each set up just before timing
        ("calibration (PLD, σ for ε = 3)", lambda: calibration(200 if args.smoke else STEPS),
         "2 s"),
        ("optimizer.epsilon(), unchanged", lambda: repeated_epsilon(2 if args.smoke else 8),
         "0.02 s"),
        ("dpfy --help (fresh process)", lambda: cli_help, "1 s"),
    ]
    print("| wait | wall s | CPU s | target |")
    print("|---|---|---|---|")
    for name, setup, target in rows:
        wall, cpu = timed(setup(), repeats)
        print(f"| {name} | {wall:.3f} | {cpu:.3f} | ≤ {target} |", flush=True)


if __name__ == "__main__":
    main()
