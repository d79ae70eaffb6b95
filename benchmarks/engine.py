"""Engine benchmark: private step time and peak memory as ratios to a non-private step.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/engine.py [--rounds 30] [--models cnn,mlp,encoder]
    .venv/bin/python benchmarks/engine.py --smoke     # batch 8, one round: runs (the tests)

CPU, threads pinned (1 by default), batch 256, Fashion-MNIST-shaped input (1×28×28; the encoder
gets 256 sequences of 32 token ids). For every model all rows run in ONE process and are
*interleaved*: each round times one step of every row, in a fresh random order (seeded), so load
from other processes hits all rows alike. Within a round each row first runs ``--warm`` untimed
steps (default 1) and then one timed step, so that, as in a training loop, the timed step follows
a step of the same model rather than another row's (which would leave it a cold cache: a
2.7 ms MLP step then measured 1.39–1.58× depending only on which rows shared the process). We
report the median over rounds of wall time and of process CPU time (the latter is less sensitive
to waiting for a core on a shared machine). A step is zero_grad + forward + loss + backward +
optimizer.step on the same fixed batch (data loading is excluded for every row).

Page faults / step: median count of minor page faults during one step (``getrusage``): memory
the C allocator handed back to the OS and must fault in again; each costs CPU time.

Peak memory: the largest amount of tensor memory allocated during one step above what was live
when it started (torch profiler, ``profile_memory=True``), so parameters, inputs and optimizer
state that exist before the step are not counted for any row.

Rows: non-private; dpfy with each engine (auto = the default), built as users get it by
default: ``make_private(..., seed=None)``, i.e. secure ChaCha20 noise; ``dpfy auto seed=0`` is the
default engine with reproducible (xoshiro) noise, so its difference from ``dpfy auto (default)``
is the secure sampler's cost per step; Opacus 1.6 ``hooks`` and ``ghost`` (fixed batch,
``poisson_sampling`` irrelevant here; same σ and C).
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dpfy  # noqa: E402
from dpfy.models.tiny_encoder import TinyEncoder  # noqa: E402
from dpfy.models import build_model  # noqa: E402
from _smoke import HELP, require, size  # noqa: E402

BATCH = size(256, 8)
SIGMA, CLIP = 1.0, 1.0


def make_model(name: str) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 10, (BATCH,), generator=g)
    if name == "cnn":
        return (build_model("tanh_cnn", input_shape=(1, 28, 28), num_classes=10),
                torch.randn(BATCH, 1, 28, 28, generator=g), y)
    if name == "mlp":
        return (nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10)),
                torch.randn(BATCH, 1, 28, 28, generator=g), y)
    if name == "encoder":
        return TinyEncoder(), torch.randint(0, 1000, (BATCH, 32), generator=g), y
    raise ValueError(f"model must be one of cnn, mlp, encoder, got model = {name!r}")


Step = Callable[[], None]


def nonprivate(name: str) -> Step:
    model, x, y = make_model(name)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return step


def dpfy_row(name: str, engine: str, seed: int | None = None, method: str | None = None
             ) -> Step:
    model, x, y = make_model(name)
    # adamwosm keeps its first moment in SGD's momentum buffer (it refuses anything else)
    opt = torch.optim.SGD(model.parameters(), lr=0.01,
                          momentum=0.9 if method == "adamwosm" else 0.0)
    loader = DataLoader(TensorDataset(x, y), batch_size=BATCH)
    model, opt, dl = dpfy.make_private(model, opt, loader, noise_multiplier=SIGMA,
                                       max_grad_norm=CLIP, route=engine, seed=seed,
                                       method=method)

    dl.cursor.indices = torch.arange(BATCH)  # the batch the optimizer binds (its batch guard)

    def step() -> None:
        dl.cursor.pending = 1  # as if the private loader had yielded (x, y): we time the step
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return step


def opacus_row(name: str, mode: str) -> Step:
    from opacus import PrivacyEngine
    model, x, y = make_model(name)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(TensorDataset(x, y), batch_size=BATCH)
    engine = PrivacyEngine()
    kwargs = dict(module=model, optimizer=opt, data_loader=loader, noise_multiplier=SIGMA,
                  max_grad_norm=CLIP, grad_sample_mode=mode, poisson_sampling=False)
    if mode == "ghost":
        model, opt, crit, _ = engine.make_private(criterion=nn.CrossEntropyLoss(), **kwargs)
    else:
        model, opt, _ = engine.make_private(**kwargs)
        crit = nn.CrossEntropyLoss()

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        crit(model(x), y).backward()
        opt.step()
    return step


def peak_bytes(step: Step) -> int:
    """Peak of tensor memory allocated during one step, above the level at its start."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                profile_memory=True) as prof:
        step()
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    level = peak = 0
    for e in events:
        level += e.nbytes()
        peak = max(peak, level)
    return peak


