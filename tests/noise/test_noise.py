"""NoiseSource's API: secure by default, reproducible from a seed, backend choices and their
refusals, checkpoints of either mode."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from dpfy.noise import NoiseSource


def test_seeded_noise_is_reproducible_and_resumable():
    for backend in ("auto", "torch"):
        a, b = NoiseSource(5, backend=backend), NoiseSource(5, backend=backend)
        assert a.reproducible and not a.secure
        like = torch.zeros(1000)
        assert torch.equal(a.gaussian(like, 1.0), b.gaussian(like, 1.0))
        state = a.state_dict()
        x = a.gaussian(like, 1.0)
        a.load_state_dict(state)
        assert torch.equal(a.gaussian(like, 1.0), x)


def test_secure_noise_has_the_right_law_and_is_not_reproducible():
    a, b = NoiseSource(), NoiseSource()
    z = a.gaussian(torch.zeros(200_000, dtype=torch.float64), 3.0)
    # 2e5 draws: std error of the std ≈ 3/√(4e5) ≈ 0.005; of the mean ≈ 0.007
    assert abs(float(z.std()) - 3.0) < 0.03 and abs(float(z.mean())) < 0.04
    # fourth moment of a Gaussian is 3σ⁴ (kurtosis check that it is not uniform-shaped)
    assert abs(float((z / 3).pow(4).mean()) - 3.0) < 0.1
    like = torch.zeros(100)
    assert not torch.equal(a.gaussian(like, 1.0), b.gaussian(like, 1.0))


def test_backend_choices_that_contradict_the_mode_are_refused_with_the_fix():
    with pytest.raises(ValueError, match='backend must be not "torch".*seed=<int>'):
        NoiseSource(backend="torch")
    with pytest.raises(ValueError, match='backend must be not "urandom".*seed=None'):
        NoiseSource(3, backend="urandom")
    with pytest.raises(ValueError, match="backend must be one of"):
        NoiseSource(backend="fast")
    assert NoiseSource(backend="urandom").backend == "urandom"


def test_state_dicts_say_mode_and_backend_and_switch_on_load():
    for src, backend in ((NoiseSource(), "chacha20"), (NoiseSource(1), "xoshiro"),
                         (NoiseSource(1, backend="torch"), "torch"),
                         (NoiseSource(backend="urandom"), "urandom")):
        state = src.state_dict()
        assert state["backend"] == backend and state["reproducible"] == src.reproducible
        other = NoiseSource(2) if not src.reproducible else NoiseSource()
        other.load_state_dict(state)
        assert other.backend == backend and other.reproducible == src.reproducible


def test_std_zero_adds_nothing():
    for src in (NoiseSource(), NoiseSource(1, backend="torch")):
        t = torch.arange(6.0)
        assert torch.equal(src.add_gaussian_(t.clone(), 0.0), t)
        assert torch.equal(src.noisy_mean(t.clone(), 0.0, 2.0), t / 2)
        assert torch.equal(src.gaussian(t, 0.0), torch.zeros(6))


def test_make_private_noise_is_secure_unless_seeded():
    ds = TensorDataset(torch.randn(20, 3), torch.randint(0, 2, (20,)))
    for seed in (None, 1):
        model = nn.Linear(3, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model, opt, dl = dpfy.make_private(model, opt, DataLoader(ds, batch_size=5),
                                           noise_multiplier=1.0, seed=seed)
        assert opt.mechanism.generator().reproducible == (seed is not None)
        assert opt.mechanism.generator().backend == ("xoshiro" if seed is not None else "chacha20")
        for x, y in dl:
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
        assert opt.step_count == 4
