"""Quantile adaptive clipping (Andrew et al. 2021) and He et al.'s per-layer form (both reviewed
by Monir, Fauzan & Ghinita 2023, §3.2.2).

Expected values come from the papers' formulas, derived in each test.
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
from dpfy.adaptive import LayerQuantileClipping, QuantileClipping, make
from dpfy.types import Norms, RunFacts, StepOutcome, StepPlan
from dpfy.privacy import Sampling


def _facts(b=100.0, groups=1):
    return RunFacts(sampling=Sampling.POISSON, sample_rate=0.01, steps=10, dataset_size=10_000,
                    normalizer=b, num_groups=groups)


def test_geometric_update_converges_to_the_target_quantile():
    # Norms ~ Exp(1): the γ-quantile is −ln(1 − γ) (Andrew et al. 2021: the geometric update
    # converges to the γ-quantile of a fixed distribution). Noise-free counts, b = 1000.
    gen = torch.Generator().manual_seed(0)
    for gamma in (0.3, 0.5, 0.8):
        m = QuantileClipping(initial_clip=5.0, target_quantile=gamma, step_size=0.2,
                             count_noise_std=1.0)
        state = m.init()
        for t in range(600):
            norms = torch.empty(1000, dtype=torch.float64).exponential_(generator=gen)
            plan = m.plan(state, StepPlan(t, 0.01, 1.0, 1.0))
            spec = m.releases(state, plan)["unclipped_count"]
            count = float(spec.values(Norms(norms, {}, ())).sum())
            state = m.update(state, StepOutcome(plan, 1000.0, {"unclipped_count": count}))
        assert state.clip[0] == pytest.approx(-math.log(1 - gamma), rel=0.05)


def test_noise_split_keeps_the_plain_gradient_budget():
    # σ = 1, σ_b = b/20 = 5: the gradient gets (1 − (2·5)⁻²)^(−1/2) (Andrew et al. 2021, Thm. 1).
    m = QuantileClipping().calibrate(_facts(b=100.0))
    plan = m.plan(m.init(), StepPlan(0, 0.01, 1.0, 1.0))
    assert m.count_noise_std == 5.0
    assert plan.noise_multiplier == pytest.approx((1 - 10.0 ** -2) ** -0.5)
    spec = m.releases(m.init(), plan)["unclipped_count"]
    assert spec.noise_multiplier == 10.0    # std 5 / sensitivity ½
    # 1/σ_Δ² + 1/(2σ_b)² = 1/σ²: the step costs what the plain gradient at σ = 1 costs.
    assert plan.noise_multiplier ** -2 + spec.noise_multiplier ** -2 == pytest.approx(1.0)


def test_split_needs_count_noise_large_enough():
    m = QuantileClipping(count_noise_std=0.4)    # 2σ_b = 0.8 < σ = 1: impossible split
    with pytest.raises(ValueError):
        m.plan(m.init(), StepPlan(0, 0.01, 1.0, 1.0))


@pytest.mark.parametrize("field,value", [("initial_clip", 0.0), ("target_quantile", 1.0),
                                         ("step_size", -1.0), ("count_noise_std", 0.0)])
def test_config_rejects_bad_values(field, value):
    with pytest.raises(ValueError, match=f"^{field} must be"):
        QuantileClipping(**{field: value})


def test_per_layer_split_gives_the_counts_fraction_r_of_the_budget():
    # K = 3 groups, r = 0.1: K(2σ_b)⁻² = r σ⁻² and σ_Δ = σ/√(1−r) (He et al. 2023; review §3.2.2).
    m = LayerQuantileClipping(initial_clip=0.3, budget_fraction=0.1).calibrate(_facts(groups=3))
    state = m.init()
    assert state.clip == pytest.approx((0.3 / math.sqrt(3),) * 3)
    plan = m.plan(state, StepPlan(0, 0.01, 2.0, 1.0))
    spec = m.releases(state, plan)["unclipped_counts"]
    assert plan.noise_multiplier == pytest.approx(2.0 / math.sqrt(0.9))
    assert spec.noise_multiplier ** -2 == pytest.approx(0.1 * 2.0 ** -2)
    assert plan.noise_multiplier ** -2 + spec.noise_multiplier ** -2 == pytest.approx(0.25)


def _data():
    torch.manual_seed(0)
    return TensorDataset(torch.randn(300, 6), torch.randint(0, 2, (300,)))


def test_chained_decay_and_quantile_epsilon_equals_dp_accounting_on_the_composed_events():
    ds = _data()
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2))
    model, opt, loader = dpfy.make_private(
        model, torch.optim.SGD(model.parameters(), lr=0.1), DataLoader(ds, batch_size=30),
        method=[make("noise_decay", kind="exponential", rate=0.5, per="epoch"), "quantile"],
        target_epsilon=2.0, target_delta=1e-5, epochs=2, max_grad_norm=1.0, seed=3,
        accountant="pld")
    for _ in range(2):
        for x, y in loader:
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
    # The composed per-step events, built from the ledger's raw numbers (tests/ledger_events.py).
    for g in opt.ledger.step_groups:
        assert [r.mechanism for r in g.releases] == ["gradient", "unclipped_count"]
    expected = dp_accounting_epsilon(opt.ledger, 1e-5, "pld")
    assert opt.step_count == 20
    assert opt.epsilon(1e-5) == pytest.approx(expected, rel=1e-6)
    assert opt.epsilon(1e-5) <= 2.0 + 1e-9


def test_per_layer_quantile_clips_each_layer_to_its_threshold():
    ds = _data()
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2))
    model, opt, loader = dpfy.make_private(
        model, torch.optim.SGD(model.parameters(), lr=0.1), DataLoader(ds, batch_size=30),
        method="per_layer_quantile", noise_multiplier=1.0, max_grad_norm=1.0, seed=0)
    for x, y in loader:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    clips = opt.last_step_info["clip"]
    assert len(clips) == 2 and all(c > 0 for c in clips)
    (mech,) = {tuple(r.mechanism for r in g.releases) for g in opt.ledger.step_groups}
    assert mech == ("gradient", "unclipped_counts")
