"""Microbatch clipping (Ponomareva et al. 2023, §5.6, Algorithm 3) through the private step.

Expected values are derived here: the update is −(1/M) Σ_m clip_C(mean of microbatch m's
gradients), from the float64 per-example loop (``tests/oracles.py``) grouped by the partition
dpfy drew; the noise std on the released average is 2σC/M (Algorithm 3: variance 4σ²C² on the
sum of M clipped means); k = 1 is per-example DP-SGD.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
import oracles
from dpfy.errors import PrivacyRefusal

N = 40


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 6), nn.Tanh(), nn.Linear(6, 3))


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(N, 5, generator=g) * 3, torch.arange(N) % 3


def _private(model, *, batch_size, sigma, k, clipping="microbatch", physical=None, lr=1.0):
    x, y = _data()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # σ = 0 warns: not private (this checks the sums)
        return dpfy.make_private(
            model, torch.optim.SGD(model.parameters(), lr=lr),
            DataLoader(TensorDataset(x, y), batch_size=batch_size), noise_multiplier=sigma,
            max_grad_norm=0.3, seed=5, clipping=clipping,
            microbatch_size=k if clipping == "microbatch" else None,
            max_physical_batch_size=physical)


def _one_step(model, opt, dl):
    rows, bins = [], []
    for xb, yb in dl:
        idx = dl.cursor.indices.clone()
        rows.append(idx)
        units = getattr(dl.sampler, "units", None)
        if hasattr(units, "microbatch_of"):
            bins.append(units.microbatch_of[idx].clone())
        opt.zero_grad()
        F.cross_entropy(model(xb), yb).backward()
        opt.step()
        if opt.updated:
            break
    return torch.cat(rows), (torch.cat(bins) if bins else None)


@pytest.mark.parametrize("physical", [None, 12])
def test_each_microbatch_mean_is_clipped_like_the_float64_loop(physical):
    k, b, clip = 4, 20, 0.3
    model = _model()
    before = {n: p.detach().clone().double() for n, p in model.named_parameters()}
    ref = _model().double()
    model, opt, dl = _private(model, batch_size=b, sigma=0.0, k=k, physical=physical)
    rows, bins = _one_step(model, opt, dl)
    m = round(b / k)   # Algorithm 3's M: the expected number of microbatches
    assert dl.sampler.normalizer == m and len(dl) == N // b
    x, y = _data()
    per_example = oracles.per_example_grads(ref, x[rows], y[rows], F.cross_entropy)
    total = {n: torch.zeros(g.shape[1:], dtype=torch.float64) for n, g in per_example.items()}
    assert len(bins.unique()) > 1 and bool((bins.bincount() != 1).any())   # real microbatches
    for mb in bins.unique():
        mine = bins == mb
        mean = {n: g[mine].mean(0) for n, g in per_example.items()}
        norm = float(torch.sqrt(sum(t.square().sum() for t in mean.values())))
        for n in total:
            total[n] += min(1.0, clip / norm) * mean[n]
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.detach().double() - before[n], -total[n] / m, rtol=1e-4,
                                   atol=1e-6)


def test_k_equal_1_is_per_example_dp_sgd():
    runs = []
    for clipping in ("flat", "microbatch"):
        model, opt, dl = _private(_model(), batch_size=10, sigma=1.3, k=1, clipping=clipping,
                                  lr=0.5)
        for _ in range(3):
            _one_step(model, opt, dl)
        runs.append(([p.detach().clone() for p in model.parameters()], opt.ledger.to_dict(),
                     opt.epsilon(1e-5)))
    (p_flat, l_flat, e_flat), (p_mb, l_mb, e_mb) = runs
    for a, c in zip(p_flat, p_mb):
        assert torch.equal(a, c)
    assert l_flat == l_mb and e_flat == e_mb


def test_noise_std_is_2_sigma_C_over_M_and_the_ledger_records_sigma_at_sensitivity_2C():
    """All gradients are zero: the released average is the noise alone, N(0, (2σC/M)²)."""
    sigma, clip, k, b = 0.7, 0.3, 4, 20
    torch.manual_seed(0)
    model = nn.Linear(400, 500)   # 200,500 noise draws: the std to within ~0.5 %
    x = torch.randn(N, 400)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, opt, dl = dpfy.make_private(
            model, torch.optim.SGD(model.parameters(), lr=1.0),
            DataLoader(TensorDataset(x), batch_size=b), noise_multiplier=sigma,
            max_grad_norm=clip, seed=1, clipping="microbatch", microbatch_size=k)
    before = model.weight.detach().clone()
    for (xb,) in dl:
        opt.zero_grad()
        (model(xb) * 0.0).sum(1).mean().backward()  # a zero gradient, mean over examples
        opt.step()
        break
    m = b / k
    std = float((model.weight.detach() - before).std())
    assert std == pytest.approx(2 * sigma * clip / m, rel=0.02)
    assert std != pytest.approx(sigma * clip / m, rel=0.2)   # not the per-example Δ = C
    (release,) = opt.ledger.step_groups[0].releases
    assert release.noise_multiplier == sigma   # σ relative to the sum's Δ = 2C
    assert opt.ledger.step_groups[0].sampling.value == "poisson"
    assert opt.ledger.step_groups[0].sample_rate == b / N


def test_removing_one_example_moves_the_sum_by_at_most_2C_and_a_larger_contribution_is_refused():
    from dpfy.clipping import make_clipping
    policy = make_clipping("microbatch", 0.3, [["w"]])
    assert policy.sensitivity(0.3) == pytest.approx(0.6)
    # two microbatch means of norm <= C, pointing opposite ways: their difference is 2C
    g = torch.tensor([0.3, 0.0])
    assert float((g - (-g)).norm()) == pytest.approx(policy.sensitivity(0.3))


def test_refusals_name_the_argument():
    x, y = _data()
    model = _model()
    with pytest.raises(ValueError, match="microbatch_size"):
        dpfy.make_private(model, torch.optim.SGD(model.parameters(), lr=1.0),
                          DataLoader(TensorDataset(x, y), batch_size=10), noise_multiplier=1.0,
                          microbatch_size=4)   # without clipping='microbatch'
    model = _model()
    with pytest.raises(PrivacyRefusal, match="user_ids"):
        dpfy.make_private(model, torch.optim.SGD(model.parameters(), lr=1.0),
                          DataLoader(TensorDataset(x, y), batch_size=10), noise_multiplier=1.0,
                          clipping="microbatch", microbatch_size=4,
                          user_ids=torch.arange(N), user_sampling="uls")
    model = _model()
    with pytest.raises(ValueError, match="poisson_sampling"):
        dpfy.make_private(model, torch.optim.SGD(model.parameters(), lr=1.0),
                          DataLoader(TensorDataset(x, y), batch_size=10), noise_multiplier=1.0,
                          clipping="microbatch", microbatch_size=4, poisson_sampling=False)
    model = _model()
    with pytest.raises(ValueError, match="microbatch_size"):
        dpfy.make_private(model, torch.optim.SGD(model.parameters(), lr=1.0),
                          DataLoader(TensorDataset(x, y), batch_size=10), noise_multiplier=1.0,
                          clipping="microbatch")


def test_a_physical_batch_smaller_than_a_microbatch_is_refused():
    model, opt, dl = _private(_model(), batch_size=40, sigma=1.0, k=8, physical=2)
    with pytest.raises(PrivacyRefusal, match="max_physical_batch_size"):
        _one_step(model, opt, dl)