def bench(name: str, rounds: int, rows: list[str], warm: int = 1
          ) -> list[tuple[str, float, float, float, float, float]]:
    makers: dict[str, Callable[[], Step]] = {
        "non-private": lambda: nonprivate(name),
        "dpfy auto (default)": lambda: dpfy_row(name, "auto"),
        "dpfy auto seed=0": lambda: dpfy_row(name, "auto", seed=0),
        "dpfy ghost": lambda: dpfy_row(name, "ghost"),
        "dpfy vmap": lambda: dpfy_row(name, "vmap"),
        "opacus hooks": lambda: opacus_row(name, "hooks"),
        "opacus ghost": lambda: opacus_row(name, "ghost"),
    }
    for r in rows:   # "dpfy method=NAME": the default engine with an adaptive method
        if r.startswith("dpfy method="):
            makers[r] = lambda m=r.split("=", 1)[1]: dpfy_row(name, "auto", method=m)
    steps = {r: makers[r]() for r in rows}
    for s in steps.values():  # warm-up
        for _ in range(size(3, 1)):
            s()
    times: dict[str, list[float]] = {r: [] for r in rows}
    cpu: dict[str, list[float]] = {r: [] for r in rows}
    faults: dict[str, list[int]] = {r: [] for r in rows}
    order = list(steps.items())
    shuffle = random.Random(0).shuffle
    for _ in range(rounds):
        shuffle(order)  # no row always runs right after the same other row (cache state)
        for r, s in order:
            for _ in range(warm):  # as in a training loop, the timed step follows one of its own
                s()
            f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            c0, t0 = time.process_time(), time.perf_counter()
            s()
            times[r].append(time.perf_counter() - t0)
            cpu[r].append(time.process_time() - c0)
            faults[r].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
    mems = {r: peak_bytes(s) for r, s in steps.items()}
    med = {r: statistics.median(v) for r, v in times.items()}
    med_cpu = {r: statistics.median(v) for r, v in cpu.items()}
    base_m = mems["non-private"]
    return [(r, med[r] * 1e3, med[r] / med["non-private"],
             med_cpu[r] / med_cpu["non-private"], mems[r] / base_m,
             statistics.median(faults[r])) for r in rows]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--warm", type=int, default=1,
                    help="untimed steps of a row right before each timed step of it (0: the "
                         "timed step follows whatever row ran before, with its cache state)")
    ap.add_argument("--models", default="cnn,mlp,encoder")
    ap.add_argument("--rows", default="non-private,dpfy auto (default),dpfy auto seed=0,dpfy ghost,"
                                      "dpfy vmap,opacus hooks,opacus ghost",
                    help="comma-separated; dpfy rows use seed=None (secure noise, the default) "
                         "except 'dpfy auto seed=0' (reproducible noise); 'dpfy method=NAME' "
                         "runs the default engine with a registered adaptive method at σ = 1")
    ap.add_argument("--smoke", action="store_true", help=HELP)
    args = ap.parse_args()
    if args.smoke:
        args.rounds = 1
        require("opacus")   # its rows are in the default set
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    rows = args.rows.split(",")
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, batch {BATCH}, "
          f"rounds {args.rounds}, warm {args.warm}, "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}")
    print("| model | row | median step (ms) | time × non-private | CPU time × non-private "
          "| peak mem × non-private | page faults / step |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name in args.models.split(","):
        for r, ms, tr, cr, mr, pf in bench(name, args.rounds, rows, args.warm):
            print(f"| {name} | {r} | {ms:.1f} | {tr:.2f} | {cr:.2f} | {mr:.2f} | {pf:.0f} |",
                  flush=True)


if __name__ == "__main__":
    main()
