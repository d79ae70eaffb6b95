"""Individualized budgets end to end (issue 13; IDP-SGD Sample and Scale of Boenisch et al. 2024,
as reviewed by Monir, Fauzan & Ghinita 2023, §5): per-group rates and
thresholds in the step, one ledger per group, ε per group checked with dp_accounting directly,
and the per-group ε guard."""

import dp_accounting
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from dpfy.errors import BudgetExhausted
from dpfy.privacy.individual import random_budgets

N, BATCH, DELTA, C = 1000, 10, 1e-5, 1.0   # q = 0.01: cheap RDP atoms


def rdp_epsilon(q: float, sigma: float, steps: int) -> float:
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)),
                steps)
    return acc.get_epsilon(DELTA)


def setup(variant: str, budgets=None):
    g = torch.Generator().manual_seed(0)
    ds = TensorDataset(torch.randn(N, 5, generator=g), torch.randint(0, 3, (N,), generator=g))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    eps = random_budgets([2.0, 6.0], [0.6, 0.4], N, seed=1) if budgets is None else budgets
    model, opt, loader = dpfy.make_private(
        model, opt, DataLoader(ds, batch_size=BATCH), budgets=eps, individual=variant,
        target_delta=DELTA, epochs=1, max_grad_norm=C, accountant="rdp", seed=0)
    return model, opt, loader, eps


def train(model, opt, loader, steps=None):
    """Step until the loader ends or ``steps`` (default: the planned max_steps) were taken."""
    stop = opt.max_steps if steps is None else steps
    for x, y in loader:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        if opt.step_count >= stop:
            return


def test_sample_rates_ledgers_and_guard():
    model, opt, loader, eps = setup("sample")
    groups = opt.privacy_groups.groups
    assert [g.budget for g in groups] == [2.0, 6.0]
    assert [g.size for g in groups] == [600, 400]
    rates = opt.sampler.rates.numpy()
    for g in groups:   # every example of a group is sampled at its group's q_p
        assert np.all(rates[eps == g.budget] == g.sample_rate)
    # Empirical inclusion rate per group over 300 draws (binomial, 5σ band).
    hits = np.zeros(N)
    for _ in range(300):
        hits[opt.sampler.draw().numpy()] += 1
    for g in groups:
        rate = hits[eps == g.budget].sum() / (300 * g.size)
        assert abs(rate - g.sample_rate) <= 5 * np.sqrt(g.sample_rate / (300 * g.size))
    train(model, opt, loader)
    steps = opt.step_count
    assert steps == opt.max_steps == N // BATCH
    sigma = opt.noise_multiplier
    reported = opt.group_epsilons(DELTA, accountant="rdp")
    for g, e in zip(groups, reported):
        expected = rdp_epsilon(g.sample_rate, sigma, steps)    # (q_p, σ, T) by dp_accounting
        assert e == pytest.approx(expected, rel=1e-9)
        assert e <= g.budget
    # The run's own ledger is the worst case: the largest rate for everyone.
    assert opt.ledger.step_groups[0].sample_rate == max(g.sample_rate for g in groups)
    # The per-group guard stops a step beyond the calibrated run even after a re-plan.
    opt.max_steps = steps + 50
    with pytest.raises(BudgetExhausted, match="privacy group 0"):
        train(model, opt, loader, steps=steps + 50)


