"""DP-AdamWOSM (Mohapatra et al. 2022; the AdamWOSM baseline of Galli, Palamidessi & Cucinotta
2024).

The reference trajectory is Mohapatra et al.'s update rule (``DPAdamWOSM`` in their public
code: Adam's first moment only, the second moment replaced by νC/|B|), written in the test on
the released gradients g̃_t (what the step put in p.grad); ε from dp_accounting on events built here.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from ledger_events import dp_accounting_epsilon
from dpfy.adaptive import make
from dpfy.adaptive.adamwosm import AdamWOSM
from dpfy.types import RunFacts
from dpfy.types.plan import StepPlan
from dpfy.privacy import Sampling

# ρ₀ (Galli et al. 2024's AdamWOSM setting), β₁ and ε (Mohapatra et al.'s code)
ALPHA, BETA1, EPS = 1e-3, 0.9, 1e-8


def _run(steps_epochs=2, **kw):
    torch.manual_seed(0)
    ds = TensorDataset(torch.randn(300, 6), torch.randint(0, 2, (300,)))
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2))
    inner = torch.optim.SGD(model.parameters(), lr=ALPHA, momentum=BETA1)
    model, opt, loader = dpfy.make_private(
        model, inner, DataLoader(ds, batch_size=30), method=make("adamwosm"),
        target_delta=1e-5, epochs=steps_epochs, max_grad_norm=0.5, seed=5, **kw)
    return model, opt, loader


def test_steps_equal_the_digests_adam_without_second_moment():
    # θ_{t+1} = θ_t − α/(νC/|B| + 1e-8) · m̂_t, m_t = β₁ m_{t−1} + (1−β₁) g̃_t (Mohapatra
    # et al. 2022), with g̃_t the released gradient; every step also passes the sensitivity check.
    sigma, clip, b = 1.3, 0.5, 30.0           # b = q·N = (30/300)·300
    model, opt, loader = _run(noise_multiplier=sigma)
    theta = {n: p.detach().double().clone() for n, p in model.named_parameters()}
    m = {n: torch.zeros_like(t) for n, t in theta.items()}
    t = 0
    for _ in range(2):
        for x, y in loader:
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            t += 1
            for n, p in model.named_parameters():
                g = p.grad.double()                                       # released g̃_t
                m[n] = BETA1 * m[n] + (1 - BETA1) * g
                m_hat = m[n] / (1 - BETA1 ** t)
                theta[n] = theta[n] - ALPHA / (sigma * clip / b + EPS) * m_hat
                assert p.detach().double() == pytest.approx(theta[n], abs=1e-6, rel=1e-5)
    assert t == 20


def test_lr_scale_is_the_bias_corrected_step_over_the_inner_lr():
    m = AdamWOSM().calibrate(RunFacts(sampling=Sampling.POISSON, sample_rate=0.01, steps=5,
                                      normalizer=512.0))
    for step in (0, 1, 9):
        plan = m.plan(None, StepPlan(step, 0.01, 2.0, 0.1))
        t = step + 1
        # SGD's buffer is m_t/(1−β₁); α·s_t·buffer must equal α/(σC/b + ε)·m_t/(1−β₁ᵗ).
        expected = (1 - BETA1) / ((1 - BETA1 ** t) * (2.0 * 0.1 / 512 + EPS))
        assert plan.lr_scale == pytest.approx(expected, rel=1e-12)
        assert plan.noise_multiplier == 2.0 and plan.clip == 0.1   # the gradient is DP-SGD's


def test_epsilon_is_plain_dp_sgd_by_dp_accounting():
    # The update is post-processing: each step releases only the gradient, at σ unchanged.
    model, opt, loader = _run(steps_epochs=1, noise_multiplier=1.1, accountant="rdp")
    for x, y in loader:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    for g in opt.ledger.step_groups:
        assert [(r.mechanism, r.noise_multiplier) for r in g.releases] == [("gradient", 1.1)]
    assert opt.step_count == 10
    assert opt.epsilon(1e-5) == pytest.approx(dp_accounting_epsilon(opt.ledger, 1e-5, "rdp"),
                                              rel=1e-6)


@pytest.mark.parametrize("field,value", [("beta1", 1.0), ("eps", -1.0), ("normalizer", 0.0)])
def test_config_rejects_bad_values(field, value):
    with pytest.raises(ValueError, match=f"^{field} must be"):
        AdamWOSM(**{field: value})


def test_no_noise_is_refused():
    m = AdamWOSM(normalizer=10.0)
    with pytest.raises(ValueError, match="^noise_multiplier must be"):
        m.plan(None, StepPlan(0, 0.01, 0.0, 1.0))


@pytest.mark.parametrize("opt", [lambda p: torch.optim.Adam(p, lr=1e-3),
                                 lambda p: torch.optim.SGD(p, lr=1e-3, momentum=0.5),
                                 lambda p: torch.optim.SGD(p, lr=1e-3, momentum=0.9,
                                                           dampening=0.1)])
def test_another_inner_optimizer_is_refused(opt):
    # The method is exact only on SGD(momentum=β₁, no dampening): anything else would silently
    # run another algorithm.
    import dpfy
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    ds = TensorDataset(torch.randn(40, 4), torch.randint(0, 2, (40,)))
    model = nn.Linear(4, 2)
    with pytest.raises(ValueError, match="inner optimizer must be SGD"):
        dpfy.make_private(model, opt(model.parameters()), DataLoader(ds, batch_size=10),
                          noise_multiplier=1.0, method="adamwosm", seed=0)
