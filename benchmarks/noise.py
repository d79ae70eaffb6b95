"""Benchmark (not a test): the Gaussian generators' throughput, and one step's noise.

Throughput: Gaussians per second of each generator drawing ``--draw`` values at a time, at one
thread and at torch's default thread count: the compiled C ChaCha20 sampler (single-threaded
by design), ChaCha20 in torch tensor operations on the CPU, ``torch.randn`` (not used by dpfy:
its tails stop at 5.77σ; the yardstick), and on CUDA, when present, torch ChaCha20 there,
torch's seeded Philox generator feeding the same transform, and ``torch.randn``.

One DP-SGD step of the MLP benchmark model (784-256-10: 203,530 parameters) draws 203,530
Gaussians: ``NoiseSource.noisy_mean`` on a float32 tensor of that size, i.e. (S + N(0, σ²))/b in
one pass. Timed per backend at one thread (torch and the kernels), interleaved round by round in a
shuffled order so that load from other processes hits all backends alike; the table reports the
median and the minimum over the rounds. Also: ``secure_uniform`` for a 60,000-example Poisson
mask (what the sampler draws per step on Fashion-MNIST).

    .venv/bin/python benchmarks/noise.py [--rounds 400] [--smoke]

``--smoke``: tiny sizes and a few rounds (seconds), for tests/test_benchmarks_smoke.py.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
import warnings
from typing import Callable

import torch

from dpfy.native.gaussian import ChaChaGaussian
from dpfy.noise import NoiseSource, secure_uniform
from dpfy.noise.device_gaussian import DeviceChaChaGaussian, DeviceSeededGaussian
from _machine import cpu_name

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
            "secure, torch ChaCha20 on the CPU": NoiseSource(backend="torch-chacha20"),
        }
    out: dict[str, Callable[[], object]] = {
        f"noisy_mean {name}": (lambda s=src: s.noisy_mean(total, 1.0, 256.0))
        for name, src in sources.items()}
    out[f"secure_uniform({DATASET})"] = lambda: secure_uniform(DATASET)
    return out


def generators(draw: int) -> dict[str, Callable[[], object]]:
    """Each generator drawing ``draw`` float32 N(0, 1) values (a fresh key or seed)."""
    buf = torch.empty(draw)
    c_chacha = ChaChaGaussian()
    torch_chacha = DeviceChaChaGaussian("cpu")
    out: dict[str, Callable[[], object]] = {
        "C ChaCha20 sampler (CPU, default there)": lambda: c_chacha.axpy_(buf, 0.0, 1.0),
        "torch ChaCha20 (CPU)": lambda: torch_chacha.normal(draw),
        "torch.randn (CPU, tails cut at 5.77σ)": lambda: torch.randn(draw),
    }
    if torch.cuda.is_available():
        cuda_chacha = DeviceChaChaGaussian("cuda")
        philox = DeviceSeededGaussian(0, "cuda")

        def synced(fn: Callable[[], object]) -> Callable[[], object]:
            def run() -> object:
                result = fn()
                torch.cuda.synchronize()
                return result
            return run

        out["torch ChaCha20 (CUDA, default there)"] = synced(lambda: cuda_chacha.normal(draw))
        out["Philox + same transform (CUDA, seeded)"] = synced(lambda: philox.normal(draw))
        out["torch.randn (CUDA)"] = synced(lambda: torch.randn(draw, device="cuda"))
    return out


def interleaved(todo: dict[str, Callable[[], object]], rounds: int) -> dict[str, list[float]]:
    """Seconds per call of each function, rounds interleaved in a shuffled order (so that load
    from other processes hits every row alike), after one warm-up call each."""
    times: dict[str, list[float]] = {name: [] for name in todo}
    for fn in todo.values():  # warm-up: builds the library, touches the memory
        fn()
    order = list(todo)
    for _ in range(rounds):
        random.shuffle(order)
        for name in order:
            start = time.perf_counter()
            todo[name]()
            times[name].append(time.perf_counter() - start)
    return times


def throughput_table(draw: int, rounds: int, default_threads: int) -> None:
    print(f"\nGaussians per second (millions), {draw:,} per call, median (best) of {rounds}")
    counts = sorted({1, default_threads})
    print("| generator | " + " | ".join(f"{t} thread{'s' * (t > 1)}" for t in counts) + " |")
    print("|---|" + "---|" * len(counts))
    results: dict[str, list[str]] = {}
    for threads in counts:
        torch.set_num_threads(threads)
        for name, ts in interleaved(generators(draw), rounds).items():
            results.setdefault(name, []).append(
                f"{draw / statistics.median(ts) / 1e6:.3g} ({draw / min(ts) / 1e6:.3g})"
            )
    for name, cells in results.items():
        print(f"| {name} | " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=400)
    parser.add_argument("--draw", type=int, default=1 << 20, help="Gaussians per call")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, seconds")
    args = parser.parse_args()
    default_threads = torch.get_num_threads()
    rounds, draw = (2, 1 << 12) if args.smoke else (args.rounds, args.draw)
    print(f"CPU: {cpu_name()}; torch {torch.__version__}, {default_threads} default threads"
          + (f"; CUDA: {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""))
    throughput_table(draw, max(3, rounds // 20), default_threads)
    torch.set_num_threads(1)
    times = interleaved(rows(), rounds)
    print(f"\nOne MLP step's noise: {PARAMS:,} Gaussians, 1 thread, {rounds} rounds")
    print("| noise | median ms | min ms |")
    print("|---|---|---|")
    for name, ts in times.items():
        print(f"| {name} | {1e3 * statistics.median(ts):.3f} | {1e3 * min(ts):.3f} |")


if __name__ == "__main__":
    main()
