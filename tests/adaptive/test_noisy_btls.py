"""NoisyBTLS: a backtracking (Armijo) line search on released candidate losses
(``adaptive/noisy_btls.py``).

Numbers come from derivations written here: on least squares f(w) = (1/2N) Σ_i (w·x_i − y_i)²
with Hessian A = XᵀX/N, f(w) − f(w − ηg) = η‖g‖² − ½η² gᵀAg, so the Armijo test with c = ½ passes
exactly for η ≤ η* = ‖g‖²/gᵀAg; and from dp_accounting (ε of the composed events).
"""

from __future__ import annotations

import math

import dp_accounting
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from dpfy.adaptive import make

N, D = 40, 3


def squared_error(model, batch):
    x, y = batch
    return 0.5 * (model(x).reshape(-1) - y) ** 2          # (B,)


def _data():
    torch.manual_seed(1)
    x = torch.randn(N, D)
    return x, x @ torch.tensor([0.5, 1.5, -1.0]) + 0.1 * torch.randn(N)


def _private(method, lr, *, batch=N, poisson=False, **kw):
    x, y = _data()
    model = nn.Linear(D, 1, bias=False)
    model.weight.data.zero_()
    model, opt, dl = dpfy.make_private(
        model, torch.optim.SGD(model.parameters(), lr=lr),
        DataLoader(TensorDataset(x, y), batch_size=batch), poisson_sampling=poisson,
        method=method, seed=0, loss_fn=squared_error, **kw)
    return model, opt, dl, x, y


def _step(model, opt, dl):
    for bx, by in dl:
        opt.zero_grad()
        squared_error(model, (bx, by)).mean().backward()
        opt.step()
        return


def test_the_chosen_step_satisfies_armijo_and_is_the_first_candidate_that_does():
    x, y = _data()
    g = -(x.T @ y) / N                                      # ∇f(0)
    eta_star = float(g @ g / (g @ (x.T @ x / N) @ g))
    lr = 0.3 * eta_star                                     # candidates 1.2, 0.6, 0.3, 0.15 η*
    model, opt, dl, _, _ = _private(make("noisy_btls", armijo=0.5, loss_clip=1e3,
                                         probe_noise_ratio=1.0), lr, noise_multiplier=1e-9,
                                    max_grad_norm=1e4)
    _step(model, opt, dl)
    etas = [lr * 4.0 * 0.5 ** j for j in range(4)]

    def f(w):
        return float(0.5 * ((x @ w - y) ** 2).mean())

    passes = [f(torch.zeros(D)) - f(-eta * g) >= 0.5 * eta * float(g @ g) for eta in etas]
    assert passes == [False, True, True, True]             # η ≤ η* exactly
    assert opt.method_state.chosen == 2.0                  # m = 4·0.5: the first that passes
    assert torch.allclose(model.weight.reshape(-1), -etas[1] * g, atol=1e-5)


def test_no_candidate_passing_means_no_step_and_less_noise_next():
    model, opt, dl, _, _ = _private(make("noisy_btls", armijo=1e6, probe_noise_ratio=1.0),
                                    0.1, noise_multiplier=1.0, max_grad_norm=1.0)
    before = model.weight.detach().clone()
    _step(model, opt, dl)
    assert opt.method_state.chosen == 0.0 and opt.method_state.reductions == 1
    assert torch.equal(model.weight, before)
    assert opt.private_step.plan().noise_multiplier == pytest.approx(1.1 ** -0.5)


def test_every_release_is_in_the_ledger_and_epsilon_matches_dp_accounting():
    """m = 4 comparisons: the gradient and 5 losses (θ and 4 candidates) every step."""
    steps, target = 3, 1.5
    model, opt, dl, _, _ = _private(make("noisy_btls"), 0.05, poisson=True, target_epsilon=target,
                                    target_delta=1e-5, max_steps=steps, accountant="rdp",
                                    max_grad_norm=1.0)
    for _ in range(steps):
        _step(model, opt, dl)
    sigma0 = opt.method.base_noise
    acc = dp_accounting.rdp.RdpAccountant()
    for group in opt.ledger.step_groups:          # q = 1: the batch is the whole data set
        names = [rel.mechanism for rel in group.releases]
        assert names == ["gradient"] + [f"noisy_btls_loss_{j}" for j in range(5)]
        assert [rel.noise_multiplier for rel in group.releases[1:]] == pytest.approx(
            [4.0 * sigma0] * 5, rel=1e-12)
        r = 2 * math.log(sigma0 / group.releases[0].noise_multiplier) / math.log(1.1)
        assert r == pytest.approx(round(r), abs=1e-9) and 0 <= round(r) <= 10
        sigma_t = sigma0 * 1.1 ** (-round(r) / 2)          # σ_0 (1 + γ)^(−r/2), r reductions
        acc.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(
            (sigma_t ** -2 + 5 * (4.0 * sigma0) ** -2) ** -0.5), group.count))
    eps = acc.get_epsilon(1e-5)
    assert opt.epsilon(1e-5, "rdp") == pytest.approx(eps, rel=1e-6)
    assert eps <= target * (1 + 1e-9)


def test_a_split_logical_batch_is_refused_naming_the_method():
    # refused by make_private, before any step (under Poisson sampling the first logical batch
    # above the physical size would otherwise stop the run mid-way)
    with pytest.raises(ValueError, match="one physical batch for method 'noisy_btls'.*"
                                         "max_physical_batch_size"):
        _private(make("noisy_btls"), 0.1, batch=20, noise_multiplier=1.0, max_grad_norm=1.0,
                 max_physical_batch_size=8)
