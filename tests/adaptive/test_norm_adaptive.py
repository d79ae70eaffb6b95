"""Norm-based adaptive clipping (van der Veen et al. 2018; reviewed by Monir, Fauzan & Ghinita
2023, §3.2.1).

Expected values come from the review's update rule and from Eq. (1) of the noise split
(σ⁻² = Σ_r σ_r⁻²), derived in each test; ε from dp_accounting on events built here.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from ledger_events import dp_accounting_epsilon
from dpfy.types import StepOutcome
from dpfy.adaptive import make
from dpfy.types import Norms, RunFacts
from dpfy.adaptive.norm_adaptive import NormAdaptiveClipping
from dpfy.types.plan import StepPlan
from dpfy.privacy import Sampling


def _facts(groups=1, clip=1.0):
    return RunFacts(sampling=Sampling.POISSON, sample_rate=0.01, steps=10, dataset_size=10_000,
                    normalizer=100.0, max_grad_norm=clip, num_groups=groups)


def test_update_follows_the_papers_rule_on_known_norms():
    # Review §3.2.1: C_norm = β C_prev, s = Σ_i min(n_i, C_norm), C = α (s + noise)/|L|.
    # Norms (0.5, 1, 3, 10), C_t = 2, β = 2 (C_norm = 4), α = 1.5, b = 4, a released sum
    # (normalized by C_norm) taken as the noise-free one: s = 0.5 + 1 + 3 + 4 = 8.5.
    m = NormAdaptiveClipping(initial_clip=2.0, alpha=1.5, beta=2.0).calibrate(_facts())
    state = m.init()
    plan = m.plan(state, StepPlan(0, 0.01, 1.0, 1.0))
    assert plan.clip == 2.0
    norms = torch.tensor([0.5, 1.0, 3.0, 10.0], dtype=torch.float64)
    values = m.releases(state, plan)["clipped_norm_sum"].values(Norms(norms, {}, ()))
    assert values.tolist() == pytest.approx([0.5 / 4, 1 / 4, 3 / 4, 1.0])
    released = StepOutcome(plan, 4.0, {"clipped_norm_sum": float(values.sum())})
    assert m.update(state, released).clip == pytest.approx((1.5 * 8.5 / 4,))


def test_update_clamps_the_noisy_mean_so_the_threshold_stays_positive():
    m = NormAdaptiveClipping(initial_clip=1.0, alpha=1.0, beta=2.0,
                             min_fraction=0.1).calibrate(_facts())
    state = m.init()
    plan = m.plan(state, StepPlan(0, 0.01, 1.0, 1.0))
    low = m.update(state, StepOutcome(plan, 10.0, {"clipped_norm_sum": -7.0}))
    high = m.update(state, StepOutcome(plan, 10.0, {"clipped_norm_sum": 25.0}))
    assert low.clip == pytest.approx((1.0 * 2.0 * 0.1,))     # α β f_min C_t
    assert high.clip == pytest.approx((1.0 * 2.0 * 1.0,))    # α β C_t


@pytest.mark.parametrize("groups,r", [(1, 0.05), (3, 0.2)])
def test_noise_split_keeps_the_plain_gradient_budget(groups, r):
    # K norm sums at σ_n each with K σ_n⁻² = r σ⁻²; gradient σ_g = σ/√(1−r); together σ.
    sigma = 1.7
    m = NormAdaptiveClipping(budget_fraction=r, per_layer=groups > 1).calibrate(
        _facts(groups=groups))
    state = m.init()
    plan = m.plan(state, StepPlan(0, 0.01, sigma, 1.0))
    spec = m.releases(state, plan)["clipped_norm_sum"]
    sigma_n = sigma * math.sqrt(groups / r)
    assert plan.noise_multiplier == pytest.approx(sigma / math.sqrt(1 - r))
    assert spec.noise_std == pytest.approx(sigma_n)             # per threshold, normalized
    assert spec.sensitivity == pytest.approx(math.sqrt(groups))
    assert spec.noise_multiplier == pytest.approx(sigma_n / math.sqrt(groups))
    assert plan.noise_multiplier ** -2 + spec.noise_multiplier ** -2 == pytest.approx(
        sigma ** -2)


def test_per_layer_starts_at_c0_over_root_k_and_clips_each_group():
    m = NormAdaptiveClipping(initial_clip=0.6, per_layer=True).calibrate(_facts(groups=4))
    state = m.init()
    assert state.clip == pytest.approx((0.3,) * 4)               # 0.6/√4


@pytest.mark.parametrize("field,value", [("initial_clip", 0.0), ("alpha", 0.0), ("beta", -1.0),
                                         ("budget_fraction", 1.0), ("min_fraction", 0.0)])
def test_config_rejects_bad_values(field, value):
    with pytest.raises(ValueError, match=f"^{field} must be"):
        NormAdaptiveClipping(**{field: value})


def test_no_noise_is_refused():
    m = NormAdaptiveClipping().calibrate(_facts())
    with pytest.raises(ValueError, match="^noise_multiplier must be"):
        m.plan(m.init(), StepPlan(0, 0.01, 0.0, 1.0))


def _run(method, *, epochs=2, **kw):
    torch.manual_seed(0)
    ds = TensorDataset(torch.randn(300, 6), torch.randint(0, 2, (300,)))
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2))
    model, opt, loader = dpfy.make_private(
        model, torch.optim.SGD(model.parameters(), lr=0.1), DataLoader(ds, batch_size=30),
        method=method, target_delta=1e-5, epochs=epochs, max_grad_norm=1.0, seed=3, **kw)
    clips, sums = [], []
    original = type(opt.method).update

    def spy(self, state, released):
        sums.append(released.sums["clipped_norm_sum"])
        return original(self, state, released)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(type(opt.method), "update", spy)
        for _ in range(epochs):
            for x, y in loader:
                opt.zero_grad()
                F.cross_entropy(model(x), y).backward()
                opt.step()     # the step's sensitivity check raises if a bound is exceeded
                clips.append(opt.last_step_info["clip"])
    return opt, clips, sums


def test_epsilon_equals_dp_accounting_on_the_composed_events():
    opt, _, _ = _run("norm_adaptive", noise_multiplier=1.0, accountant="rdp")
    # Both releases of a step see the same Poisson sample (tests/ledger_events.py: σ_eff).
    for g in opt.ledger.step_groups:
        assert [r.mechanism for r in g.releases] == ["gradient", "clipped_norm_sum"]
    assert opt.step_count == 20
    assert opt.epsilon(1e-5) == pytest.approx(dp_accounting_epsilon(opt.ledger, 1e-5, "rdp"),
                                              rel=1e-6)


@pytest.mark.parametrize("per_layer", [False, True])
def test_end_to_end_thresholds_follow_the_released_norm_sums(per_layer):
    # Every step passes the step's sensitivity check (else opt.step raises); C_{t+1} is the
    # review's §3.2.1 rule applied to the released (noisy) sum, b = 300 · 30/300 = 30.
    alpha, beta, fmin, b = 1.0, 2.0, 0.1, 30.0
    opt, clips, sums = _run(make("norm_adaptive", per_layer=per_layer), epochs=1,
                            noise_multiplier=1.0)
    assert len(clips) == 10
    for t in range(9):
        c = torch.as_tensor(clips[t], dtype=torch.float64).reshape(-1)
        s = torch.as_tensor(sums[t], dtype=torch.float64).reshape(-1)
        expected = alpha * beta * c * torch.clamp(s / b, fmin, 1.0)
        assert torch.as_tensor(clips[t + 1], dtype=torch.float64).reshape(-1).tolist() == \
            pytest.approx(expected.tolist())
