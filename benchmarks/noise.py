"""Benchmark (not a test): the cost of one step's noise, secure against reproducible.

One DP-SGD step of the MLP benchmark model (784-256-10: 203,530 parameters) draws 203,530
Gaussians: ``NoiseSource.noisy_mean`` on a float32 tensor of that size, i.e. (S + N(0, σ²))/b in
one pass. Timed per backend at one thread (torch and the kernels), interleaved round by round in a
shuffled order so that load from other processes hits all backends alike; the table reports the
median and the minimum over the rounds. Also: ``secure_uniform`` for a 60,000-example Poisson
mask (what the sampler draws per step on Fashion-MNIST).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/noise.py [--rounds 400]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
import warnings
from typing import Callable

import torch

from dpfy.noise import NoiseSource, secure_uniform

PARAMS = 203_530  # MLP 784-256-10: 784·256 + 256 + 256·10 + 10
DATASET = 60_000


def rows() -> dict[str, Callable[[], object]]:
    total = torch.zeros(PARAMS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sources = {
            "secure, chacha20 (default)": NoiseSource(),
            "reproducible, xoshiro (seed)": NoiseSource(0),
            "secure fallback, urandom": NoiseSource(backend="urandom"),
            "reproducible fallback, torch": NoiseSource(0, backend="torch"),
        }
    out: dict[str, Callable[[], object]] = {
        f"noisy_mean {name}": (lambda s=src: s.noisy_mean(total, 1.0, 256.0))
        for name, src in sources.items()}
    out[f"secure_uniform({DATASET})"] = lambda: secure_uniform(DATASET)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=400)
    args = parser.parse_args()
    torch.set_num_threads(1)
    todo = rows()
    times: dict[str, list[float]] = {name: [] for name in todo}
    for fn in todo.values():  # warm-up: builds the library, touches the memory
        fn()
    order = list(todo)
    for _ in range(args.rounds):
        random.shuffle(order)
        for name in order:
            start = time.perf_counter()
            todo[name]()
            times[name].append(time.perf_counter() - start)
    print(f"{PARAMS:,} Gaussians per step, 1 thread, {args.rounds} rounds")
    print(f"{'':44s} {'median ms':>10s} {'min ms':>8s}")
    for name, ts in times.items():
        print(f"{name:44s} {1e3 * statistics.median(ts):10.3f} {1e3 * min(ts):8.3f}")


if __name__ == "__main__":
    main()
