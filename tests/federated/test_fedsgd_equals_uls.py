"""DP-FedSGD is ULS: one local step at lr 1 on a user's whole data with a summed loss makes the
user's delta their gradient sum, so DP-FedAvg's server step equals make_private's user-level
sampling step with a per-user clip on the sum (Ponomareva et al. 2023 §4.4; Charles et al.
2024's ULS). Checked noise-free with every user sampled (q_u = 1), so both runs see the same
users; the expected value of each is the other's, neither is computed from the code under
test alone."""

from __future__ import annotations

import copy
import inspect

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from dpfy.federated import DPFedAvgServer, LocalTraining, run_dp_fedavg

ULS_READY = "user_ids" in inspect.signature(dpfy.make_private).parameters
pytestmark = pytest.mark.skipif(
    not ULS_READY, reason="make_private(user_ids=..., user_sampling='uls') is built on branch "
                          "i26-users (issue 26 §2); this test runs once it is merged")

N_USERS, CLIP, LR = 4, 0.3, 0.5


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3))


def _data():
    g = torch.Generator().manual_seed(1)
    sizes = [2, 5, 3, 6]
    ids = torch.repeat_interleave(torch.arange(N_USERS), torch.tensor(sizes))
    x = torch.randn(len(ids), 4, generator=g)
    y = torch.randint(0, 3, (len(ids),), generator=g)
    return x, y, ids


def test_one_local_step_at_lr_one_is_the_uls_step_with_a_clip_on_the_sum():
    x, y, ids = _data()
    users = [(x[ids == u], y[ids == u]) for u in range(N_USERS)]
    fed = DPFedAvgServer(_model(), num_users=N_USERS, user_sample_rate=1.0, clip=CLIP,
                         noise_multiplier=0.0, server_lr=LR, rounds=2, seed=0)
    run_dp_fedavg(fed, users, lambda o, t: F.cross_entropy(o, t, reduction="sum"),
                  LocalTraining(epochs=1, lr=1.0, batch_size=None), 2)

    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    loader = DataLoader(TensorDataset(x, y), batch_size=N_USERS)   # q_u = N_USERS / U = 1
    model, opt, loader = dpfy.make_private(
        model, opt, loader, noise_multiplier=0.0, max_grad_norm=CLIP, seed=0,
        user_ids=ids, user_sampling="uls", user_reduction="sum", max_steps=2)
    for _ in range(2):                       # q_u = 1: one logical batch per pass
        for xb, yb in loader:
            opt.zero_grad()
            F.cross_entropy(model(xb), yb).backward()
            opt.step()
    assert opt.ledger.num_steps == fed.ledger.num_steps == 2
    uls = {n: p.detach() for n, p in model.named_parameters()}
    for n, p in fed.model.named_parameters():
        torch.testing.assert_close(p.detach(), uls[n], rtol=1e-5, atol=1e-6)
