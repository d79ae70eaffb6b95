"""One draw of the HyFreeDP re-measurement (experiments/hyfree_fmnist/README.md): ``dpfy train``'s
trainer on Fashion-MNIST with a validation split carved from the training set.

    .venv/bin/python experiments/hyfree_fmnist/protocol.py LABEL RESULTS.jsonl OUT_DIR \
        --epochs 10 --seed 1 [--method hyfree --option probe_every=10] [--optimizer adam]

The training split (60 000) is cut once, by a public seed (``--split-seed``, default 0), into
54 000 examples the model trains on and 6 000 held out for validation. ``dpfy train``'s trainer
(:func:`dpfy.train.trainer.train`) runs on the 54 000 and evaluates on the 6 000 after every
epoch (its ``test_acc`` column is then the validation accuracy); any choice between settings is
made on the last epoch's validation accuracy. The test split (10 000) is read once, by the
final model, after training, and is appended to RESULTS.jsonl with the validation numbers.
The privacy guarantee covers the 54 000 training examples; the held-out 6 000 are not
protected (they are read without noise).

HyFreeDP's budget split (Algorithm 2, ``hyfree_noise_split``) depends only on (ε, δ, q, T, K,
γ, accountant), not on the seed; with ``--split-cache FILE`` it is solved once and read back
by the other draws (the PLD solve takes minutes on a loaded 2-core machine).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import time
from pathlib import Path

import torch
from torch.utils.data import Subset

import dpfy.adaptive.hyfree as hyfree
from dpfy.data import load_dataset
from dpfy.models import build_model
from dpfy.train.config import TrainConfig
from dpfy.train.evaluate import evaluate
from dpfy.train.trainer import train

VALIDATION = 6000


def carve(data, split_seed: int):
    """(training splits with ``test`` = the validation examples, the real test split)."""
    order = torch.randperm(data.num_train, generator=torch.Generator().manual_seed(split_seed))
    val = Subset(data.train, order[:VALIDATION].tolist())
    kept = Subset(data.train, order[VALIDATION:].tolist())
    held = dataclasses.replace(data, train=kept, test=val,
                               description=f"{data.description}; {VALIDATION} training "
                                           f"examples held out for validation")
    return held, data.test


def _value(text: str):
    """An option's value: a Python literal, or a float such as ``inf``."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return float(text)


def cache_split(path: str) -> None:
    """Make HyFreeDP read its (σ_g, σ_l) from ``path`` when solved before for the same inputs."""
    solve = hyfree.hyfree_noise_split

    def cached(**kw):
        key = json.dumps(kw, sort_keys=True)
        table = json.loads(Path(path).read_text()) if Path(path).exists() else {}
        if key not in table:
            table[key] = list(solve(**kw))
            Path(path).write_text(json.dumps(table, indent=1))
        return tuple(table[key])

    hyfree.hyfree_noise_split = cached


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("label")
    p.add_argument("results")
    p.add_argument("out_root")
    p.add_argument("--epochs", type=int, required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--split-seed", type=int, default=0)
    p.add_argument("--method")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--optimizer")
    p.add_argument("--lr", type=float)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--split-cache")
    a = p.parse_args()
    if a.split_cache:
        cache_split(a.split_cache)
    options = {k: _value(v) for k, v in (o.split("=", 1) for o in a.option)}
    fields = dict(epochs=a.epochs, seed=a.seed, threads=a.threads, method=a.method,
                  method_options=options or None)
    if a.optimizer:
        fields["optimizer"] = a.optimizer
    if a.lr is not None:
        fields["lr"] = a.lr
    cfg = TrainConfig(**fields)
    data = load_dataset(cfg.dataset)
    held, test = carve(data, a.split_seed)
    out = Path(a.out_root) / a.label
    t0 = time.monotonic()
    result = train(cfg, out=out, data=held, progress=False, echo=lambda s: None)
    wall = time.monotonic() - t0
    rows = json.loads((result.out / "metrics.json").read_text())
    model = build_model(cfg.model, input_shape=data.input_shape, num_classes=data.num_classes)
    model.load_state_dict(torch.load(result.out / "model.pt", weights_only=True))
    test_loss, test_acc = evaluate(model, test)            # the one read of the test split
    record = dict(label=a.label, method=a.method or "dp-sgd default", options=options,
                  optimizer=cfg.optimizer, lr=cfg.lr, epochs=a.epochs, seed=a.seed,
                  split_seed=a.split_seed, train_examples=held.num_train,
                  val_examples=VALIDATION, epsilon=result.epsilon, delta=result.delta,
                  val_acc=rows[-1]["test_acc"], val_loss=rows[-1]["test_loss"],
                  test_acc=test_acc, test_loss=test_loss, wall_s=round(wall, 1),
                  per_epoch=[{k: r.get(k) for k in ("epoch", "lr", "test_acc", "wall_time_s")}
                             for r in rows])
    with open(a.results, "a") as f:
        f.write(json.dumps(record) + "\n")
    print(json.dumps({k: v for k, v in record.items() if k != "per_epoch"}))


if __name__ == "__main__":
    main()
