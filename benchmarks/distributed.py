"""Benchmark (not a test): a private step with 2 data-parallel processes vs 1, on this machine.

Same global run in both: an MLP (784-512-512-10, 0.67 M parameters), N = 60,000, expected
global batch 512 (q = 512/60000), σ = 1. One process draws the whole batch; two gloo processes
on 127.0.0.1 each draw half (their shards of the same Poisson masks) and all-reduce the clipped
sums once per step. Reports the median wall time of a step (after warm-up) and the speed-up.
On a 2-core machine shared with other work the speed-up is bounded by the free cores.

    .venv/bin/python benchmarks/distributed.py [--steps 30]
    .venv/bin/python benchmarks/distributed.py --smoke   # N 256, batch 16, 2 steps (the tests)
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from _smoke import HELP, size

N, GLOBAL_BATCH = size(60_000, 256), size(512, 16)
WARM = size(5, 1)   # untimed steps before the timed ones


def _times(world: int, steps: int) -> list[float]:
    """Wall time of each private step after ``WARM`` warm-up steps (this rank)."""
    data = TensorDataset(torch.randn(N, 784), torch.randint(0, 10, (N,)))
    torch.manual_seed(0)
    model: nn.Module = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512),
                                     nn.ReLU(), nn.Linear(512, 10))
    if world > 1:
        model = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt, loader = dpfy.make_private(model, opt, DataLoader(
        data, batch_size=GLOBAL_BATCH // world), noise_multiplier=1.0, max_grad_norm=1.0)
    out, it = [], iter(loader)
    for k in range(steps + WARM):
        t0 = time.perf_counter()
        x, y = next(it)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if k >= WARM:
            out.append(time.perf_counter() - t0)
    return out


def _worker(rank: int, port: int, steps: int, queue: "mp.Queue[float]") -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    times = _times(2, steps)
    dist.destroy_process_group()
    if rank == 0:
        queue.put(statistics.median(times))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--smoke", action="store_true", help=HELP)
    args = ap.parse_args()
    if args.smoke:
        args.steps = 2
    torch.set_num_threads(1)
    one = statistics.median(_times(1, args.steps))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # The ranks fork from a server that imported torch and dpfy once (not timed either way:
    # spawning re-imports them in every rank, ~4 s of CPU each).
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch._dynamo", "dpfy"])
    queue = ctx.Queue()
    mp.start_processes(_worker, args=(port, args.steps, queue), nprocs=2, join=True,
                       start_method="forkserver")
    two = queue.get()
    print(f"private step, global batch {GLOBAL_BATCH} of N = {N}, 0.67 M parameters, median of "
          f"{args.steps} steps, 1 thread per process, load average {os.getloadavg()[0]:.1f}")
    print("| processes | median step (ms) | speed-up |\n|---|---:|---:|")
    print(f"| 1 | {one * 1e3:.1f} | 1.00 |\n| 2 (gloo) | {two * 1e3:.1f} | {one / two:.2f} |")


if __name__ == "__main__":
    main()
