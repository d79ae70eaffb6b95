"""Hugging Face tiny-BERT fine-tuning step: dpfy vs non-private vs Opacus, in one run.

    .venv/bin/python benchmarks/hf_bert.py [--rounds 20] [--threads 1,0] [--batch 32] [--seq 64]
    .venv/bin/python benchmarks/hf_bert.py --smoke   # 1 layer, hidden 32, batch 4 × 8 (the tests)

Model: ``BertForSequenceClassification`` built from a config of bert-tiny's shape (2 layers,
hidden 128, 2 heads, intermediate 512, vocabulary 30,522; ``--hidden`` etc.), HF's default
dropout 0.1, 2 labels; nothing is downloaded. Every parameter is trained (full fine-tuning;
``--lora`` trains peft LoRA adapters on query/value instead). One step = zero_grad + forward +
loss + backward + AdamW step on one fixed batch of ``--batch`` sequences of ``--seq`` tokens.

Rows, timed interleaved in one process (each round runs the rows in a fresh order; each timed
step follows one untimed step of the same row):

- ``non-private``: ``model(**batch).loss.backward()``, the user's code;
- ``dpfy``: the same code after ``dpfy.make_private`` (default engine, σ = 1, C = 1);
- ``opacus-hooks`` / ``opacus-ghost``: Opacus 1.6's ``PrivacyEngine.make_private`` with
  ``grad_sample_mode="hooks"`` (per-sample gradients) and ``"ghost"`` (ghost clipping, its
  fastest mode for transformers; its loss must go through Opacus's criterion wrapper). As
  shipped (HF's position ids of shape (1, T); for ``"hooks"`` the model's own loss) each mode
  is tried first; if it fails the error is printed and the row runs the adaptation Opacus
  needs: ``position_ids`` and ``token_type_ids`` passed expanded to (B, T).

Printed per row (a markdown table): median wall time per step, median process CPU time per step
(all threads; the machine may be shared, so CPU time is the steadier number), and ratios to
non-private; then dpfy's speed-up over the faster Opacus mode.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
import warnings
from typing import Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from _smoke import HELP, require, size  # noqa: E402

require("transformers", "opacus")

import torch  # noqa: E402
import transformers  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import dpfy  # noqa: E402

SIGMA, CLIP, LR = 1.0, 1.0, 1e-4
Step = Callable[[], None]
Batch = dict[str, torch.Tensor]


def build(args: argparse.Namespace) -> nn.Module:
    """The benchmark model, identical weights for every row (seed 0)."""
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=args.vocab, hidden_size=args.hidden,
                                  num_hidden_layers=args.layers, num_attention_heads=args.heads,
                                  intermediate_size=args.intermediate,
                                  max_position_embeddings=max(512, args.seq))
    model = transformers.BertForSequenceClassification(cfg).train()
    if args.lora:
        import peft
        model = peft.get_peft_model(model, peft.LoraConfig(
            r=8, lora_alpha=16, target_modules=["query", "value"]))
    return model


def make_batch(args: argparse.Namespace) -> Batch:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, args.vocab, (args.batch, args.seq), generator=g)  # (B, T)
    mask = torch.ones_like(ids)
    mask[::4, args.seq // 2:] = 0  # some padded sequences
    return {"input_ids": ids, "attention_mask": mask,
            "labels": torch.randint(0, 2, (args.batch,), generator=g)}


def adam(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR)


def stepper(opt: torch.optim.Optimizer, loss: Callable[[], torch.Tensor],
            before: Callable[[], None] = lambda: None) -> Step:
    def step() -> None:
        before()
        opt.zero_grad(set_to_none=True)
        loss().backward()
        opt.step()
    return step


def non_private(args: argparse.Namespace, batch: Batch) -> Step:
    model = build(args)
    return stepper(adam(model), lambda: model(**batch).loss)


def with_dpfy(args: argparse.Namespace, batch: Batch) -> Step:
    model = build(args)
    every = torch.arange(args.batch)
    loader = DataLoader(TensorDataset(every), batch_size=args.batch)
    model, opt, dl = dpfy.make_private(model, adam(model), loader, noise_multiplier=SIGMA,
                                       max_grad_norm=CLIP)
    # as if the private loader had yielded this batch (the batch guard binds its rows)
    return stepper(opt, lambda: model(**batch).loss, lambda: dl.cursor.advance(every, True))


def with_opacus(args: argparse.Namespace, batch: Batch, mode: str) -> Step:
    """Opacus as shipped if it runs; otherwise print why and run its adaptation."""
    from opacus import PrivacyEngine
    loader = DataLoader(TensorDataset(torch.arange(args.batch)), batch_size=args.batch)

    def private(criterion: nn.Module | None):
        model = build(args)
        kw = {"criterion": criterion} if criterion is not None else {}
        out = PrivacyEngine().make_private(
            module=model, optimizer=adam(model), data_loader=loader, noise_multiplier=SIGMA,
            max_grad_norm=CLIP, grad_sample_mode=mode, poisson_sampling=False, **kw)
        return out[0], out[1], (out[2] if mode == "ghost" else criterion)

    b, t = batch["input_ids"].shape
    shipped = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    adapted = dict(shipped, position_ids=torch.arange(t).expand(b, t).contiguous(),  # (B, T)
                   token_type_ids=torch.zeros(b, t, dtype=torch.long))
    try:  # as shipped: HF's shared (1, T) position ids; the model's own loss for "hooks"
        if mode == "hooks":
            model, opt, _ = private(None)
            step = stepper(opt, lambda: model(**batch).loss)
        else:
            model, opt, criterion = private(nn.CrossEntropyLoss())
            step = stepper(opt, lambda: criterion(model(**shipped).logits, batch["labels"]))
        step()
        return step
    except Exception as e:  # noqa: BLE001 - reported, then the adaptation runs
        print(f"  opacus-{mode} as shipped fails: {type(e).__name__}: {str(e)[:160]}")
    model, opt, criterion = private(nn.CrossEntropyLoss())
    return stepper(opt, lambda: criterion(model(**adapted).logits, batch["labels"]))


def bench(steps: dict[str, Step], rounds: int, warm: int = 2
          ) -> dict[str, tuple[float, float]]:
    """(median wall s, median process CPU s) per step of each row, interleaved, after ``warm``
    untimed steps of each."""
    for s in steps.values():
        for _ in range(warm):
            s()
    wall: dict[str, list[float]] = {r: [] for r in steps}
    cpu: dict[str, list[float]] = {r: [] for r in steps}
    order = list(steps.items())
    for k in range(rounds):
        random.Random(k).shuffle(order)
        for r, s in order:
            s()
            w0, c0 = time.perf_counter(), time.process_time()
            s()
            wall[r].append(time.perf_counter() - w0)
            cpu[r].append(time.process_time() - c0)
    return {r: (statistics.median(wall[r]), statistics.median(cpu[r])) for r in steps}


def table(threads: int, med: dict[str, tuple[float, float]]) -> list[str]:
    """Markdown rows: threads, row, wall and CPU per step, each with its ratio to non-private."""
    base = med["non-private"]
    return [f"| {threads} | {r} | {w * 1e3:.1f} ms | {w / base[0]:.2f} | {c * 1e3:.1f} ms | "
            f"{c / base[1]:.2f} |" for r, (w, c) in med.items()]


TABLE_HEAD = ["| threads | row | wall / step | × non-private | CPU / step | × non-private |",
              "|---|---|---|---|---|---|"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--threads", default="1,0", help="comma-separated; 0 = torch's default")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=30522)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--intermediate", type=int, default=512)
    ap.add_argument("--lora", action="store_true", help="train LoRA adapters (peft) only")
    ap.add_argument("--no-opacus", action="store_true")
    ap.add_argument("--smoke", action="store_true", help=HELP)
    args = ap.parse_args()
    if args.smoke:
        args.rounds, args.threads, args.batch, args.seq = 1, "1", 4, 8
        args.vocab, args.hidden, args.layers, args.intermediate = 100, 32, 1, 64
    warnings.filterwarnings("ignore")
    transformers.logging.set_verbosity_error()
    default_threads = torch.get_num_threads()
    batch = make_batch(args)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, BERT L={args.layers} "
          f"H={args.hidden} A={args.heads} I={args.intermediate} V={args.vocab}, "
          f"batch {args.batch} × {args.seq} tokens, {'LoRA' if args.lora else 'full'}, "
          f"rounds {args.rounds}")
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads or default_threads)
        rows = {"non-private": non_private(args, batch), "dpfy": with_dpfy(args, batch)}
        if not args.no_opacus:
            for mode in ("hooks", "ghost"):
                rows[f"opacus-{mode}"] = with_opacus(args, batch, mode)
        med = bench(rows, args.rounds, warm=size(2, 1))
        print("\n".join(TABLE_HEAD + table(torch.get_num_threads(), med)))
        opacus = [r for r in med if r.startswith("opacus")]
        if opacus:
            best = min(opacus, key=lambda r: med[r][1])
            print(f"  {best} (Opacus's best by CPU) / dpfy: wall "
                  f"{med[best][0] / med['dpfy'][0]:.2f}×, cpu {med[best][1] / med['dpfy'][1]:.2f}×")


if __name__ == "__main__":
    main()
