"""Issue 15 §2: checkpoints only at logical-batch boundaries; runs survive SIGKILL.

The kill tests run ``dpfy train`` in a child process on sklearn digits, SIGKILL it at random
moments (during a step, while a checkpoint is written, during the report), ``--resume`` it,
and compare ``model.pt`` and ``ledger.json`` byte for byte with an uninterrupted run of the
same ``--seed``. Measured results: docs/fault_tolerance.md.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from dpfy.errors import PrivacyRefusal


def _private_with_physical_batches():
    torch.manual_seed(0)
    ds = TensorDataset(torch.randn(40, 5), torch.randint(0, 3, (40,)))
    model = nn.Linear(5, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    # expected batch 20 cut into physical batches of at most 2: a logical batch spans many
    return dpfy.make_private(model, opt, DataLoader(ds, batch_size=20), noise_multiplier=1.0,
                             seed=3, max_physical_batch_size=2)


def test_state_dict_refuses_mid_logical_batch_and_never_holds_unnoised_sums():
    model, opt, dl = _private_with_physical_batches()
    it = iter(dl)
    x, y = next(it)
    while dl.cursor.last:           # find a physical batch that does not end its logical batch
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        x, y = next(it)
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step()                      # summed, not released: the un-noised sum is in memory
    with pytest.raises(PrivacyRefusal, match="after optimizer.step\\(\\) completes a logical"):
        opt.state_dict()
    while not dl.cursor.last:       # finish the logical batch: now a checkpoint is allowed
        x, y = next(it)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    state = opt.state_dict()
    assert "pending" not in state


def test_load_refuses_a_checkpoint_with_a_pending_sum():
    model, opt, dl = _private_with_physical_batches()
    state = opt.state_dict()
    state["pending"] = {"gradient": torch.zeros(3)}    # what an older dpfy wrote mid-batch
    with pytest.raises(PrivacyRefusal, match="logical-batch boundary"):
        opt.load_state_dict(state)
