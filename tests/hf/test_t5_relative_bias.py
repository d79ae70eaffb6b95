"""T5's relative attention bias: an Embedding called on (T, T) position buckets shared by every
example, with no batch dimension. dpfy has no per-example gradient for it; the refusal must name
the layer and the fix that works (freeze it), and the frozen model must train."""

from __future__ import annotations

import pytest
import torch
import transformers
from torch.utils.data import DataLoader

import dpfy
from dpfy.errors import PrivacyRefusal

V, T, N = 50, 6, 16


def _t5_and_loader() -> tuple[transformers.T5ForConditionalGeneration, DataLoader]:
    torch.manual_seed(0)
    cfg = transformers.T5Config(
        vocab_size=V,
        d_model=16,
        d_ff=32,
        num_layers=1,
        num_heads=2,
        d_kv=8,
        decoder_start_token_id=0,
        dropout_rate=0.0,
    )
    model = transformers.T5ForConditionalGeneration(cfg).train()
    g = torch.Generator().manual_seed(0)
    data = [
        {
            "input_ids": torch.randint(1, V, (T,), generator=g),
            "labels": torch.randint(1, V, (T,), generator=g),
        }
        for _ in range(N)
    ]
    return model, DataLoader(data, batch_size=8)


def _one_step(model: torch.nn.Module, loader: DataLoader) -> float:
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    model, opt, loader = dpfy.make_private(
        model, opt, loader, noise_multiplier=1.0, max_grad_norm=1.0, poisson_sampling=False
    )
    batch = next(iter(loader))
    opt.zero_grad()
    model(**batch).loss.backward()  # every example has T labels: the batch mean is "mean"
    opt.step()
    return opt.epsilon(1e-5)


def test_t5_relative_bias_refusal_names_the_freeze_fix() -> None:
    model, loader = _t5_and_loader()
    with pytest.raises(PrivacyRefusal, match=r"relative_attention_bias.*requires_grad_\(False\)"):
        _one_step(model, loader)


def test_t5_with_the_relative_bias_frozen_trains() -> None:
    model, loader = _t5_and_loader()
    for name, p in model.named_parameters():
        if "relative_attention_bias" in name:
            p.requires_grad_(False)
    assert _one_step(model, loader) > 0
