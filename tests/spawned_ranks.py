"""Multi-process tests over gloo on 127.0.0.1: a free port, and every rank's saved result.

A worker ``worker(rank, port, out)`` joins the process group on ``port`` and saves its result as
``out/rank{rank}.pt``; :func:`spawn_ranks` starts ``world`` of them and returns the results in
rank order.

The ranks are forked from multiprocessing's fork server (:func:`start_ranks`), a fresh
interpreter that imports torch, torch._dynamo (which the first ``torch.optim`` optimizer
imports), dp_accounting and dpfy once per test process and runs nothing else: a rank is a
process that starts from those imports instead of from an empty interpreter, which each
spawned rank re-did (~4 s of CPU, most of a multi-process test's cost). Like ``spawn`` (and
unlike ``fork``), a rank inherits nothing from the test process but what it is sent: the
function, its arguments, ``sys.path`` and the working directory.
"""

from __future__ import annotations

import socket
from multiprocessing import forkserver
from pathlib import Path
from typing import Any, Callable

import torch
import torch.multiprocessing as mp


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


PRELOAD = ["torch", "torch._dynamo", "dp_accounting", "dpfy"]


def start_ranks(worker: Callable[..., None], world: int, args: tuple) -> None:
    """``torch.multiprocessing.spawn(worker, args, nprocs=world)``, the ranks forked from the
    fork server (module docstring); returns when every rank has ended, raises if one failed."""
    preload_in_forkserver(PRELOAD)
    mp.start_processes(worker, args=args, nprocs=world, join=True, start_method="forkserver")


def preload_in_forkserver(modules: list[str]) -> None:
    """Add ``modules`` to what the fork server imports when it starts (it starts once per
    process, at the first use: a later call changes nothing). Added to, not replaced: another
    test file (tests/integration/test_kill_resume.py) preloads its own list in the same
    process, and whichever starts the server first should not cost the other its imports."""
    server = getattr(forkserver, "_forkserver", None)
    current = list(getattr(server, "_preload_modules", []))
    mp.get_context("forkserver").set_forkserver_preload(
        current + [m for m in modules if m not in current]
    )


def spawn_ranks(worker: Callable[..., None], world: int, out: Path) -> list[Any]:
    """Run ``worker(rank, port, str(out))`` in ``world`` processes; their saved results."""
    start_ranks(worker, world, (free_port(), str(out)))
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(world)]
