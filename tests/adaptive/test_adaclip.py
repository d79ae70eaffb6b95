"""AdaClip, coordinate-wise adaptive clipping (Pichapati et al.; digest 000 §2.6).

Expected values come from the float64 per-example loop (tests/oracles.py), from dp_accounting,
or from the estimator rule written out by hand in each test (module docstring of
``dpfy.adaptive.adaclip``).
"""

from __future__ import annotations

import math
import sys
import warnings
from pathlib import Path

import dp_accounting
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
import dpfy.step
from dpfy.adaptive import Released, make
from dpfy.adaptive.adaclip import AdaClip, AdaClipState, scale_from_variance
from dpfy.adaptive.base import Clip
from dpfy.errors import PrivacyRefusal
from dpfy.plan import StepPlan

sys.path.insert(0, str(Path(__file__).parents[1]))   # tests/oracles.py (no conftest here)
import oracles  # noqa: E402

SUM = lambda o, t: F.cross_entropy(o, t, reduction="sum")  # noqa: E731


def _toy(n=40):
    torch.manual_seed(0)
    ds = TensorDataset(torch.randn(n, 5), torch.randint(0, 3, (n,)))
    model = nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3))
    ref = nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3))
    ref.load_state_dict(model.state_dict())
    return ds, model, ref


