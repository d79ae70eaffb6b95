"""Rough edges a Hugging Face user hit on the first day (issue 31 §2), each a test that failed
before its fix: ``validate`` on a ``BatchEncoding`` (what every HF collator returns) crashed
inside BERT; ``route="vmap"`` on a model that computes its loss in the forward raised torch's
raw ``in_dim`` error instead of naming the cause and the fix."""

from __future__ import annotations

import pytest
import torch
import transformers
from torch.utils.data import DataLoader

import dpfy
from hf_models import Tokens, tiny_bert


def test_validate_takes_a_batch_encoding_as_keyword_arguments():
    batch = next(iter(DataLoader(Tokens(8), batch_size=4)))
    assert dpfy.validate(tiny_bert(), transformers.BatchEncoding(batch)) == []


def test_vmap_route_on_a_model_that_returns_its_own_loss_names_the_cause_and_the_fix():
    model = tiny_bert()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer, loader = dpfy.make_private(
        model, optimizer, DataLoader(Tokens(32), batch_size=8), noise_multiplier=1.0,
        route="vmap", seed=0)
    batch = next(b for b in loader if b["input_ids"].shape[0] > 0)
    model(**batch).loss.backward()
    with pytest.raises(ValueError, match=r"loss computed inside the forward.*route='auto'"):
        optimizer.step()
