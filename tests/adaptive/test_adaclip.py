"""AdaClip, coordinate-wise adaptive clipping (Pichapati et al. 2019; reviewed by Monir, Fauzan &
Ghinita 2023, §3.2.3).

Expected values come from the float64 per-example loop (tests/oracles.py), from dp_accounting,
or from the estimator rule written out by hand in each test (module docstring of
``dpfy.adaptive.adaclip``).
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from ledger_events import dp_accounting_epsilon
import dpfy.step.sums
from dpfy.types import StepOutcome
from dpfy.adaptive import make
from dpfy.adaptive.adaclip import AdaClip, AdaClipState, scale_from_variance
from dpfy.types import Clip
from dpfy.errors import PrivacyRefusal
from dpfy.types.plan import StepPlan

import oracles

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


def test_the_papers_update_is_the_default_and_step_on_is_gone():
    # The step now maps the release back (postprocess), so the standardized workaround is gone.
    assert make("adaclip").initial_clip is None
    with pytest.raises(ValueError, match="^options must be among .* for method 'adaclip'"):
        make("adaclip", step_on="standardized")


@pytest.mark.parametrize("field,value", [("initial_clip", 0.0), ("mean_decay", 1.0),
                                         ("var_decay", -0.1), ("min_var", 0.0)])
def test_config_rejects_bad_values(field, value):
    with pytest.raises(ValueError, match=f"^{field} must be"):
        AdaClip(**{field: value})


def test_the_ghost_route_is_refused():
    ds, model, _ = _toy()
    # it implements transform: the step derives the materialized route from that
    with pytest.raises(ValueError, match="route must be 'auto' or 'vmap'.*adaclip"):
        _private(model, ds, make("adaclip"), noise_multiplier=1.0,
                 max_grad_norm=1.0, route="ghost", seed=0)


def test_the_start_is_flat_clipping_at_c0():
    # s_0 = C_0²/d: b_0 = (C_0²/d)^{1/4} · (d · C_0/√d)^{1/2} = C_0 in every coordinate.
    m = AdaClip(initial_clip=0.7)
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
    # StepOutcome w̃ = (1, −0.75), B = 4, σ = 2, β₁ = β₂ = ½:
    #   ĝ = b w̃ + a = (√3, 1 − 0.75√6)          (postprocess; update reads ĝ)
    #   v = B (ĝ − a)² − b² σ²/B = b² (4 w̃² − 1) = (3·3, 6·1.25) = (9, 7.5)
    #   a' = ½ a + ½ ĝ = (√3/2, 1 − 0.375√6),   s' = ½ s + ½ v = (5, 5.75)
    m = AdaClip(initial_clip=1.0, mean_decay=0.5, var_decay=0.5, min_var=1e-3)
    state = AdaClipState(mean={"w": torch.tensor([0.0, 1.0], dtype=torch.float64)},
                         var={"w": torch.tensor([1.0, 4.0], dtype=torch.float64)})
    _, b = m.shift_scale(state, {"w": torch.Size([2])})
    assert b["w"].tolist() == pytest.approx([math.sqrt(3), math.sqrt(6)])
    plan = StepPlan(0, 0.1, 2.0, 1.0)
    w = {"w": torch.tensor([1.0, -0.75], dtype=torch.float64)}
    g = m.postprocess(state, w, plan, {}, 4.0)
    assert g["w"].dtype == torch.float64
    assert g["w"].tolist() == pytest.approx([math.sqrt(3), 1 - 0.75 * math.sqrt(6)])
    new = m.update(state, StepOutcome(plan, 4.0, gradient=g))
    assert new.mean["w"].tolist() == pytest.approx([math.sqrt(3) / 2, 1 - 0.375 * math.sqrt(6)])
    assert new.var["w"].tolist() == pytest.approx([5.0, 5.75])
    # w̃ = 0: ĝ = a, v = −b² < h₁ is clamped to h₁ = 1e-3: s' = ½ s + ½·1e-3; a' = a.
    zero = m.update(state, StepOutcome(plan, 4.0, gradient=m.postprocess(
        state, {"w": torch.zeros(2)}, plan, {}, 4.0)))
    assert zero.var["w"].tolist() == pytest.approx([0.5005, 2.0005])
    assert zero.mean["w"].tolist() == pytest.approx([0.0, 1.0])


def test_transform_and_estimates_against_the_per_example_loop():
    # σ = 0 and lr = 0 (the model stays put): step 0 is flat clipping at C_0 in w = g/C_0;
    # step 1 standardizes with (a_1, b_1) derived here from step 0's release by the rule.
    # update reads the mapped-back ĝ_t = b_t w̃ + a_t.
    c0, beta1, beta2, h1, h2 = 0.5, 0.9, 0.99, 1e-8, 1e2
    ds, model, ref = _toy()
    releases = []
    original = AdaClip.update

    def spy(self, state, released):
        releases.append({n: t.detach().double().clone() for n, t in released.gradient.items()})
        return original(self, state, released)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(AdaClip, "update", spy)
        model, opt, dl = _private(model, ds, make("adaclip"),
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
    g0 = {n: c0 * w0[n] / big_b for n in names}                        # ĝ_0 = b_0 w̃ + 0
    for n in names:
        assert torch.allclose(releases[0][n], g0[n], atol=1e-6)
    a1 = {n: (1 - beta1) * g0[n] for n in names}
    s1 = {n: beta2 * c0 ** 2 / d + (1 - beta2) * (big_b * g0[n] ** 2).clamp(h1, h2)
          for n in names}
    total = sum(float(s.sqrt().sum()) for s in s1.values())
    b1 = {n: s1[n] ** 0.25 * math.sqrt(total) for n in names}
    w1 = {n: (grads[1][n] - a1[n]) / b1[n] for n in names}               # (B, *θ) float64
    expected = oracles.clipped_sum(w1, 1.0)
    for n in names:                                                     # ĝ_1 = b_1 w̃ + a_1
        assert torch.allclose(releases[1][n], b1[n] * expected[n] / big_b + a1[n], atol=1e-5)


def test_the_optimizer_steps_on_the_map_back_against_the_per_example_loop():
    # σ = 0, lr = 1, plain SGD: θ_t − θ_{t+1} = ĝ_t = b_t ⊙ (Σ_i ŵ_i)/B + a_t, derived here from
    # the float64 per-example loop at the model's current parameters; a_t is added once per
    # step (not n/B times: the batch size n is private and differs from B here).
    c0, beta1, beta2, h1, h2 = 0.5, 0.9, 0.99, 1e-8, 1e2
    ds, model, ref = _toy()
    model, opt, dl = _private(model, ds, make("adaclip"), lr=1.0, noise_multiplier=0.0,
                              max_grad_norm=c0, seed=1)
    big_b = opt.sampler.normalizer
    names = [n for n, _ in model.named_parameters()]
    d = sum(p.numel() for p in model.parameters())
    a = {n: torch.zeros_like(p, dtype=torch.float64) for n, p in model.named_parameters()}
    s = {n: torch.full_like(p, c0 ** 2 / d, dtype=torch.float64)
         for n, p in model.named_parameters()}
    sizes, moved = [], []
    for step, (x, y) in enumerate(dl):
        with torch.no_grad():                                  # ref at the current θ
            live = dict(model.named_parameters())
            for n, p in ref.named_parameters():
                p.copy_(live[n])
        g = oracles.per_example_grads(ref, x, y, SUM)           # (n, *θ) float64
        b = scale_from_variance(s)
        wsum = oracles.clipped_sum({n: (g[n] - a[n]) / b[n] for n in names}, 1.0)
        want = {n: b[n] * wsum[n] / big_b + a[n] for n in names}   # ĝ_t, a_t added once
        before = {n: p.detach().double().clone() for n, p in model.named_parameters()}
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        for n, p in model.named_parameters():
            assert torch.allclose(before[n] - p.detach().double(), want[n], atol=1e-5), (step, n)
        moved.append(max(float((before[n] - p.detach().double()).abs().max())
                         for n, p in model.named_parameters()))
        sizes.append(len(y))
        for n in names:                                         # the rule, on ĝ_t (σ = 0)
            v = (big_b * (want[n] - a[n]) ** 2).clamp(h1, h2)
            a[n] = beta1 * a[n] + (1 - beta1) * want[n]
            s[n] = beta2 * s[n] + (1 - beta2) * v
        if step == 3:
            break
    assert opt.step_count == 4 and min(moved) > 1e-3             # the steps really moved θ
    assert any(n != big_b for n in sizes[1:])                   # n ≠ B while a_t ≠ 0


def test_end_to_end_the_sensitivity_check_passes_every_step_and_bites():
    ds, model, _ = _toy(n=60)
    seen = []
    original = dpfy.step.sums.check_bound

    def spy(sq, bound, *, what, owner, **rest):
        if what == "the clipped gradient sum":
            seen.append((float(sq.max().sqrt()) if sq.numel() else 0.0, bound))
        return original(sq, bound, what=what, owner=owner, **rest)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dpfy.step.sums, "check_bound", spy)
        model, opt, dl = _private(model, ds, make("adaclip"), lr=0.1,
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
    model, opt, dl = _private(model, ds, Loose(), noise_multiplier=1.0,
                              max_grad_norm=1.0, seed=2)
    x, y = next(iter(dl))
    F.cross_entropy(model(x), y).backward()
    with pytest.raises(PrivacyRefusal, match="within its declared sensitivity 1"):
        opt.step()


def test_epsilon_equals_dp_accounting_on_the_ledgers_events():
    # AdaClip adds no release: each step is one Poisson-sampled Gaussian at the run's σ.
    ds, model, _ = _toy(n=60)
    model, opt, dl = _private(model, ds, make("adaclip"), lr=0.1,
                              batch=15, noise_multiplier=1.3, epochs=2, max_grad_norm=1.0,
                              seed=3, accountant="pld")
    for _ in range(2):
        for x, y in dl:
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
    for g in opt.ledger.step_groups:
        (r,) = g.releases
        assert r.mechanism == "gradient"
    assert opt.step_count == 8
    assert opt.epsilon(1e-5) == pytest.approx(dp_accounting_epsilon(opt.ledger, 1e-5, "pld"),
                                              rel=1e-6)
    assert {r.noise_multiplier for g in opt.ledger.step_groups for r in g.releases} == {1.3}
