"""Hugging Face Accelerate: make_private first, then accelerator.prepare(model, optimizer).

The reverse order hands dpfy Accelerate's own loader, which re-batches the data; it is refused
with a message that says the order to use (it used to say "must be the DataLoader's own
BatchSampler, got 'BatchSampler'", which contradicts itself).
"""

from __future__ import annotations

import accelerate
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from dpfy.errors import PrivacyRefusal


def _setup():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
    return model, optimizer, DataLoader(data, batch_size=8)


def test_make_private_then_prepare_trains_and_accounts_every_step():
    acc = accelerate.Accelerator(cpu=True)
    model, optimizer, loader = dpfy.make_private(*_setup(), noise_multiplier=1.0)
    dp_optimizer = optimizer
    model, optimizer = acc.prepare(model, optimizer)
    for step, (x, y) in enumerate(loader):
        optimizer.zero_grad()
        acc.backward(torch.nn.functional.cross_entropy(model(x), y))
        optimizer.step()
        if step == 2:
            break
    assert dp_optimizer.step_count == 3


def test_prepare_then_make_private_is_refused_naming_the_order():
    acc = accelerate.Accelerator(cpu=True)
    model, optimizer, loader = acc.prepare(*_setup())
    with pytest.raises(PrivacyRefusal, match=r"make_private\(model, optimizer, loader\) first.*"
                                             r"then accelerator\.prepare"):
        dpfy.make_private(model, optimizer, loader, noise_multiplier=1.0)
