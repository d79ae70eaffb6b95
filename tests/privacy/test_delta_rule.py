"""δ against the number of units of privacy (issue 35 §3): the "How to DP-fy ML" guide asks
δ ≪ 1/N, N in units of privacy, since about δ·N units may be revealed outright. dpfy warns at
δ ≥ 1/N and refuses δ ≥ 1/√N (dpfy/privacy/delta_check.py states why)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from dpfy.privacy.delta_check import DeltaWarning


def _private(n: int, delta: float, **kw):
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(n, 4, generator=g), torch.randint(0, 2, (n,), generator=g))
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return dpfy.make_private(model, opt, DataLoader(data, batch_size=20), target_epsilon=3.0,
                             target_delta=delta, epochs=1, accountant="rdp", **kw)


def test_delta_at_or_above_one_over_root_n_is_refused():
    # 400 examples: 1/√N = 0.05, so the δ = 0.1 (δ·N = 40 examples) is refused
    with pytest.raises(ValueError, match=r"target_delta must be < 1/√N = 0\.05 for N = 400 "
                                         r"examples.*got target_delta = 0\.1\. Use δ = 1/N\^1\.1"):
        _private(400, 0.1)
    with pytest.raises(ValueError, match="1/√N"):
        _private(400, 0.05)                                   # the bound itself


def test_delta_between_one_over_n_and_one_over_root_n_warns():
    with pytest.warns(DeltaWarning, match=r">= 1/N = 0\.0025 for N = 400 examples"):
        _private(400, 0.01)                                   # 1/400 <= 0.01 < 1/20


def test_delta_below_one_over_n_is_quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeltaWarning)
        _private(400, 400 ** -1.1)


def test_user_level_counts_users():
    """N is the number of users under user-level DP: with 40 users, δ = 0.05 is ≥ 1/40 = 0.025
    (warned) and < 1/√40 = 0.158 (runs); δ = 0.2 is refused. Counted in examples (400), 0.05
    would have been refused and 0.2 too, so the message's N is what is tested."""
    ids = torch.arange(400) % 40
    with pytest.warns(DeltaWarning, match="N = 40 users"):
        _private(400, 0.05, user_ids=ids, user_sampling="uls", max_examples_per_user=10)
    with pytest.raises(ValueError, match="N = 40 users"):
        _private(400, 0.2, user_ids=ids, user_sampling="uls", max_examples_per_user=10)
