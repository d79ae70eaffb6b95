"""Hugging Face tiny-GPT-2 training step: dpfy with and without the Conv1D rule, non-private,
and Opacus, in one run.

    .venv/bin/python benchmarks/hf_gpt2.py [--rounds 10] [--threads 1,0] [--batch 32] [--seq 64]
    .venv/bin/python benchmarks/hf_gpt2.py --smoke   # 1 layer, hidden 32, batch 4 × 8 (the tests)

Model: ``GPT2LMHeadModel`` built from a config (2 layers, hidden 128, 2 heads, MLP 512,
vocabulary 8,192 by default; ``--vocab 50257`` for GPT-2's tokenizer), HF's default dropout 0.1,
``lm_head`` tied to the token embedding (``--untied``: its own parameter, to see what the tie
costs); nothing is downloaded. Every parameter is trained.
One step = zero_grad + forward + the model's own causal-LM loss + backward + AdamW step on one
fixed batch of ``--batch`` sequences of ``--seq`` tokens (no padding).

Rows, timed interleaved in one process (``hf_bert.bench``: each round runs the rows in a fresh
order; each timed step follows one untimed step of the same row):

- ``non-private``: ``model(**batch).loss.backward()``, the user's code;
- ``dpfy``: the same code after ``dpfy.make_private`` (default engine, σ = 1, C = 1): GPT-2's
  ``Conv1D`` layers take the layer rule ``dpfy/grads/rules/hf_conv1d.py``;
- ``dpfy-vmap-conv1d``: the same with the Conv1D rule taken out of the registry while
  ``make_private`` builds its units, i.e. every Conv1D on the vmap route (dpfy before the rule);
- ``opacus-hooks`` / ``opacus-ghost``: Opacus 1.6's ``PrivacyEngine.make_private`` with
  ``grad_sample_mode="hooks"`` and ``"ghost"`` (its loss through Opacus's criterion wrapper, per
  sequence: ``shape=(B, T − 1)``). Each is tried as shipped (HF's (1, T) position ids); if it
  fails the error is printed in one line and the row is retried with ``position_ids`` passed
  expanded to (B, T); if that fails too the row is dropped.

Printed per row: median wall time and median process CPU time per step (all threads; on a
shared machine CPU time is the steadier number), each with its ratio to non-private.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import warnings
from typing import Iterator

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from _smoke import HELP, require, size  # noqa: E402

require("transformers", "opacus")

import torch  # noqa: E402
import transformers  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402
from transformers.pytorch_utils import Conv1D  # noqa: E402

import dpfy  # noqa: E402
from dpfy.grads.rules import RULES  # noqa: E402
from hf_bert import CLIP, SIGMA, TABLE_HEAD, Step, adam, bench, stepper, table  # noqa: E402

Batch = dict[str, torch.Tensor]


def build(args: argparse.Namespace) -> transformers.GPT2LMHeadModel:
    """The benchmark model, identical weights for every row (seed 0)."""
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=args.vocab, n_positions=max(1024, args.seq),
                                  n_embd=args.hidden, n_layer=args.layers, n_head=args.heads,
                                  n_inner=args.inner, tie_word_embeddings=not args.untied,
                                  loss_type="ForCausalLM")
    return transformers.GPT2LMHeadModel(cfg).train()


def make_batch(args: argparse.Namespace) -> Batch:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g)  # (B, T)
    return {"input_ids": ids, "labels": ids}  # causal LM: HF shifts the labels


@contextlib.contextmanager
def conv1d_on_vmap() -> Iterator[None]:
    """Take the Conv1D rule out of the registry (units built inside go to vmap), then restore."""
    rule = RULES.pop(Conv1D)
    try:
        yield
    finally:
        RULES[Conv1D] = rule


def non_private(args: argparse.Namespace, batch: Batch) -> Step:
    model = build(args)
    return stepper(adam(model), lambda: model(**batch).loss)


def with_dpfy(args: argparse.Namespace, batch: Batch, vmap_conv1d: bool = False) -> Step:
    model = build(args)
    every = torch.arange(args.batch)
    loader = DataLoader(TensorDataset(every), batch_size=args.batch)
    with conv1d_on_vmap() if vmap_conv1d else contextlib.nullcontext():
        model, opt, dl = dpfy.make_private(model, adam(model), loader, noise_multiplier=SIGMA,
                                           max_grad_norm=CLIP)
    routes = {u.route for u in opt.grads.layers if isinstance(u.module, Conv1D)}
    assert routes == ({"vmap"} if vmap_conv1d else {"rule"}), routes
    # as if the private loader had yielded this batch (the batch guard binds its rows)
    return stepper(opt, lambda: model(**batch).loss, lambda: dl.cursor.advance(every, True))


def with_opacus(args: argparse.Namespace, batch: Batch, mode: str) -> Step | None:
    """Opacus as shipped if it runs; else print why and try expanded position ids."""
    from opacus import PrivacyEngine
    loader = DataLoader(TensorDataset(torch.arange(args.batch)), batch_size=args.batch)
    b, t = batch["input_ids"].shape

    def step_for(inputs: Batch) -> Step:
        model = build(args)
        ce = nn.CrossEntropyLoss() if mode == "ghost" else None
        out = PrivacyEngine().make_private(
            module=model, optimizer=adam(model), data_loader=loader, noise_multiplier=SIGMA,
            max_grad_norm=CLIP, grad_sample_mode=mode, poisson_sampling=False,
            **({"criterion": ce} if ce is not None else {}))
        model, opt = out[0], out[1]
        if mode == "hooks":  # the model's own loss
            step = stepper(opt, lambda: model(**inputs).loss)
        else:  # Opacus's criterion wrapper, one loss per sequence (B, T − 1)
            criterion, labels = out[2], batch["labels"][:, 1:].reshape(-1)

            def loss() -> torch.Tensor:
                logits = model(input_ids=inputs["input_ids"],
                               **{k: v for k, v in inputs.items()
                                  if k == "position_ids"}).logits[:, :-1]
                return criterion(logits.reshape(-1, logits.shape[-1]), labels,
                                 shape=(b, t - 1))
            step = stepper(opt, loss)
        step()
        return step

    expanded = dict(batch, position_ids=torch.arange(t).expand(b, t).contiguous())  # (B, T)
    for label, inputs in (("as shipped", batch), ("with (B, T) position ids", expanded)):
        try:
            return step_for(inputs)
        except Exception as e:  # noqa: BLE001 - reported in one line, then the next attempt
            msg = " ".join(str(e).split())[:200]
            print(f"  opacus-{mode} {label} fails: {type(e).__name__}: {msg}")
    return None


# the model and batch shape: --name value for each (--smoke: the tiny one)
SHAPE = {"batch": 32, "seq": 64, "vocab": 8192, "hidden": 128, "layers": 2, "heads": 2,
         "inner": 512}
SMOKE_SHAPE = {"batch": 4, "seq": 8, "vocab": 100, "hidden": 32, "layers": 1, "heads": 2,
               "inner": 64}


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--threads", default="1,0", help="comma-separated; 0 = torch's default")
    for name, default in SHAPE.items():
        ap.add_argument(f"--{name}", type=int, default=default)
    ap.add_argument("--untied", action="store_true",
                    help="lm_head its own parameter (what the tied head costs; not GPT-2)")
    ap.add_argument("--no-opacus", action="store_true")
    ap.add_argument("--smoke", action="store_true", help=HELP)
    args = ap.parse_args()
    if args.smoke:
        args.rounds, args.threads = 1, "1"
        for name, value in SMOKE_SHAPE.items():
            setattr(args, name, value)
    return args


def main() -> None:
    args, default_threads = parse_args(), torch.get_num_threads()
    batch = make_batch(args)
    transformers.logging.set_verbosity_error()
    warnings.filterwarnings("ignore")
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, GPT-2 "
          + ", ".join(f"{k} {getattr(args, k)}" for k in SHAPE)
          + f", {'untied' if args.untied else 'tied'} head, AdamW, rounds {args.rounds}")
    lines = list(TABLE_HEAD)
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads or default_threads)
        rows: dict[str, Step] = {
            "non-private": non_private(args, batch), "dpfy": with_dpfy(args, batch),
            "dpfy-vmap-conv1d": with_dpfy(args, batch, vmap_conv1d=True)}
        for mode in () if args.no_opacus else ("hooks", "ghost"):
            step = with_opacus(args, batch, mode)
            if step is not None:
                rows[f"opacus-{mode}"] = step
        lines += table(torch.get_num_threads(), bench(rows, args.rounds, warm=size(2, 1)))
        print("\n".join(lines[-len(rows):]), flush=True)
    print("\n".join(lines))

if __name__ == "__main__":
    main()
