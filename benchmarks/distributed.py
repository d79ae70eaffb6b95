"""Benchmark (not a test): a private step with 2 data-parallel processes vs 1, on this machine.

Same global run in both: an MLP (784-512-512-10, 0.67 M parameters), N = 60,000, expected
global batch 512 (q = 512/60000), σ = 1. One process draws the whole batch; two gloo processes
on 127.0.0.1 each draw half (their shards of the same Poisson masks) and all-reduce the clipped
sums once per step. Reports the median wall time of a step (after warm-up) and the speed-up.
On a 2-core machine shared with other work the speed-up is bounded by the free cores.

    .venv/bin/python benchmarks/distributed.py [--steps 30]
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

N, GLOBAL_BATCH = 60_000, 512


def _times(world: int, steps: int) -> list[float]:
    """Wall time of each private step after 5 warm-up steps (this rank)."""
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
    for k in range(steps + 5):
        t0 = time.perf_counter()
        x, y = next(it)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if k >= 5:
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
    args = ap.parse_args()
    torch.set_num_threads(1)
    one = statistics.median(_times(1, args.steps))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    mp.spawn(_worker, args=(port, args.steps, queue), nprocs=2, join=True)
    two = queue.get()
    print(f"private step, global batch {GLOBAL_BATCH}, 0.67 M parameters: 1 process "
          f"{one * 1e3:.1f} ms, 2 processes (gloo) {two * 1e3:.1f} ms, speed-up {one / two:.2f}x "
          f"(1 thread per process; load average {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
