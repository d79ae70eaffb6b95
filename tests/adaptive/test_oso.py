"""OSO-DPSGD (Galli, Palamidessi & Cucinotta 2024): Algorithm 1 with the sign-exponential
updates, Eqs. (20) and (21) (the latter with g̃ᵀg̃, as in Algorithm 1 line 15).

Expected numbers come from the paper (the 1 % rule of its Privacy Analysis section gives
ν_q/ν = 1/√(1 − 1.01⁻²) = 7.12399; Eq. (20) bounds the drift |ln(C_t/C_0)| by ρ_c·t), from
dp_accounting, or
from the float64 per-example loop in tests/oracles.py; the toy-quadratic tests derive the sign
of each update in their comments.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from ledger_events import dp_accounting_epsilon, effective_sigma
from dpfy.adaptive import make
from dpfy.adaptive.oso import THRESHOLD_GRADIENT, OnlineSensitivity
from dpfy.types import Norms, StepOutcome, StepPlan

import oracles

SUM = lambda o, t: F.cross_entropy(o, t, reduction="sum")  # noqa: E731


def _plan(sigma: float = 1.0) -> StepPlan:
    return StepPlan(step=0, sample_rate=0.01, noise_multiplier=sigma, clip=1.0)


# -- the noise split (Galli et al. 2024, Privacy Analysis, Proposition 1) --------------------

def test_the_one_percent_rule_splits_nu_so_the_pair_spends_nu():
    m = OnlineSensitivity()
    for nu in (0.5, 1.7, 9.0):
        plan = m.plan(m.init(), _plan(nu))
        spec = m.releases(m.init(), plan)[THRESHOLD_GRADIENT]
        assert plan.noise_multiplier / nu == pytest.approx(1.01, rel=1e-12)
        assert spec.noise_multiplier / nu == pytest.approx(7.12399, abs=5e-6)  # 1/√(1 − 1.01⁻²)
        assert spec.sensitivity == 1.0 and spec.kind == "gradient"
        # Round trip ν⁻² = ν_g⁻² + ν_q⁻² (Proposition 1).
        assert plan.noise_multiplier ** -2 + spec.noise_multiplier ** -2 == pytest.approx(
            nu ** -2, rel=1e-12)


def test_zero_noise_is_refused_naming_the_method():
    m = OnlineSensitivity()
    with pytest.raises(ValueError, match="noise_multiplier must be > 0 for method 'oso'"):
        m.plan(m.init(), _plan(0.0))


@pytest.mark.parametrize("field,value", [("initial_clip", 0.0), ("clip_rate", 1.0),
                                         ("lr_rate", -1e-3), ("rule", "bogus"),
                                         ("inflation", 0.0), ("adapt_lr", "yes"),
                                         ("min_clip", 0.0), ("initial_lr", -1.0)])
def test_config_rejects_bad_values(field, value):
    with pytest.raises(ValueError, match=f"^{field} must be"):
        OnlineSensitivity(**{field: value})


def test_plan_field_claims_follow_adapt_lr():
    # ν → ν_g = 1.01ν is a noise split (the pair spends ν), not a σ the method sets
    assert OnlineSensitivity().sets == {"clip", "lr_scale", "noise_split"}
    assert OnlineSensitivity(adapt_lr=False).sets == {"clip", "noise_split"}


# -- the threshold gradient's weights (Eq. 11) ------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_each_q_i_has_norm_zero_or_one_and_the_mask_is_strict(dtype):
    c = 0.1
    n = torch.tensor([0.0, 0.05, c, 0.1001, 3.0, 250.0], dtype=dtype)   # n[2] is exactly C
    m = OnlineSensitivity(initial_clip=c)
    plan = m.plan(m.init(), _plan())
    w = m.releases(m.init(), plan)[THRESHOLD_GRADIENT].values(Norms(n, {}, ()))
    # ‖q_i‖ = w_i·‖g_i‖: 0 for n ≤ C (including n = 0 and n = C exactly), 1 above.
    assert (w * n.double()).tolist() == pytest.approx([0, 0, 0, 1, 1, 1], abs=1e-6)
    # The mask agrees with the clipping: exactly the examples with weight < 1 are counted.
    clip_w = m.clipping(m.init(), Norms(n, {}, ()), plan).weights
    assert ((clip_w < 1) == (w > 0)).all()


# -- the updates (Eqs. 20–21, 19) -------------------------------------------------------------

def _released(g: torch.Tensor, q_sum: torch.Tensor, b: float = 10.0) -> StepOutcome:
    return StepOutcome(plan=_plan(), expected_batch_size=b, sums={THRESHOLD_GRADIENT: {"w": q_sum}},
                    gradient={"w": g})


@pytest.mark.parametrize("rule", ["sign", "rubio", "additive"])
def test_first_step_leaves_C_and_rho_unchanged(rule):
    m = OnlineSensitivity(rule=rule, initial_lr=0.5)
    gen = torch.Generator().manual_seed(0)
    state = m.update(m.init(), _released(torch.randn(7, generator=gen),
                                         torch.randn(7, generator=gen)))
    assert state.clip == 0.1 and state.lr_scale == 1.0   # q̃_0 = g̃_0 = 0, sign(0) = 0


def test_after_t_steps_C_and_rho_moved_at_most_rate_times_t():
    m = OnlineSensitivity(clip_rate=0.01, lr_rate=0.02)
    gen = torch.Generator().manual_seed(1)
    state = m.init()
    for t in range(1, 41):
        state = m.update(state, _released(torch.randn(5, generator=gen),
                                          torch.randn(5, generator=gen)))
        assert abs(math.log(state.clip / 0.1)) <= 0.01 * t + 1e-12
        assert abs(math.log(state.lr_scale)) <= 0.02 * t + 1e-12
    # Always-agreeing vectors reach the bound after the first (free) step: e^{ρ_c (t − 1)}.
    state = m.init()
    for _ in range(11):
        state = m.update(state, _released(torch.ones(3), torch.ones(3)))
    assert state.clip == pytest.approx(0.1 * math.exp(0.01 * 10), rel=1e-12)
    assert state.lr_scale == pytest.approx(math.exp(0.02 * 10), rel=1e-12)


def test_rubio_rule_steps_by_the_cosine():
    # Eq. 19: C_{t+1} = C_t (1 + ρ_c cos(g̃_t, q̃_{t−1})). q̃_0 = (3, 4)/b, g̃_1 = (4, 3):
    # cos = 24/25. For ρ: cos(g̃_1, g̃_0) with g̃_0 = (1, 0): 4/5.
    m = OnlineSensitivity(rule="rubio", clip_rate=0.1, lr_rate=0.1)
    s = m.update(m.init(), _released(torch.tensor([1.0, 0.0]), torch.tensor([3.0, 4.0])))
    s = m.update(s, _released(torch.tensor([4.0, 3.0]), torch.zeros(2)))
    assert s.clip == pytest.approx(0.1 * (1 + 0.1 * 24 / 25), rel=1e-7)  # float32 q̃
    assert s.lr_scale == pytest.approx(1 + 0.1 * 4 / 5, rel=1e-12)


def test_additive_rules_step_by_the_released_dot_products():
    # Eqs. 13 and 16 with ρ = ρ_1 = 0.5, ρ_c = 0.1, ρ_r = 0.2, b = 10. Step 1 stores
    # g̃_0 = (1, 0) and q̃_0 = (3, 4)/10 and changes nothing. Step 2, g̃_1 = (4, 3):
    # C = 0.1 + 0.1·0.5·⟨(4, 3), (0.3, 0.4)⟩ = 0.1 + 0.05·2.4 = 0.22;
    # ρ/ρ_1 = 1 + 0.2·⟨(4, 3), (1, 0)⟩ = 1.8.
    m = OnlineSensitivity(rule="additive", clip_rate=0.1, lr_rate=0.2, initial_lr=0.5)
    s = m.update(m.init(), _released(torch.tensor([1.0, 0.0]), torch.tensor([3.0, 4.0])))
    assert (s.clip, s.lr_scale) == (0.1, 1.0)
    s = m.update(s, _released(torch.tensor([4.0, 3.0]), torch.tensor([-3.0, -4.0])))
    assert s.clip == pytest.approx(0.22, rel=1e-6) and s.lr_scale == pytest.approx(1.8)
    # Step 3, g̃_2 = (−4, −3) against q̃_1 = (−0.3, −0.4): C + 0.05·2.4 = 0.34; and against
    # g̃_1 = (4, 3): ρ/ρ_1 = 1.8 + 0.2·(−25) < 0, floored at 0 (no ascent).
    s = m.update(s, _released(torch.tensor([-4.0, -3.0]), torch.zeros(2)))
    assert s.clip == pytest.approx(0.34, rel=1e-6) and s.lr_scale == 0.0
    # ρ_c·ρ_1 = 0.5, q̃_0 = (1, 1)/10, g̃_1 = −(1, 1): C = 0.1 + 0.5·(−0.2) = 0, floored at
    # min_clip (the clipping needs a positive threshold).
    m2 = OnlineSensitivity(rule="additive", clip_rate=0.5, initial_lr=1.0, min_clip=1e-4)
    s = m2.update(m2.init(), _released(torch.ones(2), torch.ones(2)))
    s = m2.update(s, _released(-torch.ones(2), torch.zeros(2)))
    assert s.clip == 1e-4


def test_additive_rule_reads_the_optimizer_lr_from_the_run_facts():
    ds = _data(60)
    model = nn.Linear(6, 3)
    _, opt, _ = dpfy.make_private(model, torch.optim.SGD(model.parameters(), lr=0.3),
                                  DataLoader(ds, batch_size=30), noise_multiplier=1.0, seed=0,
                                  method=make("oso", rule="additive"))
    assert opt.method.initial_lr == 0.3
    with pytest.raises(ValueError, match="initial_lr must be known"):
        OnlineSensitivity(rule="additive").update(
            OnlineSensitivity().init(), _released(torch.ones(2), torch.ones(2)))


def _quadratic_run(start: torch.Tensor, lr: float, steps: int):
    """Noise-free OSO on ℓ_i(θ) = ½‖θ − a_i‖², driving the method's hooks by hand.

    Per-sample gradients are g_i = θ − a_i (exact, float64). Returns the (C_t, ρ_t) trajectory.
    """
    gen = torch.Generator().manual_seed(0)
    a = 0.01 * torch.randn(8, 2, generator=gen, dtype=torch.float64)   # targets near 0
    m = OnlineSensitivity(initial_clip=0.1, clip_rate=0.05, lr_rate=0.05)
    state, theta, out = m.init(), start.clone(), []
    for t in range(steps):
        plan = m.plan(state, StepPlan(t, 0.01, 1.0, 1.0))
        g = theta - a                                                   # (B, 2)
        norms = Norms(g.norm(dim=1), {"θ": g.square().sum(1)}, (("θ",),))
        w = m.clipping(state, norms, plan).weights
        v = m.releases(state, plan)[THRESHOLD_GRADIENT].values(norms)
        b = float(len(a))
        g_mean = (w[:, None] * g).sum(0) / b
        state = m.update(state, StepOutcome(plan, b, {THRESHOLD_GRADIENT: {"θ": (v[:, None] * g)
                                                                         .sum(0)}},
                                         {"θ": g_mean}))
        theta = theta - lr * plan.lr_scale * g_mean
        out.append((state.clip, state.lr_scale))
    return out


def test_sign_conventions_on_a_toy_quadratic():
    # Far from the minimum (‖θ − a_i‖ ≈ 10 ≫ C): every sample is clipped and small steps keep
    # g̃_t along q̃_{t−1} (both ≈ θ/‖θ‖): ⟨g̃_t, q̃_{t−1}⟩ > 0, so C grows; consecutive
    # gradients agree, so ρ grows (Galli et al. 2024 Eq. 21, read with g̃ᵀg̃ as in Algorithm 1).
    aligned = _quadratic_run(torch.tensor([10.0, 0.0], dtype=torch.float64), lr=1.0, steps=4)
    assert aligned[0] == (0.1, 1.0)                       # first step: unchanged
    assert all(c2 > c1 and r2 > r1 for (c1, r1), (c2, r2) in zip(aligned, aligned[1:]))
    # An overshooting step (lr·C = 0.1·200 = 20 from θ = (10, 0), every sample clipped) lands
    # at θ ≈ (−10, 0): g̃_1 ≈ −q̃_0·C: anti-aligned, so C shrinks and ρ shrinks.
    (c0, r0), (c1, r1) = _quadratic_run(torch.tensor([10.0, 0.0], dtype=torch.float64),
                                        lr=200.0, steps=2)
    assert (c0, r0) == (0.1, 1.0)
    assert c1 == pytest.approx(0.1 * math.exp(-0.05)) and r1 == pytest.approx(math.exp(-0.05))


# -- through the engine ----------------------------------------------------------------------

def _data(n=300, d=6):
    torch.manual_seed(0)
    return TensorDataset(torch.randn(n, d), torch.randint(0, 3, (n,)))


def test_released_threshold_gradient_matches_the_loop_and_has_the_declared_noise():
    # A wide model (60·10 + 10 = 610 parameters) at lr = 0 so θ stays put, over 20 steps: the
    # released q̃ and g̃ minus the float64 loop's Σ q_i / b and Σ clip(g_i) / b are the noise
    # alone, whose std must be ν_q/b and ν_g C/b (Galli et al. 2024 Algorithm 1: noise on the sum,
    # then ÷ b; 12,200 draws each,
    # so the sample std is within ≈ 0.7 % of the truth; 7.124 vs 1.01 would be far outside).
    torch.manual_seed(0)
    ds = TensorDataset(torch.randn(40, 60) * 3, torch.randint(0, 10, (40,)))
    model, ref = nn.Linear(60, 10), nn.Linear(60, 10)
    ref.load_state_dict(model.state_dict())
    nu, c = 3.0, 0.1
    model, opt, dl = dpfy.make_private(model, torch.optim.SGD(model.parameters(), lr=0.0),
                                       DataLoader(ds, batch_size=20), noise_multiplier=nu,
                                       method=OnlineSensitivity(initial_clip=c), seed=5)
    q_noise, g_noise = [], []
    b = opt.sampler.normalizer
    while opt.step_count < 20:
        for x, y in dl:
            grads = oracles.per_example_grads(ref, x, y, SUM)             # float64 (B, *θ)
            n = oracles.per_example_norms(grads)
            w = (n > c).double() / n                                      # q_i = w_i g_i
            assert torch.allclose((w * n)[w > 0], torch.ones(1, dtype=torch.float64))
            q_sum = {k: torch.einsum("b,b...->...", w, v) for k, v in grads.items()}
            clipped = oracles.clipped_sum(grads, c)
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            state = opt.method_state
            for k in q_sum:
                q_noise.append((state.prev_direction[k].double() - q_sum[k] / b).flatten())
                g_noise.append((state.prev_gradient[k].double() - clipped[k] / b).flatten())
    q_noise, g_noise = torch.cat(q_noise), torch.cat(g_noise)
    assert q_noise.std().item() == pytest.approx(7.12399 * nu / b, rel=0.03)
    assert g_noise.std().item() == pytest.approx(1.01 * nu * c / b, rel=0.03)
    # The noise is centred: the signal is exactly the loop's sums (re-weighted = explicit).
    assert abs(q_noise.mean().item()) < 4 * 7.12399 * nu / b / len(q_noise) ** 0.5


def test_reweighted_sums_equal_the_explicit_per_sample_sums():
    # Digest §4.6: Σ q_i formed by the engine's re-weighted backward equals the explicit sum of
    # g_i/‖g_i‖ over the clipped examples (float64 loop in tests/oracles.py). ν = 1e-9 makes
    # the noise (std ≈ 7e-9/b) negligible against the 1e-5 tolerance; lr = 0 keeps θ fixed.
    torch.manual_seed(1)
    ds = TensorDataset(torch.randn(30, 5) * 2, torch.randint(0, 4, (30,)))
    model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 4))
    ref = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 4))
    ref.load_state_dict(model.state_dict())
    c = 0.3
    model, opt, dl = dpfy.make_private(model, torch.optim.SGD(model.parameters(), lr=0.0),
                                       DataLoader(ds, batch_size=15), noise_multiplier=1e-9,
                                       method=OnlineSensitivity(initial_clip=c), seed=2,
                                       accountant="rdp")
    b = opt.sampler.normalizer
    checked = 0
    for x, y in dl:
        grads = oracles.per_example_grads(ref, x, y, SUM)                    # float64
        n = oracles.per_example_norms(grads)
        explicit = {k: torch.einsum("b,b...->...", (n > c).double() / n, v)
                    for k, v in grads.items()}
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        for k, v in explicit.items():
            torch.testing.assert_close(opt.method_state.prev_direction[k].double(), v / b,
                                       rtol=1e-5, atol=1e-6)
        checked += int((n > c).sum())
    assert checked > 0


def test_epsilon_equals_dp_accounting_and_the_sensitivity_check_passes_every_step():
    ds = _data()
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    model, opt, loader = dpfy.make_private(
        model, torch.optim.SGD(model.parameters(), lr=0.5), DataLoader(ds, batch_size=30),
        method="oso", target_epsilon=2.0, target_delta=1e-5, epochs=2, seed=3,
        accountant="rdp", max_physical_batch_size=16)   # RDP calibrates and guards (fast)
    clips, scales = [], []
    for _ in range(2):
        for x, y in loader:          # the step asserts ‖w_i g_i‖ ≤ C_t and ‖q_i‖ ≤ 1 each time
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            if loader.cursor.last:
                clips.append(opt.last_step_info["clip"])
                scales.append(opt.last_step_info["lr_scale"])
    assert opt.step_count == 20 == len(clips)
    # C_t and ρ_t as the plan used them: C_0 = 0.1, ρ_0 = 1, then one ρ_c-step at most each.
    assert clips[0] == 0.1 and clips[1] == 0.1 and scales[:2] == [1.0, 1.0]
    for a, b_ in zip(clips, clips[1:]):
        assert abs(math.log(b_ / a)) == pytest.approx(2.5e-3) or a == b_
    # Both releases of a step share its Poisson sample (tests/ledger_events.py: σ_eff).
    for g in opt.ledger.step_groups:
        assert [r.mechanism for r in g.releases] == ["gradient", THRESHOLD_GRADIENT]
    assert opt.epsilon(1e-5) == pytest.approx(dp_accounting_epsilon(opt.ledger, 1e-5, "rdp"),
                                              rel=1e-6)
    assert opt.epsilon(1e-5) <= 2.0 + 1e-9
    assert opt.epsilon(1e-5, accountant="pld") == pytest.approx(
        dp_accounting_epsilon(opt.ledger, 1e-5, "pld"), rel=1e-6)
    # The pair spends exactly the calibrated ν of plain DP-SGD.
    assert all(effective_sigma(g) == pytest.approx(opt.noise_multiplier, rel=1e-12)
               for g in opt.ledger.step_groups)


def test_a_method_whose_threshold_weights_exceed_unit_norm_is_refused():
    # The engine's check covers this release: doubling q_i (norm 2 > sensitivity 1) is refused.
    class Doubled(OnlineSensitivity):
        def releases(self, state, plan):
            return {k: replace(spec, values=lambda norms, f=spec.values: 2 * f(norms))
                    for k, spec in super().releases(state, plan).items()}

    ds = _data(60)
    model = nn.Sequential(nn.Linear(6, 3))
    model, opt, loader = dpfy.make_private(
        model, torch.optim.SGD(model.parameters(), lr=0.1), DataLoader(ds, batch_size=30),
        method=Doubled(), noise_multiplier=1.0, seed=0)
    x, y = next(iter(loader))
    F.cross_entropy(model(x), y).backward()
    with pytest.raises(dpfy.errors.PrivacyRefusal, match="release 'threshold_gradient'"):
        opt.step()


def test_state_survives_a_checkpoint_and_the_cli_options_build_it():
    # A checkpoint pickles the state as it is (no state_dict of the method's own).
    import io

    m = make("oso", rule="rubio", clip_rate=0.01, adapt_lr=False)
    assert (m.rule, m.clip_rate, m.adapt_lr) == ("rubio", 0.01, False)
    s = m.update(m.init(), _released(torch.ones(2), torch.ones(2)))
    buf = io.BytesIO()
    torch.save({"method_state": s}, buf)
    buf.seek(0)
    restored = torch.load(buf, weights_only=False)["method_state"]
    assert restored.clip == s.clip and torch.equal(restored.prev_direction["w"],
                                                   s.prev_direction["w"])
