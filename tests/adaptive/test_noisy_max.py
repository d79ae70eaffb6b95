"""NoisyMax step-size selection with adaptive noise reduction (``adaptive/noisy_max.py``).

Numbers come from derivations written here — least squares f(w) = (1/2N) Σ_i (w·x_i − y_i)²,
whose loss at each candidate w − η g is computed here from the data — and from dp_accounting
(ε of the composed events, with each step's releases stacked into one Gaussian at
σ_eff = (Σ_r σ_r⁻²)^(−1/2), see tests/ledger_events.py).
"""

from __future__ import annotations

import dp_accounting
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from dpfy.adaptive import make

N, D = 40, 3
MULTIPLIERS = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0)   # the defaults, 0 first


def squared_error(model, batch):
    x, y = batch
    return 0.5 * (model(x).reshape(-1) - y) ** 2          # (B,)


def _data():
    torch.manual_seed(0)
    x = torch.randn(N, D)
    y = x @ torch.tensor([1.0, -2.0, 0.5]) + 0.1 * torch.randn(N)
    return x, y


def _loss(w, x, y):
    return float(0.5 * ((x @ w - y) ** 2).mean())


def _private(method, lr, *, weight=None, batch=N, poisson=False, optimizer=None, **kw):
    x, y = _data()
    model = nn.Linear(D, 1, bias=False)
    if weight is not None:
        model.weight.data.copy_(weight.reshape(1, D))
    opt = optimizer(model) if optimizer else torch.optim.SGD(model.parameters(), lr=lr)
    model, dp_opt, dl = dpfy.make_private(
        model, opt, DataLoader(TensorDataset(x, y), batch_size=batch),
        poisson_sampling=poisson, method=method, seed=0, loss_fn=squared_error, **kw)
    return model, dp_opt, dl, x, y


def _steps(model, opt, dl, steps):
    """Train ``steps`` logical steps; the weights before each step and the state after it."""
    weights, states = [], []
    while opt.step_count < steps:
        for bx, by in dl:
            weights.append(model.weight.detach().reshape(-1).clone())
            opt.zero_grad()
            squared_error(model, (bx, by)).mean().backward()
            opt.step()
            states.append(opt.method_state)
    return weights, states


def test_with_noise_near_zero_the_step_taken_is_the_true_argmin_candidate():
    x, y = _data()
    w0 = torch.zeros(D)
    g0 = -(x.T @ y) / N                                     # ∇f(0) = Xᵀ(X·0 − y)/N
    eta_star = float(g0 @ g0 / (g0 @ (x.T @ x / N) @ g0))   # exact line minimizer along −g
    lr = 0.7 * eta_star                                     # so the best m is interior
    method = make("noisy_max", loss_clip=1e3, probe_noise_ratio=1.0)
    model, opt, dl, _, _ = _private(method, lr, weight=w0, noise_multiplier=1e-9,
                                    max_grad_norm=1e4)
    weights, states = _steps(model, opt, dl, 3)
    weights.append(model.weight.detach().reshape(-1).clone())
    for w, w_next, state in zip(weights, weights[1:], states):
        g = x.T @ (x @ w - y) / N                           # the exact batch gradient
        losses = [_loss(w - lr * m * g, x, y) for m in MULTIPLIERS]
        best = min(range(len(losses)), key=losses.__getitem__)
        assert state.chosen == MULTIPLIERS[best]
        assert torch.allclose(w_next, w - lr * MULTIPLIERS[best] * g, atol=1e-5)
    assert states[0].chosen == 1.0          # 0.7 η*: the candidate closest to η*


def test_no_progress_lowers_the_noise_and_the_ledger_matches_dp_accounting():
    """At the least-squares minimizer g̃ is pure noise, so every step along it raises f by
    ½η² g̃ᵀAg̃ > 0: η = 0 wins, no step is taken and σ_t = σ_0 (1.1)^(−t/2) (up to L = 3)."""
    x, y = _data()
    w_star = torch.linalg.lstsq(x, y.unsqueeze(1)).solution.reshape(-1)
    sigma0, ratio, steps, max_red = 0.5, 1e-3, 5, 3
    method = make("noisy_max", loss_clip=1.0, probe_noise_ratio=ratio, max_reductions=max_red)
    model, opt, dl, _, _ = _private(method, 10.0, weight=w_star, poisson=True,
                                    noise_multiplier=sigma0, max_grad_norm=1.0)
    _, states = _steps(model, opt, dl, steps)
    assert [s.chosen for s in states] == [0.0] * steps
    assert [s.reductions for s in states] == [1, 2, 3, 3, 3]
    assert torch.allclose(model.weight.reshape(-1), w_star)     # never moved
    sigmas = [sigma0 * 1.1 ** (-min(t, max_red) / 2) for t in range(steps)]
    recorded = [g for g in opt.ledger.step_groups for _ in range(g.count)]
    for group, sigma in zip(recorded, sigmas):
        assert group.sample_rate == 1.0
        assert [r.noise_multiplier for r in group.releases] == pytest.approx(
            [sigma] + [ratio * sigma0] * len(MULTIPLIERS), rel=1e-12)
    events = [dp_accounting.GaussianDpEvent(
        (s ** -2 + len(MULTIPLIERS) * (ratio * sigma0) ** -2) ** -0.5) for s in sigmas]
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.ComposedDpEvent(events))
    assert opt.epsilon(1e-5, "rdp") == pytest.approx(acc.get_epsilon(1e-5), rel=1e-6)


def test_calibrated_worst_case_ledger_spends_the_target_by_dp_accounting():
    """Worst case: every step at σ_min = σ_0·1.1^(−L/2) with the 6 probes at 4σ_0; every run's
    σ_t ≥ σ_min, so this ledger bounds its ε."""
    steps, q, target, max_red = 8, 0.25, 2.0, 3
    model, opt, _, _, _ = _private(make("noisy_max", max_reductions=max_red), 0.1, batch=10,
                                   poisson=True, target_epsilon=target, target_delta=1e-5,
                                   max_steps=steps, accountant="rdp", max_grad_norm=1.0)
    sigma0 = opt.method.base_noise
    sigma_min = sigma0 * 1.1 ** (-max_red / 2)
    sigma_eff = (sigma_min ** -2 + len(MULTIPLIERS) * (4.0 * sigma0) ** -2) ** -0.5
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
        q, dp_accounting.GaussianDpEvent(sigma_eff)), steps))
    assert target * 0.995 <= acc.get_epsilon(1e-5) <= target * (1 + 1e-9)
    assert opt.method.min_noise_multiplier() == pytest.approx(sigma_min, rel=1e-12)
    assert opt.epsilon_cap == target


def test_a_split_logical_batch_is_refused_naming_the_method():
    # refused by make_private, before any step (under Poisson sampling the first logical batch
    # above the physical size would otherwise stop the run mid-way)
    with pytest.raises(ValueError, match="one physical batch for method 'noisy_max'.*"
                                         "max_physical_batch_size"):
        _private(make("noisy_max"), 0.1, batch=20, noise_multiplier=1.0, max_grad_norm=1.0,
                 max_physical_batch_size=8)


def test_an_optimizer_that_would_not_take_the_chosen_step_is_refused():
    with pytest.raises(ValueError, match="SGD without momentum or weight decay"):
        _private(make("noisy_max"), 0.1, noise_multiplier=1.0, max_grad_norm=1.0,
                 optimizer=lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9))
