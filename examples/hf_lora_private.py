"""Private LoRA fine-tuning of a Hugging Face model with dpfy (docs/huggingface.md).

    python examples/hf_lora_private.py                   # tiny BERT, LoRA on query/value, ε = 3
    python examples/hf_lora_private.py --epochs 1 --target-epsilon 8
    python examples/hf_lora_private.py --noise-multiplier 1 --accountant rdp   # no calibration

Everything is local: the model is a tiny BERT built from a config (no weights are downloaded;
for a real run load ``from_pretrained`` instead) and the data are synthetic token sequences
whose label says whether token 7 occurs. The training loop is the usual Hugging Face one —
a Dataset of dicts, the default collate, ``model(**batch).loss`` — and only ``make_private``
is added. peft's SEQ_CLS task keeps the classifier head trainable next to the adapters; the
frozen base is never updated, so only the adapters and the head are released.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # this example never needs the hub

import peft  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

import dpfy  # noqa: E402

VOCAB, LENGTH = 100, 16


class Synthetic(Dataset):
    """n token sequences (1..VOCAB−1) with label 1 iff token 7 occurs; a public toy set."""

    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(1, VOCAB, (n, LENGTH), generator=g)  # (n, LENGTH)
        self.labels = (self.ids == 7).any(1).long()  # (n,)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(LENGTH, dtype=torch.long),
                "labels": self.labels[i]}


def main(argv: list[str] | None = None) -> float:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=float, default=2)
    ap.add_argument("--batch-size", type=int, default=64, help="expected (Poisson) batch size")
    ap.add_argument("--target-epsilon", type=float, default=3.0)
    ap.add_argument("--noise-multiplier", type=float, default=None,
                    help="σ instead of calibrating it to --target-epsilon")
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--accountant", choices=["pld", "rdp"], default="pld")
    args = ap.parse_args(argv)

    config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=37,
                                     max_position_embeddings=64)
    model = transformers.BertForSequenceClassification(config)  # or .from_pretrained(...)
    model = peft.get_peft_model(model, peft.LoraConfig(
        task_type="SEQ_CLS", r=8, lora_alpha=16, lora_dropout=0.1,
        target_modules=["query", "value"]))
    model.print_trainable_parameters()  # before make_private (dpfy then holds requires_grad)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)
    train = DataLoader(Synthetic(1024), batch_size=args.batch_size)

    privacy = ({"noise_multiplier": args.noise_multiplier} if args.noise_multiplier is not None
               else {"target_epsilon": args.target_epsilon})
    model, optimizer, train = dpfy.make_private(
        model, optimizer, train, **privacy, target_delta=args.delta, epochs=args.epochs,
        max_grad_norm=1.0, accountant=args.accountant)
    model.train()
    steps = 0
    for _ in range(int(args.epochs + 0.999)):
        for batch in train:
            if steps == optimizer.max_steps:
                break
            optimizer.zero_grad()
            loss = model(**batch).loss  # the model's own loss, a mean over the batch
            loss.backward()
            optimizer.step()
            steps += 1
    eps = optimizer.epsilon(args.delta, accountant=args.accountant)
    print(f"{steps} private steps, σ = {optimizer.noise_multiplier:.3f}, last loss "
          f"{loss.item():.3f}: ε = {eps:.3f} at δ = {args.delta:g} ({args.accountant})")
    return eps


if __name__ == "__main__":
    main()
