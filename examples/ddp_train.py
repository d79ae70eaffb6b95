"""Data-parallel private training with unchanged DDP code (docs/distributed.md).

    torchrun --nproc_per_node 2 examples/ddp_train.py            # 2 ranks, gloo, CPU
    python examples/ddp_train.py                                 # the same run in 1 process

The DDP part is the usual one: init the process group, wrap the model, shard the data with a
DistributedSampler; ``dpfy.make_private`` comes after the wrap. ``batch_size`` is per rank
(the global expected batch is batch_size × world size); every rank prints the same ε.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import dpfy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=64, help="per rank")
    ap.add_argument("--noise-multiplier", type=float, default=1.0)
    args = ap.parse_args()

    distributed = "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1
    if distributed:   # torchrun sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
        dist.init_process_group("gloo")
    world = dist.get_world_size() if distributed else 1

    g = torch.Generator().manual_seed(0)                  # a public synthetic dataset
    x = torch.randn(4096, 20, generator=g)
    y = (x[:, :5].sum(1) > 0).long()
    data = TensorDataset(x, y)

    torch.manual_seed(0)
    model: nn.Module = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 2))
    if distributed:
        model = DDP(model)
    loader = DataLoader(data, batch_size=args.batch_size,
                        sampler=DistributedSampler(data) if distributed else None,
                        shuffle=not distributed)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    model, optimizer, loader = dpfy.make_private(
        model, optimizer, loader, noise_multiplier=args.noise_multiplier, max_grad_norm=1.0)

    for epoch in range(args.epochs):
        for xb, yb in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(xb), yb).backward()
            optimizer.step()
        with torch.no_grad():
            acc = (model(x).argmax(1) == y).float().mean().item()
        rank = dist.get_rank() if distributed else 0
        print(f"rank {rank}/{world} epoch {epoch}: accuracy {acc:.3f}, "
              f"ε = {optimizer.epsilon(delta=1e-5):.3f} after {optimizer.step_count} steps",
              flush=True)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