def _private(model, ds, method, *, lr=0.0, batch=10, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")        # σ = 0 warns: some tests want exact sums
        return dpfy.make_private(model, torch.optim.SGD(model.parameters(), lr=lr),
                                 DataLoader(ds, batch_size=batch), method=method, **kw)


def test_the_papers_update_is_refused_until_the_step_can_map_the_release_back():
    with pytest.raises(ValueError, match="^step_on must be 'standardized' .*no hook to map"):
        make("adaclip")
    with pytest.raises(ValueError, match="^step_on must be one of"):
        AdaClip(step_on="nonsense")


@pytest.mark.parametrize("field,value", [("initial_clip", 0.0), ("mean_decay", 1.0),
                                         ("var_decay", -0.1), ("min_var", 0.0)])
def test_config_rejects_bad_values(field, value):
    with pytest.raises(ValueError, match=f"^{field} must be"):
        AdaClip(step_on="standardized", **{field: value})


def test_the_ghost_route_is_refused():
    ds, model, _ = _toy()
    with pytest.raises(ValueError, match="engine must be 'auto' or 'vmap'.*adaclip"):
        _private(model, ds, make("adaclip", step_on="standardized"), noise_multiplier=1.0,
                 max_grad_norm=1.0, engine="ghost", seed=0)


def test_the_start_is_flat_clipping_at_c0():
    # s_0 = C_0²/d: b_0 = (C_0²/d)^{1/4} · (d · C_0/√d)^{1/2} = C_0 in every coordinate.
    m = AdaClip(step_on="standardized", initial_clip=0.7)
    a, b = m.shift_scale(m.init(), {"w": torch.Size([3, 4]), "b": torch.Size([3])})
    assert all(torch.equal(t, torch.zeros_like(t)) for t in a.values())
    assert all(torch.allclose(t, torch.full_like(t, 0.7)) for t in b.values())


def test_scale_minimises_the_noise_under_unit_expected_norm():
    # Minimise Σ b_j² subject to Σ s_j/b_j² = 1 (Lagrange: b_j² ∝ √s_j). Check the constraint
    # and that random feasible scales never add less noise.
    gen = torch.Generator().manual_seed(0)
    s = {"x": torch.rand(7, generator=gen, dtype=torch.float64) + 0.01}
    b = scale_from_variance(s)["x"]
    assert float((s["x"] / b.square()).sum()) == pytest.approx(1.0)
    for _ in range(50):
        other = torch.rand(7, generator=gen, dtype=torch.float64) + 0.1
        other = other * float((s["x"] / other.square()).sum().sqrt())   # feasible
        assert float(other.square().sum()) >= float(b.square().sum()) - 1e-12


def test_estimates_update_rule_on_hand_derived_numbers():
    # a = (0, 1), s = (1, 4): √s = (1, 2), Σ√s = 3, b = s^{1/4}·√3 = (√3, √6).
    # Released w̃ = (1, −0.75), B = 4, σ = 2, β₁ = β₂ = ½:
    #   ĝ = b w̃ + a = (√3, 1 − 0.75√6)
    #   v = B (ĝ − a)² − b² σ²/B = b² (4 w̃² − 1) = (3·3, 6·1.25) = (9, 7.5)
    #   a' = ½ a + ½ ĝ = (√3/2, 1 − 0.375√6),   s' = ½ s + ½ v = (5, 5.75)
    m = AdaClip(step_on="standardized", initial_clip=1.0, mean_decay=0.5, var_decay=0.5,
                min_var=1e-3)
    state = AdaClipState(mean={"w": torch.tensor([0.0, 1.0], dtype=torch.float64)},
                         var={"w": torch.tensor([1.0, 4.0], dtype=torch.float64)})
    _, b = m.shift_scale(state, {"w": torch.Size([2])})
    assert b["w"].tolist() == pytest.approx([math.sqrt(3), math.sqrt(6)])
    plan = StepPlan(0, 0.1, 2.0, 1.0)
    w = {"w": torch.tensor([1.0, -0.75])}
    assert m.released_gradient(state, w)["w"].tolist() == pytest.approx(
        [math.sqrt(3), 1 - 0.75 * math.sqrt(6)])
    new = m.update(state, Released(plan, 4.0, gradient=w))
    assert new.mean["w"].tolist() == pytest.approx([math.sqrt(3) / 2, 1 - 0.375 * math.sqrt(6)])
    assert new.var["w"].tolist() == pytest.approx([5.0, 5.75])
    # w̃ = 0: v = −b² < h₁ is clamped to h₁ = 1e-3: s' = ½ s + ½·1e-3; a' = a.
    zero = m.update(state, Released(plan, 4.0, gradient={"w": torch.zeros(2)}))
    assert zero.var["w"].tolist() == pytest.approx([0.5005, 2.0005])
    assert zero.mean["w"].tolist() == pytest.approx([0.0, 1.0])


def test_transform_and_estimates_against_the_per_example_loop():
    # σ = 0 and lr = 0 (the model stays put): step 0 is flat clipping at C_0 in w = g/C_0;
    # step 1 standardizes with (a_1, b_1) derived here from step 0's release by the rule.
    c0, beta1, beta2, h1, h2 = 0.5, 0.9, 0.99, 1e-8, 1e2
    ds, model, ref = _toy()
    releases = []
    original = AdaClip.update

    def spy(self, state, released):
        releases.append({n: t.detach().double().clone() for n, t in released.gradient.items()})
        return original(self, state, released)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(AdaClip, "update", spy)
        model, opt, dl = _private(model, ds, make("adaclip", step_on="standardized"),
                                  noise_multiplier=0.0, max_grad_norm=c0, seed=0)
        big_b = opt.sampler.normalizer
        names = [n for n, _ in model.named_parameters()]
        d = sum(p.numel() for p in model.parameters())
        grads = []
        for step, (x, y) in enumerate(dl):
            grads.append(oracles.per_example_grads(ref, x, y, SUM))
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            if step == 1:
                break
    w0 = oracles.clipped_sum({n: g / c0 for n, g in grads[0].items()}, 1.0)
    for n in names:
        assert torch.allclose(releases[0][n], w0[n] / big_b, atol=1e-6)
    g0 = {n: c0 * releases[0][n] for n in names}                       # ĝ_0 = b_0 w̃ + 0
    a1 = {n: (1 - beta1) * g0[n] for n in names}
    s1 = {n: beta2 * c0 ** 2 / d + (1 - beta2) * (big_b * g0[n] ** 2).clamp(h1, h2)
          for n in names}
    total = sum(float(s.sqrt().sum()) for s in s1.values())
    b1 = {n: s1[n] ** 0.25 * math.sqrt(total) for n in names}
    w1 = {n: (grads[1][n] - a1[n]) / b1[n] for n in names}               # (B, *θ) float64
    expected = oracles.clipped_sum(w1, 1.0)
    for n in names:
        assert torch.allclose(releases[1][n], expected[n] / big_b, atol=1e-5)


def test_end_to_end_the_sensitivity_check_passes_every_step_and_bites():
    ds, model, _ = _toy(n=60)
    seen = []
    original = dpfy.step.check_bound

    def spy(sq, bound, *, what, owner):
        if what == "the clipped gradient sum":
            seen.append((float(sq.max().sqrt()) if sq.numel() else 0.0, bound))
        return original(sq, bound, what=what, owner=owner)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dpfy.step, "check_bound", spy)
        model, opt, dl = _private(model, ds, make("adaclip", step_on="standardized"), lr=0.1,
                                  noise_multiplier=1.0, max_grad_norm=1.0, seed=2)
        for _ in range(2):
            for x, y in dl:
                opt.zero_grad()
                F.cross_entropy(model(x), y).backward()
                opt.step()
    assert opt.step_count == 12 and len(seen) == 12
    assert all(bound == 1.0 and worst <= 1.0 + 1e-5 for worst, bound in seen)
    assert len(opt.method_state.var) == 4                     # estimates built from releases
    assert all(torch.isfinite(p).all() for p in model.parameters())

    class Loose(AdaClip):               # weights that let ‖w_i ŵ_i‖ reach 2 > Δ = 1
        def clipping(self, state, norms, plan):
            return Clip(2 * torch.clamp(1.0 / norms.total, max=1.0), sensitivity=1.0)

    ds, model, _ = _toy()
    model, opt, dl = _private(model, ds, Loose(step_on="standardized"), noise_multiplier=1.0,
                              max_grad_norm=1.0, seed=2)
    x, y = next(iter(dl))
    F.cross_entropy(model(x), y).backward()
    with pytest.raises(PrivacyRefusal, match="within its declared sensitivity 1"):
        opt.step()


def test_epsilon_equals_dp_accounting_on_the_ledgers_events():
    # AdaClip adds no release: each step is one Poisson-sampled Gaussian at the run's σ.
    ds, model, _ = _toy(n=60)
    model, opt, dl = _private(model, ds, make("adaclip", step_on="standardized"), lr=0.1,
                              batch=15, noise_multiplier=1.3, epochs=2, max_grad_norm=1.0,
                              seed=3, accountant="pld")
    for _ in range(2):
        for x, y in dl:
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
    events = []
    for g in opt.ledger.groups:
        (r,) = g.releases
        assert r.mechanism == "gradient"
        step = dp_accounting.PoissonSampledDpEvent(
            g.sample_rate, dp_accounting.GaussianDpEvent(r.noise_multiplier))
        events.append(dp_accounting.SelfComposedDpEvent(step, g.count))
    acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    acc.compose(dp_accounting.ComposedDpEvent(events))
    assert opt.step_count == 8
    assert opt.epsilon(1e-5) == pytest.approx(acc.get_epsilon(1e-5), rel=1e-6)
    assert {r.noise_multiplier for g in opt.ledger.groups for r in g.releases} == {1.3}
