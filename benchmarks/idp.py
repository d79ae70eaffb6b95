"""IDP benchmark: step time of IDP-SGD Sample and Scale against plain DP-SGD (issue 13).

    .venv/bin/python benchmarks/idp.py [--rounds 20] [--threads 1]
    .venv/bin/python benchmarks/idp.py --smoke     # batch 8, one round (the tests)

The CNN and fixed batch of ``benchmarks/engine.py`` (tanh CNN, batch 256, 1×28×28). The private
training set is that batch repeated ``REPEAT`` times (N = 5120, q = 256/N = 0.05), planned for
``EPOCHS`` passes, so every row is a run that could really take these steps. Rows:

- ``non-private``: engine.py's plain SGD step;
- ``dp-sgd σ=1``: engine.py's default dpfy row (fixed σ, no ε cap);
- ``dp-sgd ε cap``: DP-SGD calibrated to the fraction-weighted budget, with the run's ε cap
  (the budget guard reads the ledger each step, as the IDP rows' per-group guard does);
- ``idp sample`` / ``idp scale``: ``make_private(budgets=..., individual=...)`` with Case 1's
  budgets {1, 2, 3} and fractions {0.34, 0.43, 0.23} (RDP calibration: it takes a while
  before the first round, once per row; it is not timed).

Each step is zero_grad + forward + loss + backward + optimizer.step on the batch's first 256
dataset indices (so the IDP rows clip and account every group). Rows are interleaved: every
round runs one untimed step and one timed step of each row, in a fresh random order, so load from
other processes hits every row alike; the median over rounds is reported, with its ratios to
``dp-sgd σ=1`` and to ``dp-sgd ε cap`` (the like-for-like baseline: a capped run). Expected: the IDP rows within a few percent of DP-SGD (the same work).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dpfy  # noqa: E402
from dpfy.privacy.individual import random_budgets  # noqa: E402
from _smoke import HELP  # noqa: E402
from engine import BATCH, CLIP, dpfy_row, make_model, nonprivate  # noqa: E402

BUDGETS, FRACTIONS = (1.0, 2.0, 3.0), (0.34, 0.43, 0.23)
# --smoke plans the same 10 epochs: fewer (2) made the RDP calibrations slower (smaller σ's)
REPEAT, EPOCHS, DELTA = 20, 10, 1e-5
Step = Callable[[], None]


def private_row(**engine: Any) -> Step:
    """A step of the CNN made private over the repeated batch with ``engine`` arguments."""
    model, x, y = make_model("cnn")
    data = TensorDataset(x.repeat(REPEAT, 1, 1, 1), y.repeat(REPEAT))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model, opt, dl = dpfy.make_private(model, opt, DataLoader(data, batch_size=BATCH),
                                       epochs=EPOCHS, target_delta=DELTA, max_grad_norm=CLIP,
                                       accountant="rdp", **engine)
    dl.cursor.indices = torch.arange(BATCH)      # the batch the optimizer binds

    def step() -> None:
        dl.cursor.pending = 1                    # as if the loader had yielded (x, y)
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return step


def rows() -> dict[str, Step]:
    budgets = random_budgets(BUDGETS, FRACTIONS, BATCH * REPEAT, seed=0)
    weighted = sum(e * r for e, r in zip(BUDGETS, FRACTIONS))
    return {"non-private": nonprivate("cnn"), "dp-sgd σ=1": dpfy_row("cnn", "auto"),
            "dp-sgd ε cap": private_row(target_epsilon=weighted),
            "idp sample": private_row(budgets=budgets, individual="sample"),
            "idp scale": private_row(budgets=budgets, individual="scale")}


def medians(steps: dict[str, Step], rounds: int) -> dict[str, float]:
    """Median wall time (s) of one step per row, rows interleaved in random order."""
    times: dict[str, list[float]] = {r: [] for r in steps}
    order = list(steps.items())
    for _ in range(rounds):
        random.shuffle(order)
        for r, step in order:
            step()                               # the timed step follows one of its own
            t0 = time.perf_counter()
            step()
            times[r].append(time.perf_counter() - t0)
    return {r: statistics.median(v) for r, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--smoke", action="store_true", help=HELP)
    args = ap.parse_args()
    if args.smoke:
        args.rounds = 1
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    t0 = time.time()
    steps = rows()
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, batch {BATCH}, "
          f"rounds {args.rounds} (setup incl. calibration {time.time() - t0:.0f}s)")
    med = medians(steps, args.rounds)
    base, capped = med["dp-sgd σ=1"], med["dp-sgd ε cap"]
    print("| threads | row | median step (ms) | × dp-sgd σ=1 | × dp-sgd ε cap |\n"
          "|---:|---|---:|---:|---:|")
    for r, t in med.items():
        print(f"| {torch.get_num_threads()} | {r} | {t * 1e3:.1f} | {t / base:.3f} | "
              f"{t / capped:.3f} |", flush=True)


if __name__ == "__main__":
    main()
