"""The client's step of DP-FedAvg: local SGD, the delta, its clipping (McMahan et al. 2018).

Expected values are derived here: one full-batch local step at lr 1 on a summed loss moves the
model by the user's gradient sum, computed by a float64 per-example loop with autograd.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dpfy.federated import (LocalTraining, clip_delta, delta_norm, local_delta, local_generator,
                            local_seed, trainable_state)


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3)).double()


def _data(n=7, seed=1):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, 4, generator=g, dtype=torch.float64),
            torch.randint(0, 3, (n,), generator=g))


def _grad_sum_loop(model, x, y):
    """Σ_i ∇ℓ_i(θ), one example at a time (float64)."""
    total = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    for i in range(len(x)):
        model.zero_grad()
        F.cross_entropy(model(x[i:i + 1]), y[i:i + 1]).backward()
        for n, p in model.named_parameters():
            total[n] += p.grad
    return total


def test_one_full_batch_step_at_lr_one_is_the_users_gradient_sum():
    model, (x, y) = _model(), _data()
    expected = _grad_sum_loop(copy.deepcopy(model), x, y)
    delta = local_delta(model, x, y, lambda o, t: F.cross_entropy(o, t, reduction="sum"),
                        LocalTraining(epochs=1, lr=1.0))
    for n in expected:
        torch.testing.assert_close(delta[n], expected[n], rtol=1e-12, atol=1e-12)


def test_delta_is_start_minus_end_after_several_minibatch_epochs():
    model, (x, y) = _model(), _data(n=10)
    start = trainable_state(model)
    ref = copy.deepcopy(model)
    delta = local_delta(model, x, y, F.cross_entropy, LocalTraining(epochs=3, lr=0.2,
                                                                    batch_size=4))
    # a hand-written loop of the same local SGD (data order, batches of 4, 4, 2)
    opt = torch.optim.SGD(ref.parameters(), lr=0.2)
    for _ in range(3):
        for lo in (0, 4, 8):
            opt.zero_grad()
            F.cross_entropy(ref(x[lo:lo + 4]), y[lo:lo + 4]).backward()
            opt.step()
    for n, p in ref.named_parameters():
        torch.testing.assert_close(delta[n], start[n] - p.detach())
        torch.testing.assert_close(dict(model.named_parameters())[n].detach(), p.detach())


def test_clip_delta_bounds_the_norm_and_keeps_small_deltas():
    g = torch.Generator().manual_seed(0)
    delta = {"a": torch.randn(3, 4, generator=g), "b": torch.randn(5, generator=g)}
    norm = math.sqrt(sum(float(t.double().square().sum()) for t in delta.values()))
    assert delta_norm(delta) == pytest.approx(norm, rel=1e-12)
    clipped, before = clip_delta(delta, norm / 3)
    assert before == pytest.approx(norm)
    assert delta_norm(clipped) == pytest.approx(norm / 3, rel=1e-6)
    same, _ = clip_delta(delta, 2 * norm)
    for n in delta:
        assert torch.equal(same[n], delta[n])
    with pytest.raises(ValueError, match="clip must be > 0"):
        clip_delta(delta, 0.0)


def test_local_training_config_round_trips_and_seeds_are_per_round_and_user():
    t = LocalTraining(epochs=3, lr=0.05, batch_size=None)
    back = LocalTraining.from_config(t.to_config())
    assert (back.epochs, back.lr, back.batch_size) == (3, 0.05, None)
    assert local_seed(None, 0, 1) is None and local_generator(None) is None
    assert local_seed(7, 2, 3) == local_seed(7, 2, 3) != local_seed(7, 3, 2)
    with pytest.raises(ValueError, match="epochs"):
        LocalTraining(epochs=0)
