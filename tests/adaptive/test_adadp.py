"""ADADP (Koskela & Honkela 2020; reviewed by Monir, Fauzan & Ghinita 2023, §3.3): every
iterate and every η checked against the algorithm written out in this test from the released
gradients; the ledger is plain DP-SGD's, by dp_accounting."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from dpfy.adaptive.adadp import ADADP
from ledger_events import dp_accounting_epsilon

N, B, STEPS = 200, 20, 10


def _run(tolerance, lr=0.5, sigma=0.8):
    torch.manual_seed(0)
    x = torch.randn(N, 5)
    y = (x[:, 0] + x[:, 1] > 0).long()
    model = nn.Sequential(nn.Linear(5, 6), nn.Tanh(), nn.Linear(6, 2))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    model, opt, loader = dpfy.make_private(
        model, opt, DataLoader(TensorDataset(x, y), batch_size=B), noise_multiplier=sigma,
        max_grad_norm=1.0, max_steps=STEPS, accountant="rdp",
        method=ADADP(tolerance=tolerance))
    releases, thetas = [], []
    original = ADADP.update

    def spy(self, state, released):
        releases.append({n: g.clone() for n, g in released.noisy_gradient.items()})
        return original(self, state, released)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ADADP, "update", spy)
        thetas.append({n: p.detach().clone() for n, p in model.named_parameters()})
        batches = iter(loader)
        for _ in range(STEPS):
            xb, yb = next(batches)
            opt.zero_grad()
            F.cross_entropy(model(xb), yb).backward()
            opt.step()
            thetas.append({n: p.detach().clone() for n, p in model.named_parameters()})
    return opt, releases, thetas


def _reference(theta0, releases, lr, tol, a_min=0.9, a_max=1.1):
    """The algorithm of the review's §3.3 (Koskela & Honkela 2020) in float64, driven by the
    same released gradients."""
    theta = {n: t.double() for n, t in theta0.items()}
    out, eta = [], lr
    for k in range(0, len(releases) - 1, 2):
        g1 = {n: g.double() for n, g in releases[k].items()}
        g2 = {n: g.double() for n, g in releases[k + 1].items()}
        full = {n: theta[n] - eta * g1[n] for n in theta}
        half = {n: theta[n] - eta / 2 * g1[n] for n in theta}
        hat = {n: half[n] - eta / 2 * g2[n] for n in theta}
        err = math.sqrt(sum(float(((full[n] - hat[n]) / full[n].abs().clamp(min=1)).square()
                                  .sum()) for n in theta))
        out.append((half, hat if err <= tol else theta, eta))
        theta = hat if err <= tol else theta
        eta = min(max(tol / err, a_min), a_max) * eta
    return out, eta


@pytest.mark.parametrize("tolerance", [1e-3, 10.0])    # mostly rejected / always accepted
def test_iterates_and_learning_rate_follow_the_algorithm(tolerance):
    opt, releases, thetas = _run(tolerance)
    ref, eta = _reference(thetas[0], releases, 0.5, tolerance)
    for k, (half, after, _) in enumerate(ref):
        for n in half:
            torch.testing.assert_close(thetas[2 * k + 1][n].double(), half[n], atol=1e-6,
                                       rtol=1e-5)
            torch.testing.assert_close(thetas[2 * k + 2][n].double(), after[n], atol=1e-6,
                                       rtol=1e-5)
    assert opt.method_state.lr == pytest.approx(eta, rel=1e-6)
    s = opt.method_state
    assert s.accepted + s.rejected == STEPS // 2
    assert (s.rejected == STEPS // 2) if tolerance < 0.01 else (s.accepted == STEPS // 2)


def test_ledger_is_two_plain_dp_sgd_steps_per_iteration():
    opt, _, _ = _run(1.0)
    assert opt.ledger.num_steps == STEPS
    assert all([r.mechanism for r in g.releases] == ["gradient"] for g in opt.ledger.step_groups)
    import dp_accounting
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
        B / N, dp_accounting.GaussianDpEvent(0.8)), STEPS))
    assert opt.epsilon(1e-5) == pytest.approx(acc.get_epsilon(1e-5), rel=1e-6)
    assert dp_accounting_epsilon(opt.ledger, 1e-5, "rdp") == pytest.approx(
        acc.get_epsilon(1e-5), rel=1e-6)


@pytest.mark.parametrize("opt_kwargs", [dict(momentum=0.9), dict(weight_decay=0.01)])
def test_refuses_anything_but_plain_sgd(opt_kwargs):
    model = nn.Linear(3, 2)
    ds = TensorDataset(torch.randn(40, 3), torch.randint(0, 2, (40,)))
    with pytest.raises(ValueError, match="optimizer must be torch.optim.SGD without"):
        dpfy.make_private(model, torch.optim.SGD(model.parameters(), lr=0.1, **opt_kwargs),
                          DataLoader(ds, batch_size=8), noise_multiplier=1.0, max_steps=4,
                          method="adadp")


def test_refuses_adam():
    model = nn.Linear(3, 2)
    ds = TensorDataset(torch.randn(40, 3), torch.randint(0, 2, (40,)))
    with pytest.raises(ValueError, match="method 'adadp'"):
        dpfy.make_private(model, torch.optim.Adam(model.parameters(), lr=0.1),
                          DataLoader(ds, batch_size=8), noise_multiplier=1.0, max_steps=4,
                          method="adadp")


@pytest.mark.parametrize("bad", [{"tolerance": 0}, {"min_factor": 1.0}, {"max_factor": 1.0}])
def test_bad_options_are_one_line_errors(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        dpfy.adaptive.make("adadp", **bad)
