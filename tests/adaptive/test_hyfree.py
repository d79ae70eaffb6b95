"""HyFreeDP (digest 004): the quadratic fit, the η safeguards, the budget split on the run's own
ledger, the probes' releases and direction, and the refusals.

Numbers come from derivations written here (the quadratic), from dp_accounting (ε of the
ledger, tests/ledger_events.py) and from the digest's Algorithm 2 (σ_g = 1.01σ).
"""

from __future__ import annotations

import math

import dp_accounting
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from dpfy.adaptive.hyfree import PROBES, HyFreeDP, fit_quadratic, next_learning_rate
from ledger_events import dp_accounting_epsilon, effective_sigma


# -- the fit ---------------------------------------------------------------------------------
def _quadratic():
    """L(w) = ½ wᵀAw − cᵀw with A positive definite, a point w and a direction d."""
    g = torch.Generator().manual_seed(0)
    m = torch.randn(4, 4, generator=g, dtype=torch.float64)
    a = m @ m.T + 4 * torch.eye(4, dtype=torch.float64)
    c = torch.randn(4, generator=g, dtype=torch.float64)
    w = torch.randn(4, generator=g, dtype=torch.float64)
    grad = a @ w - c
    d = grad + 0.3 * torch.randn(4, generator=g, dtype=torch.float64)  # a descent direction
    return (lambda v: float(0.5 * v @ a @ v - c @ v)), a, grad, w, d


def test_fit_recovers_directional_derivative_and_curvature_exactly():
    """On a quadratic the three-point fit is exact: b = ∇Lᵀd, a = dᵀAd (digest §2.5)."""
    loss, a_mat, grad, w, d = _quadratic()
    eta = 0.05
    a, b = fit_quadratic(loss(w - eta * d), loss(w), loss(w + eta * d), eta)
    assert b == pytest.approx(float(grad @ d), rel=1e-9)
    assert a == pytest.approx(float(d @ a_mat @ d), rel=1e-9)


def test_noise_free_update_is_the_exact_line_minimizer():
    """σ_l = 0, no smoothing, a wide clamp: η_new = ∇Lᵀd / dᵀAd, and one step with it minimizes
    L along d (checked against a fine grid of step sizes)."""
    loss, a_mat, grad, w, d = _quadratic()
    eta = 0.01
    a, b = fit_quadratic(loss(w - eta * d), loss(w), loss(w + eta * d), eta)
    new = next_learning_rate(eta, a, b, max_change=1e6, smoothing=0.0)
    exact = float(grad @ d) / float(d @ a_mat @ d)
    assert new == pytest.approx(exact, rel=1e-9)
    grid = torch.linspace(0, 4 * exact, 4001, dtype=torch.float64)
    best = float(grid[torch.tensor([loss(w - s * d) for s in grid]).argmin()])
    assert abs(best - exact) <= float(grid[1])


@pytest.mark.parametrize("a, b, std_a, std_b, expected", [
    (4.0, 2.0, 0.0, 0.0, 0.5),       # curvature seen: b/a
    (4.0, 200.0, 0.0, 0.0, 2.0),     # b/a = 50, clamped to 2η
    (4.0, -1.0, 0.0, 0.0, 0.5),      # seen curvature, ascending: b/a < 0 → clamped to η/2
    (-1.0, 1.0, 0.0, 0.0, 2.0),      # concave along d: the minimum lies beyond → grow
    (0.5, -3.0, 1.0, 1.0, 0.5),      # a not seen (0.5 < 2·1), b seen < 0 → shrink
    (1.5, 1.0, 1.0, 1.0, 2.0),       # neither seen: too small a step to resolve → grow
    (float("nan"), 1.0, 0.0, 0.0, 0.5),
])
def test_safeguards(a, b, std_a, std_b, expected):
    """The documented rules at η = 1, max_change = 2, no smoothing."""
    assert next_learning_rate(1.0, a, b, max_change=2.0, smoothing=0.0, std_a=std_a,
                              std_b=std_b) == pytest.approx(expected)


def test_smoothing_mixes_old_and_target():
    assert next_learning_rate(1.0, 4.0, 8.0, max_change=4.0, smoothing=0.9) == \
        pytest.approx(0.9 * 1.0 + 0.1 * 2.0)


# -- a run -----------------------------------------------------------------------------------
N, B, EPOCHS, K = 240, 24, 2, 5      # 20 steps: probe rounds at t = 0, 5, 10, 15


def _loss_fn(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y, reduction="none")


def _run(accountant="rdp", steps_to_take=None, **options):
    torch.manual_seed(0)
    x = torch.randn(N, 6)
    y = (x[:, 0] > 0).long()
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.01)
    model, opt, loader = dpfy.make_private(
        model, opt, DataLoader(TensorDataset(x, y), batch_size=B), target_epsilon=2.0,
        target_delta=1e-5, epochs=EPOCHS, accountant=accountant,
        method=HyFreeDP(probe_every=K, **options), loss_fn=_loss_fn)
    trace = []   # (step, θ before, θ after, state after)
    for _ in range(EPOCHS):
        for xb, yb in loader:
            before = {n: p.detach().clone() for n, p in model.named_parameters()}
            opt.zero_grad()
            F.cross_entropy(model(xb), yb).backward()
            opt.step()
            after = {n: p.detach().clone() for n, p in model.named_parameters()}
            trace.append((before, after, opt.method_state))
    return opt, trace


