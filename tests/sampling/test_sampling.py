"""Poisson sampling statistics, per-example rates, dpfy's shuffled passes, and the shared facts."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from dpfy.privacy import Sampling
from dpfy.sampling import PoissonSampler, ShuffleSampler


def test_poisson_batch_sizes_mean_qn_variance_qn_one_minus_q():
    # Binomial(N, q): mean qN = 50, variance qN(1−q) = 47.5
    n, q, draws = 1000, 0.05, 3000
    s = PoissonSampler(n, sample_rate=q, seed=0)
    sizes = torch.tensor([len(s.draw()) for _ in range(draws)], dtype=torch.float64)
    se_mean = (n * q * (1 - q) / draws) ** 0.5
    assert abs(float(sizes.mean()) - n * q) < 4 * se_mean
    var = float(sizes.var())
    se_var = n * q * (1 - q) * (2 / (draws - 1)) ** 0.5  # normal approximation
    assert abs(var - n * q * (1 - q)) < 4 * se_var


def test_poisson_membership_is_independent_and_uniform():
    s = PoissonSampler(50, sample_rate=0.2, seed=1)
    counts = torch.zeros(50)
    for _ in range(2000):
        counts[s.draw()] += 1
    # each example: Binomial(2000, 0.2), mean 400, sd ≈ 17.9
    assert float((counts - 400).abs().max()) < 5 * 17.9


def test_per_example_rates():
    rates = torch.tensor([0.1] * 100 + [0.5] * 100, dtype=torch.float64)
    s = PoissonSampler(200, sample_rates=rates, seed=2)
    hits = torch.zeros(200)
    for _ in range(1000):
        hits[s.draw()] += 1
    assert abs(float(hits[:100].mean()) / 1000 - 0.1) < 0.01
    assert abs(float(hits[100:].mean()) / 1000 - 0.5) < 0.01
    assert s.sample_rate == 0.5  # ledger: the largest rate bounds every example
    assert abs(s.normalizer - 60.0) < 1e-9  # b = Σ q_i


def test_loader_and_ledger_read_the_same_sampler():
    ds = TensorDataset(torch.randn(30, 4), torch.randint(0, 2, (30,)))
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt, dl = dpfy.make_private(model, opt, DataLoader(ds, batch_size=6),
                                       noise_multiplier=1.0, seed=0)
    assert opt.sampler is dl.sampler
    for x, y in dl:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    (group,) = list(opt.ledger)
    assert group.sampling is Sampling.POISSON and group.sample_rate == 6 / 30
    assert group.count == len(dl) == 5 and opt.ledger.dataset_size == 30


def test_shuffled_mode_uses_dpfys_permutation_and_records_shuffle():
    ds = TensorDataset(torch.randn(30, 4), torch.randint(0, 2, (30,)))
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    user = DataLoader(ds, batch_size=10, shuffle=True)
    model, opt, dl = dpfy.make_private(model, opt, user, noise_multiplier=1.0, seed=0,
                                       poisson_sampling=False)
    assert isinstance(dl.sampler, ShuffleSampler) and opt.sampler is dl.sampler
    sizes, seen = [], []
    for x, y in dl:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        sizes.append(x.shape[0])
        seen += dl.cursor.indices.tolist()
    assert sizes == [10, 10, 10] and dl.sampler.normalizer == 10
    assert sorted(seen) == list(range(30))
    (group,) = list(opt.ledger)
    assert group.sampling is Sampling.SHUFFLE and group.sample_rate == 10 / 30


def test_shuffled_checkpoint_through_the_optimizer_resumes_the_pass():
    ds = TensorDataset(torch.arange(26).float()[:, None], torch.zeros(26, dtype=torch.long))

    def private():
        torch.manual_seed(0)
        model = nn.Linear(1, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        return dpfy.make_private(model, opt, DataLoader(ds, batch_size=4, shuffle=True),
                                 noise_multiplier=1.0, seed=3, poisson_sampling=False)

    def run(model, opt, dl, steps):
        out = []
        for x, y in dl:
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            out.append(x[:, 0].long().tolist())
            if len(out) == steps:
                break
        return out

    model, opt, dl = private()
    head = run(model, opt, dl, 3)
    weights, state = copy.deepcopy(model.state_dict()), opt.state_dict()
    tail = run(model, opt, dl, 4) + run(model, opt, dl, 4)
    model2, opt2, dl2 = private()
    model2.load_state_dict(weights)   # the model first: the optimizer's ledger is its model's
    opt2.load_state_dict(state)
    assert run(model2, opt2, dl2, 4) + run(model2, opt2, dl2, 4) == tail
    first_pass = sum(head + tail[:4], [])  # 7 batches = ceil(26 / 4)
    assert sorted(first_pass) == list(range(26))


def test_seed_none_draws_poisson_masks_from_the_os():
    s = PoissonSampler(100, sample_rate=0.5)
    assert s.secure and s.state_dict() == {"generator": None}
    assert not torch.equal(s.draw(), s.draw())  # equal with probability 2^-100


def test_same_seed_same_batches_different_seed_different():
    ds = TensorDataset(torch.arange(100).float()[:, None], torch.zeros(100, dtype=torch.long))

    def batches(seed):
        model = nn.Linear(1, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        _, _, dl = dpfy.make_private(model, opt, DataLoader(ds, batch_size=10),
                                     noise_multiplier=1.0, seed=seed)
        return [dl.cursor.indices.tolist() for _ in dl]

    assert batches(5) == batches(5) != batches(6)
