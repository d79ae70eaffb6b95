"""Multi-process tests over gloo on 127.0.0.1: a free port, and every rank's saved result.

A worker ``worker(rank, port, out)`` joins the process group on ``port`` and saves its result as
``out/rank{rank}.pt``; :func:`spawn_ranks` starts ``world`` of them and returns the results in
rank order.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any, Callable

import torch
import torch.multiprocessing as mp


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_ranks(worker: Callable[..., None], world: int, out: Path) -> list[Any]:
    """Run ``worker(rank, port, str(out))`` in ``world`` processes; their saved results."""
    mp.spawn(worker, args=(free_port(), str(out)), nprocs=world, join=True)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(world)]