@pytest.fixture(scope="module")
def run():
    return _run()


def test_ledger_spends_the_target_by_dp_accounting_and_sigma_g_is_1_01_sigma(run):
    """ε of the run's own ledger by dp_accounting (probe steps as one Gaussian at σ_eff) is the
    target; σ_g/1.01 is the σ plain DP-SGD would need for the same (ε, δ, q, T)."""
    opt, _ = run
    method = opt.method
    assert dp_accounting_epsilon(opt.ledger, 1e-5, "rdp") == pytest.approx(2.0, abs=2e-3)
    sigma = method.gradient_noise / 1.01
    plain = dp_accounting.rdp.RdpAccountant()
    plain.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
        B / N, dp_accounting.GaussianDpEvent(sigma)), N // B * EPOCHS))
    assert plain.get_epsilon(1e-5) == pytest.approx(2.0, abs=2e-3)


def test_probe_rounds_are_composed_with_their_gradient_step(run):
    """Steps 0, K, 2K, ... release the gradient and the three losses on one Poisson sample:
    recorded as one step, σ_eff⁻² = σ_g⁻² + 3σ_l⁻² (digest §4.4), never as separate steps."""
    opt, _ = run
    m = opt.method
    steps = [(g.first_step + i, g) for g in opt.ledger.groups for i in range(g.count)]
    assert len(steps) == N // B * EPOCHS
    for t, g in steps:
        names = [r.mechanism for r in g.releases]
        if t % K == 0:
            assert sorted(names) == sorted(["gradient", *PROBES])
            assert effective_sigma(g) == pytest.approx(
                (m.gradient_noise ** -2 + 3 * m.loss_noise ** -2) ** -0.5)
        else:
            assert names == ["gradient"]


def test_probes_declare_loss_noise_and_direction_of_the_applied_update(run):
    """The round at step K probes θ ∓ η d with d = (θ_{K−1} − θ_K)/η_{K−1}, the update the
    optimizer applied (AdamW's, weight decay included), and each loss release has sensitivity
    R_l and noise std σ_l·R_l."""
    opt, trace = run
    m = opt.method
    before, after, state = trace[K - 1]            # after step K−1: direction for step K
    applied_lr = trace[K - 2][2].lr                 # η used at step K−1
    for n, d in state.direction.items():
        torch.testing.assert_close(d, (before[n] - after[n]) / applied_lr)
    from dpfy.plan import StepPlan
    specs = m.releases(state, StepPlan(step=K, sample_rate=B / N, noise_multiplier=1.0, clip=1.0))
    assert set(specs) == set(PROBES)
    for name, spec in specs.items():
        assert spec.sensitivity == state.loss_clip
        assert spec.noise_std == pytest.approx(m.loss_noise * state.loss_clip)
        for n, off in spec.offsets.items():
            torch.testing.assert_close(off, -PROBES[name] * state.lr * state.direction[n])
    assert specs["loss_probe_at_theta"].offsets == {}


def test_learning_rate_and_loss_clip_adapt_from_releases(run):
    _, trace = run
    lrs = [s.lr for _, _, s in trace]
    assert lrs[0] == pytest.approx(0.05)                      # η_0: the optimizer's lr
    assert len(set(lrs)) > 1                                   # changed after a round
    assert all(s.loss_clip >= 0.01 for _, _, s in trace)


def test_refuses_without_a_target_epsilon():
    model = nn.Linear(3, 2)
    ds = TensorDataset(torch.randn(40, 3), torch.randint(0, 2, (40,)))
    with pytest.raises(ValueError, match="target_epsilon"):
        dpfy.make_private(model, torch.optim.SGD(model.parameters(), lr=0.1),
                          DataLoader(ds, batch_size=8), noise_multiplier=1.0, epochs=1,
                          method="hyfree", loss_fn=_loss_fn)


def test_refuses_without_a_loss_fn():
    model = nn.Linear(3, 2)
    ds = TensorDataset(torch.randn(40, 3), torch.randint(0, 2, (40,)))
    with pytest.raises(ValueError, match="loss_fn"):
        dpfy.make_private(model, torch.optim.SGD(model.parameters(), lr=0.1),
                          DataLoader(ds, batch_size=8), target_epsilon=2.0, target_delta=1e-5,
                          epochs=1, method="hyfree", accountant="rdp")


@pytest.mark.parametrize("bad", [{"probe_every": 0}, {"max_change": 1.0}, {"gamma": 1.0},
                                 {"loss_clip_rule": "median"}])
def test_bad_options_are_one_line_errors(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        dpfy.adaptive.make("hyfree", **bad)
