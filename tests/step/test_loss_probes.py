"""Loss probes: a method's extra forward passes on the step's batch at perturbed parameters.

The probe releases Σ_i clip(ℓ_i(θ + Δθ), −R, R) + N(0, std²) (sensitivity R). With Δθ = −θ the
model is all zeros, so every logit is 0 and each example's cross-entropy is ln K exactly
(K classes): the released sum is B·ln K plus noise — a derivation, not the code under test.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from dpfy.adaptive import Method
from dpfy.types import ReleaseSpec

K = 3
STD = 1e-3


def per_example_ce(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y, reduction="none")   # (B,)


class ZeroModelProbe(Method):
    """Declares a loss spec: the step then needs make_private(loss_fn=...) (derived, no flag)."""

    def __init__(self, params, bound=10.0):
        self.offsets = {n: -p.detach().clone() for n, p in params}
        self.bound, self.seen = bound, []

    def releases(self, state, plan):
        return {"loss_probe": ReleaseSpec(self.bound, STD, kind="loss", offsets=self.offsets,
                                          label="the loss sum at θ = 0")}

    def update(self, state, released):
        self.seen.append(released.sums["loss_probe"])
        return state


def _run(bound=10.0, **kw):
    torch.manual_seed(0)
    ds = TensorDataset(torch.randn(60, 4), torch.randint(0, K, (60,)))
    model = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, K))
    method = ZeroModelProbe(model.named_parameters(), bound)
    before = [p.detach().clone() for p in model.parameters()]
    model, opt, dl = dpfy.make_private(
        model, torch.optim.SGD(model.parameters(), lr=0.0), DataLoader(ds, batch_size=15),
        noise_multiplier=1.0, max_grad_norm=1.0, method=method, seed=0, **kw)
    sizes = []
    for x, y in dl:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        if opt.step_count > len(sizes):
            sizes.append(opt.last_step_info["batch_size"])
    return method, opt, sizes, before, model


def test_probe_releases_the_clipped_loss_sum_at_the_perturbed_parameters():
    method, opt, sizes, before, model = _run(loss_fn=per_example_ce, max_physical_batch_size=4)
    for got, b in zip(method.seen, sizes):
        assert got == pytest.approx(b * math.log(K), abs=6 * STD)
    # θ itself was restored exactly after every probe (lr = 0: nothing else moves it)
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
    (group,) = list(opt.ledger)
    assert [(r.mechanism, r.noise_multiplier) for r in group.releases] == [
        ("gradient", 1.0), ("loss_probe", STD / 10.0)]


def test_losses_are_clipped_to_the_declared_bound():
    method, _, sizes, _, _ = _run(bound=0.5, loss_fn=per_example_ce)
    for got, b in zip(method.seen, sizes):
        assert got == pytest.approx(b * 0.5, abs=6 * STD)   # ln 3 > 0.5: every loss clipped


def test_a_probing_method_needs_a_loss_fn():
    with pytest.raises(ValueError, match="loss_fn must be a callable for method"):
        _run()
