"""HyFreeDP (Bu & Liu 2025, Algorithms 1 and 2): the quadratic fit, the η update, the
R_l rule, the budget split on the run's own ledger, the probes' releases and direction, and the
refusals.

Numbers come from derivations written here (the quadratic, the rule's fixed point), from
dp_accounting (ε of the ledger, tests/ledger_events.py) and from Algorithm 2 (σ_g = 1.01σ).
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
from dpfy.adaptive.hyfree import PROBES, HyFreeDP, HyFreeState, fit_quadratic, next_learning_rate
from dpfy.types import RunFacts, Sampling, StepOutcome, StepPlan
from ledger_events import dp_accounting_epsilon, effective_sigma


# -- the fit and the η update ----------------------------------------------------------------
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


@pytest.mark.parametrize("eta", [1e-4, 0.05, 3.0])
def test_fit_recovers_directional_derivative_and_curvature_exactly(eta):
    """On a quadratic, L(w − s d) = L(w) − (∇Lᵀd) s + (dᵀAd) s²/2 exactly, so the three-point
    fit (Eq. 6 anchored at L(w): with the point s = 0 fitted exactly, three symmetric points are
    interpolated exactly) gives b = ∇Lᵀd and a = dᵀAd at any spacing."""
    loss, a_mat, grad, w, d = _quadratic()
    a, b = fit_quadratic(loss(w - eta * d), loss(w), loss(w + eta * d), eta)
    assert b == pytest.approx(float(grad @ d), rel=1e-6)
    assert a == pytest.approx(float(d @ a_mat @ d), rel=1e-6 if eta > 1e-3 else 1e-3)


def test_the_paper_s_update_is_the_exact_line_minimizer():
    """Algorithm 1, line 11 (no clamp, no smoothing): η_new = ∇Lᵀd / dᵀAd, and a step with it
    minimizes L along d (checked against a fine grid of step sizes)."""
    loss, a_mat, grad, w, d = _quadratic()
    eta = 0.01
    a, b = fit_quadratic(loss(w - eta * d), loss(w), loss(w + eta * d), eta)
    new = next_learning_rate(eta, a, b, max_change=math.inf, smoothing=0.0)
    exact = float(grad @ d) / float(d @ a_mat @ d)
    assert new == pytest.approx(exact, rel=1e-9)
    grid = torch.linspace(0, 4 * exact, 4001, dtype=torch.float64)
    best = float(grid[torch.tensor([loss(w - s * d) for s in grid]).argmin()])
    assert abs(best - exact) <= float(grid[1])


@pytest.mark.parametrize("a, b, expected", [
    (4.0, 2.0, 0.5),               # b/a inside [η/2, 2η]
    (4.0, 200.0, 2.0),             # b/a = 50, clamped to 2η
    (4.0, 0.4, 0.5),               # b/a = 0.1, clamped to η/2
    (-1.0, 1.0, 1.0),              # concave along d: no minimizer, η kept
    (4.0, -1.0, 1.0),              # d ascends: b/a < 0 is no step size, η kept
    (0.0, 1.0, 1.0),
    (float("nan"), 1.0, 1.0),
    (4.0, float("inf"), 1.0),
])
def test_the_update_clamps_b_over_a_and_keeps_eta_without_a_minimizer(a, b, expected):
    """At η = 1, max_change = 2, no smoothing."""
    assert next_learning_rate(1.0, a, b, max_change=2.0, smoothing=0.0) == \
        pytest.approx(expected)


def test_smoothing_moves_eta_a_tenth_of_the_way():
    """η ← 0.9η + 0.1·target: from η = 1 toward b/a = 0.5, 0.95; toward 2 (clamped), 1.1."""
    assert next_learning_rate(1.0, 4.0, 2.0) == pytest.approx(0.95)
    assert next_learning_rate(1.0, 1.0, 50.0) == pytest.approx(1.1)


def test_the_smoothed_rule_reaches_the_line_minimizer_and_stays():
    """With exact fits the rule's only fixed point is b/a: from η₀ = 1e-4 toward η* = 0.5 it
    grows by at most 0.9 + 0.1·2 = 1.1 per round, so it needs ⌈ln(5000)/ln(1.1)⌉ = 90 rounds
    to come within 2η of η*, then converges to it geometrically (|η − η*| × 0.9 a round)."""
    star, lr = 0.5, 1e-4
    history = [lr]
    for _ in range(300):
        lr = next_learning_rate(lr, 2.0, 2.0 * star)       # a = 2, b = 2η*: b/a = η*
        history.append(lr)
    capped = next(i for i, v in enumerate(history) if v * 2 >= star)
    assert capped == math.ceil(math.log(star / 2 / 1e-4) / math.log(1.1))
    assert history[-1] == pytest.approx(star, rel=1e-9)
    assert all(v <= star * (1 + 1e-12) for v in history)


def test_on_pure_probe_noise_the_rule_drifts_down():
    """When the probes resolve nothing (each released loss = L + u·z, z ~ N(0, 1) independent),
    b/a = η·(z₋ − z₊)/(2(z₊ + z₋ − 2z₀)): numerator and denominator are independent (their
    covariance is Var z₋ − Var z₊ = 0) with variances 2 and 6, so b/a = η·C/(2√3), C standard
    Cauchy. A fit is accepted (a > 0 and b > 0) with probability 1/4; given that, b/a ≤ η/2
    (clamped down) with probability P(|C| ≤ √3) = (2/π)·atan(√3) = 2/3, and ≥ 2η with
    (2/π)·atan(1/(4√3)) ≈ 0.0917. With smoothing 0.9 the mean log-change of η per round is
    (1/4)·∫ log(0.9 + 0.1·clamp(c/(2√3), 1/2, 2))·2/(π(1 + c²)) dc over c > 0 (numerical
    integration below), negative: noise alone shrinks η."""
    from scipy.integrate import quad

    gen = torch.Generator().manual_seed(0)
    z = torch.randn(40000, 3, generator=gen, dtype=torch.float64).tolist()
    u, eta = 0.02, 1e-4
    raw = [next_learning_rate(eta, *fit_quadratic(u * m, u * zero, u * p, eta),
                              smoothing=0.0) / eta for m, zero, p in z]
    accepted = [r for r in raw if r != 1.0]
    assert len(accepted) / len(raw) == pytest.approx(0.25, abs=0.01)
    assert sum(r == 0.5 for r in accepted) / len(accepted) == pytest.approx(2 / 3, abs=0.02)
    assert sum(r == 2.0 for r in accepted) / len(accepted) == pytest.approx(
        2 / math.pi * math.atan(1 / (4 * math.sqrt(3))), abs=0.01)

    def log_change(c: float) -> float:
        return (math.log(0.9 + 0.1 * min(max(c / (2 * math.sqrt(3)), 0.5), 2.0))
                * 2 / (math.pi * (1 + c * c)))

    drift = quad(log_change, 0, math.inf, limit=200)[0] / 4
    smoothed = [math.log(next_learning_rate(eta, *fit_quadratic(u * m, u * zero, u * p, eta))
                         / eta) for m, zero, p in z]
    assert drift < 0
    assert sum(smoothed) / len(smoothed) == pytest.approx(drift, abs=0.001)


# -- the R_l rule and the rounds, on released values -----------------------------------------
def _facts(**kw):
    base = dict(sampling=Sampling.POISSON, sample_rate=0.1, steps=20, delta=1e-5,
                target_epsilon=2.0, accountant="rdp", inner_hyperparameters={"lr": 0.05})
    return RunFacts(**{**base, **kw})


def _round(method: HyFreeDP, state: HyFreeState, step: int, losses: dict[str, float],
           batch: float = 100.0) -> HyFreeState:
    """``update`` after a probe round whose released mean losses are ``losses``."""
    plan = StepPlan(step=step, sample_rate=0.1, noise_multiplier=1.0, clip=1.0,
                    lr_scale=state.lr / method.base_lr)
    sums = {n: v * batch for n, v in losses.items()}
    params = {"w": torch.zeros(3)}
    return method.update(state, StepOutcome(plan=plan, expected_batch_size=batch, sums=sums,
                                            parameters=params))


LOSSES = {"loss_probe_descent": 0.8, "loss_probe_at_theta": 1.0, "loss_probe_ascent": 1.4}


@pytest.mark.parametrize("rule, expected", [("sum", 3.2), ("anchor", 1.0)])
def test_loss_clip_is_the_previous_round_s_losses(rule, expected):
    """R_l for the next round: |L̃_− + L̃_0 + L̃_+| (the paper's practice, §4.1) or |L̃_0|
    (Algorithm 1, line 8), from the released mean losses Σ/b."""
    m = HyFreeDP(probe_every=5, loss_clip_rule=rule).calibrate(_facts())
    state = _round(m, m.init(), 0, LOSSES)
    assert state.loss_clip == pytest.approx(expected)


@pytest.mark.parametrize("losses, expected", [
    ({"loss_probe_descent": -0.5, "loss_probe_at_theta": -0.6, "loss_probe_ascent": -0.4},
     1.5),                                                   # noise made them negative: |·|
    ({"loss_probe_descent": 0.001, "loss_probe_at_theta": -0.002, "loss_probe_ascent": 0.0},
     0.01),                                                  # ≈ 0: the floor
])
def test_loss_clip_is_positive_whatever_the_noise(losses, expected):
    m = HyFreeDP(probe_every=5).calibrate(_facts())
    assert _round(m, m.init(), 0, losses).loss_clip == pytest.approx(expected)


def test_the_first_round_sets_r_l_only_and_later_rounds_fit_eta():
    """Round 0 has no direction (η kept); a round with one fits a, b at spacing η and moves η
    by the rule: losses 0.8 / 1.0 / 1.4 at η = 0.05 give b = (1.4 − 0.8)/0.1 = 6 and
    a = (0.8 + 1.4 − 2)/0.0025 = 80, b/a = 0.075 (inside [η/2, 2η]), η = 0.045 + 0.0075."""
    m = HyFreeDP(probe_every=5).calibrate(_facts())
    state = _round(m, m.init(), 0, LOSSES)
    assert state.lr == pytest.approx(0.05) and state.last_fit is None
    state = HyFreeState(lr=0.05, loss_clip=3.2, direction={"w": torch.ones(3)})
    after = _round(m, state, 5, LOSSES)
    assert after.last_fit == pytest.approx((80.0, 6.0))
    assert after.lr == pytest.approx(0.9 * 0.05 + 0.1 * 0.075)
    assert after.direction is None and after.rounds == 1


# -- a private run ---------------------------------------------------------------------------
N, B, EPOCHS, K = 240, 24, 2, 5      # 20 steps: probe rounds at t = 0, 5, 10, 15


def _loss_fn(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y, reduction="none")


def _run(accountant="rdp", target=2.0, **options):
    torch.manual_seed(0)
    x = torch.randn(N, 6)
    y = (x[:, 0] > 0).long()
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.01)
    model, opt, loader = dpfy.make_private(
        model, opt, DataLoader(TensorDataset(x, y), batch_size=B), target_epsilon=target,
        target_delta=1e-5, epochs=EPOCHS, accountant=accountant,
        method=HyFreeDP(probe_every=K, **options), loss_fn=_loss_fn)
    trace = []   # (θ before, θ after, state after) of each step
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


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_ledger_spends_the_target_by_dp_accounting_and_sigma_g_is_1_01_sigma(run, accountant):
    """Algorithm 2: ε of the run's own ledger by dp_accounting (probe steps as one Gaussian at
    σ_eff) is the target; σ_g/1.01 is the σ plain DP-SGD needs for the same (ε, δ, q, T)."""
    # the PLD run targets ε = 1: larger σ's, whose PLDs build in about half the time of ε = 2's
    target = 2.0 if accountant == "rdp" else 1.0
    opt = run[0] if accountant == "rdp" else _run(accountant="pld", target=target)[0]
    sigma = opt.method.gradient_noise / 1.01
    assert dp_accounting_epsilon(opt.ledger, 1e-5, accountant) == pytest.approx(target, rel=1e-3)
    plain = (dp_accounting.rdp.RdpAccountant() if accountant == "rdp" else
             dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4))
    plain.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
        B / N, dp_accounting.GaussianDpEvent(sigma)), N // B * EPOCHS))
    assert plain.get_epsilon(1e-5) == pytest.approx(target, rel=1e-3)


def test_probe_rounds_are_composed_with_their_gradient_step(run):
    """Steps 0, K, 2K, ... release the gradient and the three losses on one Poisson sample:
    recorded as one step, σ_eff⁻² = σ_g⁻² + 3σ_l⁻² (Algorithm 1 probes the gradient's batch; the
    paper's Theorem 2 composes them as independently sampled releases, which is slightly
    optimistic), never as separate steps."""
    opt, _ = run
    m = opt.method
    steps = [(g.first_step + i, g) for g in opt.ledger.step_groups for i in range(g.count)]
    assert len(steps) == N // B * EPOCHS
    for t, g in steps:
        names = [r.mechanism for r in g.releases]
        if t % K == 0:
            assert sorted(names) == sorted(["gradient", *PROBES])
            assert effective_sigma(g) == pytest.approx(
                (m.gradient_noise ** -2 + 3 * m.loss_noise ** -2) ** -0.5)
        else:
            assert names == ["gradient"]


def test_probes_sit_at_theta_minus_and_plus_eta_d_along_the_applied_update(run):
    """The round at step K probes θ ∓ η d with d = (θ_{K−1} − θ_K)/η_{K−1}, the update the
    optimizer applied (AdamW's, weight decay included); each loss release has sensitivity R_l
    and noise std σ_l·R_l."""
    opt, trace = run
    m = opt.method
    before, after, state = trace[K - 1]            # after step K−1: direction for step K
    applied_lr = trace[K - 2][2].lr                 # η used at step K−1
    for n, d in state.direction.items():
        torch.testing.assert_close(d, (before[n] - after[n]) / applied_lr)
    specs = m.releases(state, StepPlan(step=K, sample_rate=B / N, noise_multiplier=1.0, clip=1.0))
    assert set(specs) == set(PROBES)
    for name, spec in specs.items():
        assert spec.kind == "loss" and spec.sensitivity == state.loss_clip
        assert spec.noise_std == pytest.approx(m.loss_noise * state.loss_clip)
        for n, off in spec.offsets.items():
            torch.testing.assert_close(off, -PROBES[name] * state.lr * state.direction[n])
    assert specs["loss_probe_at_theta"].offsets == {}
    assert m.releases(state, StepPlan(step=K + 1, sample_rate=B / N, noise_multiplier=1.0,
                                      clip=1.0)) == {}


def test_eta_moves_only_at_rounds_by_the_rule_on_the_round_s_fit(run):
    _, trace = run
    states = [s for _, _, s in trace]
    assert states[0].lr == pytest.approx(0.05)                 # η₀: the optimizer's lr
    for t in range(1, len(states)):
        before, now = states[t - 1], states[t]
        if t % K:
            assert now.lr == before.lr and now.loss_clip == before.loss_clip
        else:
            assert now.lr == pytest.approx(next_learning_rate(before.lr, *now.last_fit))
    assert all(s.loss_clip >= 0.01 for s in states)


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


@pytest.mark.parametrize("bad", [{"probe_every": 0}, {"probe_every": 2.5}, {"max_change": 1.0},
                                 {"smoothing": 1.0}, {"gamma": 1.0},
                                 {"loss_clip_rule": "median"}, {"loss_clip_floor": 0.0},
                                 {"initial_loss_clip": -1.0}, {"stability": 0.0}])
def test_bad_options_are_one_line_errors(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        dpfy.adaptive.make("hyfree", **bad)


# -- dpfy train: η₀ and the optimizer without --lr / --optimizer -----------------------------
@pytest.mark.parametrize("flags, lr, optimizer", [
    (["--method", "hyfree"], 1e-4, "adam"),      # Algorithm 1's η₀; the paper's Adam family
    (["--method", "hyfree", "--lr", "0.5", "--optimizer", "sgd"], 0.5, "sgd"),   # given: kept
    ([], 4.0, "sgd"),                            # no method: the SGD recipe
])
def test_train_lr_and_optimizer_defaults_are_resolved_per_method(flags, lr, optimizer):
    from dpfy.cli.train import explicit_settings, train_parser
    from dpfy.train.config import TrainConfig

    cfg = TrainConfig.from_mapping(explicit_settings(train_parser().parse_args(flags)))
    assert (cfg.lr, cfg.optimizer) == (pytest.approx(lr), optimizer)
