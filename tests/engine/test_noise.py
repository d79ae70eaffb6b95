"""Noise sources: seeded draws are reproducible; secure draws come from the OS CSPRNG."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from dpfy.noise import NoiseSource, secure_uniform


def test_seeded_noise_is_reproducible_and_resumable():
    a, b = NoiseSource(5), NoiseSource(5)
    like = torch.zeros(1000)
    assert torch.equal(a.gaussian(like, 1.0), b.gaussian(like, 1.0))
    state = a.state_dict()
    x = a.gaussian(like, 1.0)
    a.load_state_dict(state)
    assert torch.equal(a.gaussian(like, 1.0), x)


def test_secure_noise_has_the_right_law_and_ignores_the_seed():
    a, b = NoiseSource(5, secure=True), NoiseSource(5, secure=True)
    z = a.gaussian(torch.zeros(200_000, dtype=torch.float64), 3.0)
    # 2e5 draws: std error of the std ≈ 3/√(4e5) ≈ 0.005; of the mean ≈ 0.007
    assert abs(float(z.std()) - 3.0) < 0.03 and abs(float(z.mean())) < 0.04
    # fourth moment of a Gaussian is 3σ⁴ (kurtosis check that it is not uniform-shaped)
    assert abs(float((z / 3).pow(4).mean()) - 3.0) < 0.1
    like = torch.zeros(100)
    assert not torch.equal(a.gaussian(like, 1.0), b.gaussian(like, 1.0))
    u = secure_uniform(10_000)
    assert 0 < float(u.min()) and float(u.max()) < 1 and abs(float(u.mean()) - 0.5) < 0.02


def test_secure_mode_end_to_end():
    ds = TensorDataset(torch.randn(20, 3), torch.randint(0, 2, (20,)))
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt, dl = dpfy.make_private(model, opt, DataLoader(ds, batch_size=5),
                                       noise_multiplier=1.0, secure_mode=True, seed=1)
    assert opt.noise.secure and dl.sampler.secure
    for x, y in dl:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    assert opt.step_count == 4
