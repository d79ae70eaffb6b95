"""Correlated-noise benchmark: step time and memory of BandMF and DP-FTRL's tree against DP-SGD.

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/correlated_noise.py [--rounds 15]
    .venv/bin/python benchmarks/correlated_noise.py --smoke   # batch 8, one round (the tests)

CPU, one thread, batch 256, Fashion-MNIST-shaped input, the tanh CNN and a 784-256-10 MLP (the
models of benchmarks/engine.py). Rows: DP-SGD (``noise="gaussian"``), the tree
(``noise="tree"``, 64 steps per pass) and BandMF with b ∈ {1, 4, 16, 64}, all with secure
(ChaCha20) noise as users get it by default. All rows of a model run in ONE process,
*interleaved*: each round times one step of every row in a fresh random order (seeded), after
one untimed warm step of the same row, and we report the median over rounds of wall and process
CPU time. A step is zero_grad + forward + loss + backward + optimizer.step on one fixed batch
(data loading excluded), as in engine.py.

Because the same batch is stepped again and again, the mechanisms' sampler-position check is
switched off here (``mechanism.sampler_position = None``): this times the step, it is not a
private run.

Memory: "noise state" is what the mechanism keeps between steps (BandMF's b − 1 buffered noise
vectors, filled to that steady state before timing so every timed step runs the whole
recursion; the tree's nodes, at most ⌈log2(P + 1)⌉), counted exactly from its buffers after
the timed rounds; "peak" is
the largest tensor memory allocated during one step above its start (torch profiler, as in
engine.py), which includes the step's fresh noise draw.
"""

from __future__ import annotations

import argparse
import random
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dpfy  # noqa: E402
from _smoke import HELP  # noqa: E402
from engine import BATCH, CLIP, SIGMA, make_model, peak_bytes  # noqa: E402

ROWS = {"dp-sgd": {"noise": "gaussian"}, "tree (P=64)": {"noise": "tree"},
        **{f"bandmf b={b}": {"noise": "bandmf", "bands": b} for b in (1, 4, 16, 64)}}
PASS_STEPS = 64   # dataset of 64 batches: the tree's pass, and room for 64 BandMF groups


def row(model_name: str, kwargs: dict) -> tuple[Callable[[], None], object]:
    model, x, y = make_model(model_name)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    n = PASS_STEPS * BATCH
    loader = DataLoader(TensorDataset(torch.zeros(n), torch.zeros(n)), batch_size=BATCH)
    model, opt, dl = dpfy.make_private(model, opt, loader, noise_multiplier=SIGMA,
                                       max_grad_norm=CLIP, **kwargs)
    opt.mechanism.sampler_position = None     # fixed batch: timing only (module docstring)
    dl.cursor.indices = torch.arange(BATCH)

    def step() -> None:
        dl.cursor.pending = 1
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()
    step()
    steady_state(opt.mechanism)
    return step, opt.mechanism


def steady_state(mechanism: object) -> None:
    """Fill BandMF's buffer to its steady b − 1 vectors per parameter (copies of the first
    draw), so every timed step does the full recursion: timing only, not a private run."""
    bands = getattr(mechanism, "coefficients", None)
    if bands is None:
        return
    for slot in mechanism.buffers:
        while slot and len(slot) < bands.numel() - 1:
            slot.append(slot[0].clone())


def state_bytes(mechanism: object) -> int:
    buffers = getattr(mechanism, "buffers", [])
    return sum(t.numel() * t.element_size() for slot in buffers for t in slot)


def bench(model_name: str, rounds: int) -> None:
    steps = {name: row(model_name, kw) for name, kw in ROWS.items()}
    wall = {name: [] for name in ROWS}
    cpu = {name: [] for name in ROWS}
    order = list(ROWS)
    rng = random.Random(0)
    for _ in range(rounds):
        rng.shuffle(order)
        for name in order:
            step = steps[name][0]
            step()                                   # warm: follow a step of the same row
            c0, t0 = time.process_time(), time.perf_counter()
            step()
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
    peaks = {name: peak_bytes(steps[name][0]) for name in ROWS}
    base_wall, base_cpu = statistics.median(wall["dp-sgd"]), statistics.median(cpu["dp-sgd"])
    params = sum(p.numel() for p in make_model(model_name)[0].parameters())
    print(f"\n{model_name} ({params:,} parameters), batch {BATCH}, {rounds} rounds, 1 thread")
    print("| row | wall ms | × DP-SGD | CPU ms | × DP-SGD | noise state MiB | peak MiB |")
    print("|---|---|---|---|---|---|---|")
    for name in ROWS:
        w, c = statistics.median(wall[name]), statistics.median(cpu[name])
        print(f"| {name} | {w * 1e3:.1f} | {w / base_wall:.2f} | {c * 1e3:.1f} | "
              f"{c / base_cpu:.2f} | {state_bytes(steps[name][1]) / 2**20:.2f} | "
              f"{peaks[name] / 2**20:.1f} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--models", default="cnn,mlp")
    p.add_argument("--smoke", action="store_true", help=HELP)
    args = p.parse_args()
    if args.smoke:
        args.rounds = 1
    torch.set_num_threads(1)
    for name in args.models.split(","):
        bench(name, args.rounds)
    print(f"\nmax RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
