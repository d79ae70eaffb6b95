"""Benchmark (not a test): the seconds of one DP-FedAvg server round, ``finish_round``.

What is timed: the server's side of one round for ``--users`` replies to a model of
``--width``² + ``--width`` + ``--width``·10 + 10 parameters (two linear layers): the replies'
checks, the sum over users, the noise (σ = 1) and the server's SGD step; not the users' local
training. The replies are random deltas clipped to C, made once; each round reuses them (a fresh
``begin_round`` each time, every user sampled, q_u = 1). Secure noise (no seed), the default.
The median and minimum over ``--rounds`` rounds are printed, with the machine, the device and
torch's thread count. Run it twice with ``PYTHONPATH`` at two checkouts to compare them.

    PYTHONPATH=src .venv/bin/python benchmarks/federated_round.py [--users 32] [--width 1000]
        [--rounds 7] [--device cpu] [--smoke]

``--smoke``: tiny sizes, one round (seconds), for tests/test_benchmarks_smoke.py.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from dpfy.federated import Contribution, DPFedAvgServer, clip_delta
from _machine import cpu_name
from _smoke import HELP, size

CLIP = 1.0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--users", type=int, default=size(32, 3))
    p.add_argument("--width", type=int, default=size(1000, 8))
    p.add_argument("--rounds", type=int, default=size(7, 1))
    p.add_argument("--device", default="cpu")
    p.add_argument("--smoke", action="store_true", help=HELP)
    args = p.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(args.width, args.width), nn.Linear(args.width, 10))
    model.to(device)
    server = DPFedAvgServer(
        model,
        num_users=args.users,
        user_sample_rate=1.0,
        clip=CLIP,
        noise_multiplier=1.0,
        rounds=args.rounds,
    )
    params = {n: q for n, q in model.named_parameters()}
    replies = [
        clip_delta({n: torch.randn_like(q) for n, q in params.items()}, CLIP)
        for _ in range(args.users)
    ]
    seconds = []
    for _ in range(args.rounds):
        rp = server.begin_round()
        contributions = [
            Contribution(user=u, clipped=c, norm=n) for u, (c, n) in zip(rp.users, replies)
        ]
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        server.finish_round(contributions)
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    count = sum(q.numel() for q in params.values())
    print(f"machine: {cpu_name()}; device {device}; torch threads {torch.get_num_threads()}")
    print("\n| what | users | parameters | rounds | median ms | min ms |")
    print("|---|---|---|---|---|---|")
    print(
        f"| one DP-FedAvg round (finish_round) | {args.users} | {count:,} | {args.rounds} | "
        f"{statistics.median(seconds) * 1e3:.1f} | {min(seconds) * 1e3:.1f} |"
    )


if __name__ == "__main__":
    main()
