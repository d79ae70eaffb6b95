"""Recurrent-layer benchmark: one training step of a sequence classifier, as a ratio to non-private.

    .venv/bin/python benchmarks/rnn.py [--rounds 20] [--threads 1,0] [--cells lstm,gru,rnn]
    .venv/bin/python benchmarks/rnn.py --smoke    # batch 4 × 4 tokens, hidden 16 (the tests)

Model: token embedding (1000 × 64) -> recurrent layer (hidden 128; ``--layers``/``--bidir``)
-> Linear(·, 10) on the last output; batch 64 sequences of 32 tokens (``--batch``, ``--steps``).
Rows, all in one process and timed interleaved (each round times one step of every row in a
fresh order, after one untimed step of the same row):

- ``non-private``: torch's ``nn.LSTM``/``nn.GRU``/``nn.RNN``;
- ``dpfy``: the same model after ``dpfy.layers.swap_recurrent`` (DPLSTM ...), ``make_private``
  with the default engine;
- ``opacus``: Opacus 1.6's ``DPLSTM``/``DPGRU``/``DPRNN`` through its ``PrivacyEngine``
  (``grad_sample_mode="hooks"``, the mode its DP layers are made for).

A step is zero_grad + forward + loss + backward + optimizer.step on one fixed batch (same σ, C).
Threads: ``0`` means torch's default number of threads. Prints the median step time and the
ratio to non-private per row.
"""

from __future__ import annotations

import argparse
import warnings
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from _smoke import HELP, require, size
from _timing import interleaved_medians
from dpfy.layers import swap_recurrent

SIGMA, CLIP, VOCAB, CLASSES = 1.0, 1.0, 1000, 10
EMB, HIDDEN = size(64, 8), size(128, 16)
Step = Callable[[], None]


class Classifier(nn.Module):
    """Embedding -> recurrent layer -> Linear on the last time step."""

    def __init__(self, rnn: nn.Module, hidden_out: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, EMB)
        self.rnn = rnn
        self.head = nn.Linear(hidden_out, CLASSES)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.emb(ids))
        return self.head(out[:, -1])


def build(cell: str, layers: int, bidir: bool, opacus: bool) -> Classifier:
    torch.manual_seed(0)
    if opacus:
        from opacus.layers import DPGRU, DPLSTM, DPRNN
        cls = {"lstm": DPLSTM, "gru": DPGRU, "rnn": DPRNN}[cell]
    else:
        cls = {"lstm": nn.LSTM, "gru": nn.GRU, "rnn": nn.RNN}[cell]
    rnn = cls(EMB, HIDDEN, num_layers=layers, bidirectional=bidir, batch_first=True)
    return Classifier(rnn, HIDDEN * (2 if bidir else 1))


def stepper(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
            before: Callable[[], None] = lambda: None) -> Step:
    """One training step on the fixed batch, after ``before()``."""
    def step() -> None:
        before()
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return step


def rows(cell: str, layers: int, bidir: bool, x: torch.Tensor, y: torch.Tensor
         ) -> dict[str, Step]:
    loader = DataLoader(TensorDataset(x, y), batch_size=len(x))

    def plain() -> Step:
        model = build(cell, layers, bidir, False)
        return stepper(model, torch.optim.SGD(model.parameters(), lr=0.01), x, y)

    def ours() -> Step:
        model = build(cell, layers, bidir, False)
        swap_recurrent(model)
        model, opt, dl = dpfy.make_private(
            model, torch.optim.SGD(model.parameters(), lr=0.01), loader,
            noise_multiplier=SIGMA, max_grad_norm=CLIP)
        every = torch.arange(len(x))  # as if the private loader had yielded (x, y):
        return stepper(model, opt, x, y, lambda: dl.cursor.advance(every, True))

    def theirs() -> Step:
        from opacus import PrivacyEngine
        model = build(cell, layers, bidir, True)
        model, opt, _ = PrivacyEngine().make_private(
            module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
            data_loader=loader, noise_multiplier=SIGMA, max_grad_norm=CLIP,
            grad_sample_mode="hooks", poisson_sampling=False)
        return stepper(model, opt, x, y)

    return {"non-private": plain(), "dpfy": ours(), "opacus": theirs()}


def bench(steps: dict[str, Step], rounds: int) -> dict[str, float]:
    """Median seconds per step of each row, interleaved in a fresh order every round."""
    return interleaved_medians(steps, rounds, size(2, 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--threads", default="1,0", help="comma-separated; 0 = torch's default")
    ap.add_argument("--cells", default="lstm,gru,rnn")
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--bidir", action="store_true")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=32, help="sequence length")
    ap.add_argument("--smoke", action="store_true", help=HELP)
    args = ap.parse_args()
    if args.smoke:
        args.rounds, args.threads, args.batch, args.steps = 1, "1", 4, 4
        require("opacus")   # its rows
    warnings.filterwarnings("ignore")
    default_threads = torch.get_num_threads()
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, VOCAB, (args.batch, args.steps), generator=g)
    y = torch.randint(0, CLASSES, (args.batch,), generator=g)
    print(f"torch {torch.__version__}, batch {args.batch}, T {args.steps}, hidden {HIDDEN}, "
          f"layers {args.layers}, bidirectional {args.bidir}, rounds {args.rounds}")
    print("| threads | cell | non-private (ms) | dpfy (ms) | × non-private | opacus (ms) | "
          "× non-private | opacus / dpfy |\n|---:|---|---:|---:|---:|---:|---:|---:|")
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads or default_threads)
        for cell in args.cells.split(","):
            med = bench(rows(cell, args.layers, args.bidir, x, y), args.rounds)
            base, ours, theirs = med["non-private"], med["dpfy"], med["opacus"]
            print(f"| {torch.get_num_threads()} | {cell} | {base * 1e3:.1f} | {ours * 1e3:.1f} | "
                  f"{ours / base:.2f} | {theirs * 1e3:.1f} | {theirs / base:.2f} | "
                  f"{theirs / ours:.2f} |", flush=True)


if __name__ == "__main__":
    main()
