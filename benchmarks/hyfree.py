"""HyFreeDP's overhead over DP-SGD (seed 004 Table 4 analogue): time per step, as ratios.

    .venv/bin/python benchmarks/hyfree.py [--rounds 15] [--models cnn,mlp] [--threads 1]
    .venv/bin/python benchmarks/hyfree.py --smoke    # batch 8, one round (the tests)

The digest's model (§4.5): a step costs 3 forward-pass units (forward + a backward of ≈ 2);
HyFreeDP adds 2 forward passes every K steps, so (3 + 2/K)/3 = 1.667 / 1.133 / 1.067 for
K = 1 / 5 / 10. dpfy's probes take 3 forward passes per round (the loss at θ too, which a method
cannot read from the training loop), so its model is (3 + 3/K)/3 = 2.0 / 1.2 / 1.1 before
counting that per-example clipping makes the backward dearer than 2 units (which lowers it).

Rows, all on the same fixed batch (engine.py's models and batch, data loading excluded): non-
private AdamW; DP-SGD with automatic clipping and AdamW (σ = 1; HyFreeDP's gradient step
without the probes); HyFreeDP at K = 1, 5, 10 (ε = 3, δ = 1e-5, q = 1/40, RDP); Opacus 1.6
hooks (SGD, flat clipping) for reference. A round times a block of 10 consecutive steps of
every row (10 is a multiple of every K, so each block holds the same number of probe rounds),
rows in a fresh random order per round; we report medians per step and ratios, at the thread
count given (run it with 1 and with the machine's default).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dpfy  # noqa: E402
from _smoke import HELP, require  # noqa: E402
from engine import BATCH, Step, make_model, opacus_row  # noqa: E402

BLOCK = 10           # steps per timed block: a multiple of every K
BATCHES = 40         # q = 1/BATCHES


def _losses(model, batch):
    return F.cross_entropy(model(batch[0]), batch[1], reduction="none")


def nonprivate_adamw(name: str) -> Step:
    model, x, y = make_model(name)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return step


def private_row(name: str, probe_every: int | None, steps: int) -> Step:
    """DP-SGD with automatic clipping (``probe_every=None``) or HyFreeDP with K = probe_every."""
    model, x, y = make_model(name)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = TensorDataset(x.repeat(BATCHES, *[1] * (x.dim() - 1)), y.repeat(BATCHES))
    loader = DataLoader(data, batch_size=BATCH)
    if probe_every is None:
        kwargs = dict(noise_multiplier=1.0, clipping="automatic", max_steps=steps)
    else:
        kwargs = dict(target_epsilon=3.0, target_delta=1e-5, max_steps=steps,
                      method=dpfy.adaptive.make("hyfree", probe_every=probe_every),
                      loss_fn=_losses, accountant="rdp")
    model, opt, dl = dpfy.make_private(model, opt, loader, max_grad_norm=1.0, **kwargs)
    dl.cursor.indices = torch.arange(BATCH)     # the batch the optimizer binds (batch guard)

    def step() -> None:
        dl.cursor.pending = 1   # as if the private loader had yielded (x, y): we time the step
        dl.cursor.batch = (x, y)                # the batch the loss probes read
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return step


def bench(name: str, rounds: int) -> list[tuple[str, float, float, float]]:
    steps = (rounds + 2) * BLOCK
    rows: dict[str, Step] = {
        "non-private AdamW": nonprivate_adamw(name),
        "DP-SGD automatic AdamW": private_row(name, None, steps),
        "HyFreeDP K=10": private_row(name, 10, steps),
        "HyFreeDP K=5": private_row(name, 5, steps),
        "HyFreeDP K=1": private_row(name, 1, steps),
        "opacus hooks (SGD)": opacus_row(name, "hooks"),
    }
    for s in rows.values():          # warm-up: one block each
        for _ in range(BLOCK):
            s()
    times: dict[str, list[float]] = {r: [] for r in rows}
    order = list(rows.items())
    for _ in range(rounds):
        random.Random(len(times[order[0][0]])).shuffle(order)
        for r, s in order:
            t0 = time.perf_counter()
            for _ in range(BLOCK):
                s()
            times[r].append((time.perf_counter() - t0) / BLOCK)
    med = {r: statistics.median(v) for r, v in times.items()}
    base, dp = med["non-private AdamW"], med["DP-SGD automatic AdamW"]
    return [(r, med[r] * 1e3, med[r] / base, med[r] / dp) for r in rows]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--models", default="cnn,mlp")
    ap.add_argument("--smoke", action="store_true", help=HELP)
    args = ap.parse_args()
    if args.smoke:
        args.rounds = 1
        require("opacus")   # its reference row
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    print(f"threads={args.threads} batch={BATCH} rounds={args.rounds} (median ms per step; "
          f"blocks of {BLOCK} steps)")
    for name in args.models.split(","):
        print(f"\n{name}:\n\n| row | ms/step | × non-private | × DP-SGD (automatic, AdamW) |\n"
              "|---|---:|---:|---:|")
        for r, ms, vs_base, vs_dp in bench(name, args.rounds):
            print(f"| {r} | {ms:.2f} | {vs_base:.3f} | {vs_dp:.3f} |")


if __name__ == "__main__":
    main()
