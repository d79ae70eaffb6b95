"""HF's token mean over two rows with unequal label counts couples them; a run whose batches
all have two rows must be refused too, not trained unprobed.

The probes ran only at the first forward of >= 3 rows, so a loader of 2-row batches (or a
Poisson run whose early batches had 2 rows) released every step with example 0's gradient
scaled by example 1's token count: unaccounted. The probe runs on the first 2-row batch, so
every pair here has unequal counts (the pairs are shuffled, seeded). A row-wise run of 2-row batches (equal label
counts: the token mean is then (1/2)·Σ_i example i's own mean) still trains.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from torch.utils.data import DataLoader

import dpfy
from dpfy.errors import PrivacyRefusal

V, T = 50, 8


def _run(lengths: list[int]) -> int:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    data = []
    for n in lengths:
        ids = torch.randint(3, V, (T,), generator=g)
        labels = ids.clone()
        labels[n:] = -100
        mask = (labels != -100).long()
        data.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    cfg = transformers.GPT2Config(
        vocab_size=V,
        n_embd=16,
        n_layer=1,
        n_head=2,
        n_positions=T,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    model = transformers.GPT2LMHeadModel(cfg)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt, loader = dpfy.make_private(
        model,
        opt,
        DataLoader(data, batch_size=2),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        poisson_sampling=False,
        seed=0,
    )
    steps = 0
    for batch in loader:
        opt.zero_grad()
        model(**batch).loss.backward()  # HF's token mean over the batch's labels
        opt.step()
        steps += 1
    return steps


def test_two_row_batches_of_unequal_label_counts_are_refused() -> None:
    with pytest.raises(PrivacyRefusal, match="wte"):
        _run([8, 7, 6, 5, 4, 3])  # every pair has unequal label counts


def test_two_row_batches_of_equal_label_counts_train() -> None:
    assert _run([8] * 6) == 3