def test_scale_thresholds_noise_and_group_epsilons():
    model, opt, loader, eps = setup("scale")
    groups = opt.privacy_groups.groups
    clips = opt.clipping.clips.numpy()
    c_p = {g.budget: float(clips[eps == g.budget][0]) for g in groups}
    assert c_p[2.0] < C < c_p[6.0]
    # Noise std on the sum is σ_scale·c: σ_t times the step's sensitivity max c_p.
    sensitivity = opt.clipping.sensitivity(opt.clipping.default_clip())
    std = opt.noise_multiplier * sensitivity
    # Clipped contributions of group p have norm ≤ c_p (weights of the run's policy).
    sq = {"w": torch.linspace(0.0, 25.0, N, dtype=torch.float64)}            # ‖g_i‖² up to 25
    w = opt.clipping.weights(sq, opt.clipping.default_clip(), index=torch.arange(N))["w"]
    contrib = (w * sq["w"].sqrt()).numpy()
    for b, c in c_p.items():
        assert contrib[eps == b].max() <= c * (1 + 1e-12)
    train(model, opt, loader)
    steps = opt.step_count
    reported = opt.group_epsilons(DELTA, accountant="rdp")
    for g, e in zip(groups, reported):
        sigma_p = std / c_p[g.budget]         # effective σ_p = noise std / its sensitivity
        assert e == pytest.approx(rdp_epsilon(BATCH / N, sigma_p, steps), rel=1e-9)
        assert e <= g.budget
    # σ_scale = std / c and the ratio-weighted mean of σ_p (IDP-SGD Scale; review §5).
    sigma_ps = [std / c_p[g.budget] for g in groups]
    assert std / C == pytest.approx(sum(g.size / N * s for g, s in zip(groups, sigma_ps)))


def test_checkpoint_keeps_group_ledgers(tmp_path):
    model, opt, loader, _ = setup("scale")
    train(model, opt, loader)
    section = opt.privacy_groups.report_section(delta=DELTA, accountant="rdp")
    assert [g["budget"] for g in section.data["groups"]] == [2.0, 6.0]
    assert [g["epsilon"] for g in section.data["groups"]] == opt.group_epsilons(DELTA, "rdp")
    report = dpfy.privacy.report.PrivacyReport.from_ledger(
        opt.ledger, delta=DELTA, accountant="rdp", sections=[section])
    assert "Per-group privacy budgets" in report.to_markdown()
    opt.privacy_groups.plot(tmp_path / "eps.png", delta=DELTA, accountant="rdp")
    assert (tmp_path / "eps.png").stat().st_size > 0
    state = opt.state_dict()
    before = opt.group_epsilons(DELTA)
    opt.privacy_groups.ledgers = [dpfy.privacy.Ledger(N) for _ in opt.privacy_groups.groups]
    opt.load_state_dict(state)
    assert opt.group_epsilons(DELTA) == before


@pytest.mark.parametrize("kwargs, match", [
    (dict(budgets=np.ones(N - 1)), "len\\(budgets\\) must be the dataset's size"),
    (dict(budgets=np.r_[np.ones(N - 1), 0.0]), "budget must be > 0"),
    (dict(individual="both"), "individual must be one of"),
    (dict(noise_multiplier=1.0), "noise_multiplier must be None with budgets"),
    (dict(clipping="per_layer"), "clipping must be 'flat' with budgets"),
    (dict(poisson_sampling=False), "poisson_sampling must be True with budgets"),
    (dict(accountant="gdp"), "accountant must be one of \\['pld', 'rdp'\\] with budgets"),
])
def test_bad_input(kwargs, match):
    ds = TensorDataset(torch.randn(N, 5), torch.randint(0, 3, (N,)))
    model = nn.Sequential(nn.Linear(5, 3))
    args = dict(budgets=np.full(N, 2.0), individual="sample", target_delta=DELTA, epochs=1,
                accountant="rdp")
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        dpfy.make_private(model, torch.optim.SGD(model.parameters(), lr=0.1),
                          DataLoader(ds, batch_size=BATCH), **args)


def test_privacy_groups_old_name_warns():
    """``optimizer.groups`` was renamed ``privacy_groups`` (issue 37 §4: the budget groups are
    not the optimizer's param_groups nor the per-layer clipping groups); the old name warns."""
    _, opt, _, _ = setup("sample")
    with pytest.warns(DeprecationWarning, match="privacy_groups"):
        assert opt.groups is opt.privacy_groups


def test_individual_budgets_old_name_warns():
    """``IndividualBudgets.groups`` was renamed ``group_ledgers``; the old name warns."""
    _, opt, _, _ = setup("sample")
    budgets = opt.private_step.individual
    with pytest.warns(DeprecationWarning, match=r"IndividualBudgets\.groups.*group_ledgers"):
        assert budgets.groups is budgets.group_ledgers
