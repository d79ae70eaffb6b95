"""Dynamic DP-SGD (anonymous submission, under review): schedule math, GDP calibration (Alg. 1)
and PLD calibration.

Expected values were computed from the paper's formulas with scipy, independently of dpfy
(they are not printed in the paper): Eq. (1) for μ_tot ↔ (ε, δ), Eqs. (9) and (12) with
Algorithm 1 for μ_0 (§4.2), Eq. (14) and Algorithm 2 for C_t and σ_t (§4.3, §4.4).
"""

import inspect
import math

import numpy as np
import pytest

from dpfy.adaptive import REGISTRY, DynamicDPSGD, calibrate_dynamic, make
from dpfy.adaptive.base import calibrate_for_run
from dpfy.adaptive.dynamic import solve_mu0
from dpfy.privacy import epsilon
from dpfy.types import RunFacts, Sampling, StepPlan

gdp = pytest.importorskip("dpfy.privacy.gdp", reason="dpfy.privacy.gdp (issue 2) not landed")

P_EX, T_EX, DELTA_EX = 256 / 60000, 5000, 1e-5       # worked example for Eq. (12) (§4.2)
MU_TOT_EX = 0.115881                                  # Eq. (1) at (ε, δ) = (0.4, 1e-5)


def test_registered_in_its_own_file():
    # one method, one file: key "dynamic" lives in adaptive/dynamic.py
    assert inspect.getfile(REGISTRY["dynamic"]).endswith("adaptive/dynamic.py")


# -- schedule math (pure) ------------------------------------------------------------------
@pytest.mark.parametrize("t, clip, sigma, mu, z", [
    # Algorithm 2 (§4.4): C_0 = 1, ρ_μ = ρ_c = 2, μ_0 = 0.250819 (worked example, ρ_μ = 2), T = 5000
    (1, 0.99986, 3.98584, 0.250854, 3.9864),
    (2500, 0.70711, 1.99347, 0.354711, 2.8192),
    (5000, 0.5, 0.99674, 0.501638, 1.9935),
])
def test_algorithm2_table(t, clip, sigma, mu, z):
    s = DynamicDPSGD(mu0=0.250819, total_steps=T_EX, rho_mu=2, rho_c=2, clip0=1.0)
    step = t - 1                                      # the paper's t is 1-based
    assert s.clip(step) == pytest.approx(clip, abs=1e-5)
    assert s.sigma(step) == pytest.approx(sigma, abs=1e-5)
    assert s.mu(step) == pytest.approx(mu, abs=1e-6)
    assert s.noise_multiplier(step) == pytest.approx(z, abs=1e-4)


@pytest.mark.parametrize("rho_mu, rho_c", [(1, 1), (2, 1), (1, 5), (10, 2.5)])
def test_mu_is_clip_over_sigma_and_grows_geometrically(rho_mu, rho_c):
    # Alg. 2: μ_t = C_t/σ_t = μ_0 ρ_μ^(t/T), independent of ρ_c (follows from lines 3–4)
    s = DynamicDPSGD(mu0=0.3, total_steps=50, rho_mu=rho_mu, rho_c=rho_c, clip0=3.0)
    for step in range(50):
        t = step + 1
        assert s.clip(step) / s.sigma(step) == pytest.approx(0.3 * rho_mu ** (t / 50), rel=1e-12)
    np.testing.assert_allclose(s.mus(), [s.mu(i) for i in range(50)], rtol=1e-14)


def test_plan_sets_clip_and_noise_multiplier_and_refuses_step_T():
    s = DynamicDPSGD(mu0=0.5, total_steps=10, rho_mu=2, rho_c=4, clip0=2.0)
    base = StepPlan(step=9, sample_rate=0.01, noise_multiplier=0.0, clip=1.0)
    p = s.plan(None, base)
    assert p.clip == pytest.approx(2.0 / 4)           # C_T = C_0/ρ_c
    assert p.noise_multiplier == pytest.approx(1 / (0.5 * 2))   # z_T = 1/(μ_0 ρ_μ)
    with pytest.raises(ValueError, match="step must be in \\[0, 10\\).*total_steps"):
        s.plan(None, StepPlan(step=10, sample_rate=0.01, noise_multiplier=0.0, clip=1.0))


def test_stages_hold_values_to_the_stage_end():
    # stages=K: μ_t takes the value of each stage's last step; stages=T is the paper's schedule
    s = DynamicDPSGD(mu0=1.0, total_steps=12, rho_mu=8, stages=3)
    assert [s.fraction(i) for i in range(12)] == [1/3] * 4 + [2/3] * 4 + [1.0] * 4
    full = DynamicDPSGD(mu0=1.0, total_steps=12, rho_mu=8)
    np.testing.assert_allclose(DynamicDPSGD(mu0=1.0, total_steps=12, rho_mu=8, stages=12).mus(),
                               full.mus())


@pytest.mark.parametrize("field, value", [("rho_mu", 0.5), ("rho_c", 0.99), ("mu0", 0.0),
                                          ("total_steps", 0), ("clip0", -1.0)])
def test_bad_parameters_are_clear_errors(field, value):
    kwargs = dict(mu0=0.3, total_steps=10, rho_mu=2.0, rho_c=2.0, clip0=1.0)
    kwargs[field] = value
    with pytest.raises(ValueError, match=f"^{field} must be .*got {field} = "):
        DynamicDPSGD(**kwargs)


# q = 0.1: the calibrated σ's are large enough that their PLDs are quick to build (at q = 0.01 the
# PLD calibration below took ~6× the CPU time); no claim here depends on the rate
BUDGET = RunFacts(sampling=Sampling.POISSON, sample_rate=0.1, steps=300, steps_per_epoch=100,
                  delta=1e-5, target_epsilon=2.0, accountant="pld", max_grad_norm=1.5)


@pytest.mark.parametrize("preset, given, rho_mu, rho_c", [
    ("vanilla", {}, 1, 1), ("growing_mu", dict(rho_mu=3), 3, 1),
    ("sensitivity_decay", dict(rho_c=5), 1, 5), ("dynamic", dict(rho_mu=3, rho_c=5), 3, 5),
    ("dynamic", {}, 2, 2),                              # DEFAULT_RHO, the grid's middle
])
def test_presets_set_only_their_ratios(preset, given, rho_mu, rho_c):
    # the former schedule names vanilla / growing_mu / sensitivity_decay / dynamic; C_0 and T
    # are the run's, μ_0 is solved by the paper's GDP calibration (an explicit opt-in)
    s = calibrate_for_run(make("dynamic", preset=preset, calibration="gdp", approximate=True, **given),
                BUDGET)
    assert isinstance(s, DynamicDPSGD)
    assert (s.rho_mu, s.rho_c, s.clip0, s.total_steps) == (rho_mu, rho_c, 1.5, 300)


def test_a_ratio_the_preset_keeps_fixed_is_refused():
    with pytest.raises(ValueError, match="rho_c must be 1 \\(or unset\\) for preset 'growing_mu'"):
        make("dynamic", preset="growing_mu", rho_c=5)
    with pytest.raises(ValueError, match="preset must be one of"):
        make("dynamic", preset="warp")


def test_calibration_is_checked_at_construction():
    with pytest.raises(ValueError, match="calibration must be None .* or one of .*got "
                                         "calibration = 'moments'"):
        make("dynamic", calibration="moments")
    with pytest.raises(ValueError, match="calibration must be 'pld' or 'rdp' unless approximate"):
        make("dynamic", calibration="gdp")


def test_calibrate_solves_mu0_for_the_runs_target_and_needs_it():
    s = calibrate_for_run(make("dynamic", stages=3), BUDGET)
    eps = epsilon(s.ledger(sample_rate=0.1), delta=1e-5, accountant="pld")
    assert eps == pytest.approx(2.0, rel=0.01) and eps <= 2.0 * (1 + 1e-6)
    with pytest.raises(ValueError, match="target_epsilon must be given for method 'dynamic'"):
        calibrate_for_run(make("dynamic"), RunFacts(sampling=Sampling.POISSON, sample_rate=0.01,
                                          steps=300, max_grad_norm=1.0))
    with pytest.raises(ValueError, match="max_grad_norm must be a float for method 'dynamic'"):
        calibrate_for_run(make("dynamic"), RunFacts(sampling=Sampling.POISSON, sample_rate=0.01,
                                          steps=300, delta=1e-5, target_epsilon=1.0))


# -- GDP accounting: the paper's CLT (via dpfy.privacy.gdp) --------------------------------
@pytest.mark.parametrize("eps, delta, mu_tot", [
    # μ_tot for (ε, δ) by Eq. (1), computed with scipy
    (0.4, 1 / 600000, 0.103633), (0.6, 1 / 600000, 0.151166), (1.2, 1 / 600000, 0.287288),
    (2.0, 1 / 600000, 0.458784), (0.5, 4e-6, 0.134194), (1, 4e-6, 0.254282),
    (3, 4e-6, 0.688185), (6, 4e-6, 1.260937), (9, 4e-6, 1.774381),
    (0.4, 1e-5, 0.115881), (1.2, 1e-5, 0.316379),
])
def test_mu_tot_table(eps, delta, mu_tot):
    assert gdp.mu_for_epsilon(eps, delta) == pytest.approx(mu_tot, abs=2e-6)


def test_eq9_with_constant_mu_is_eq7_and_eq15_inverts_it():
    # Eq. (7): μ_tot = p sqrt(T (e^{μ²} − 1)); Eq. (15) is its inverse
    mu, p, T = 0.37, 0.01, 1234
    eq7 = p * math.sqrt(T * math.expm1(mu ** 2))
    assert gdp.mu_total(p, np.full(T, mu)) == pytest.approx(eq7, rel=1e-12)
    assert solve_mu0(eq7, sample_rate=p, total_steps=T, rho_mu=1.0) == pytest.approx(mu, rel=1e-12)


@pytest.mark.parametrize("rho, mu0", [
    # worked example, μ_0 from Eq. (12) (§4.2): ε = 0.4, δ = 1e-5, p = 256/60000, T = 5000
    (1, 0.370958), (1.25, 0.330228), (1 / 0.7, 0.306653), (2, 0.250819), (2.5, 0.217182),
    (5, 0.132519), (10, 0.076575),
])
def test_solve_mu0_worked_example(rho, mu0):
    got = solve_mu0(MU_TOT_EX, sample_rate=P_EX, total_steps=T_EX, rho_mu=rho)
    assert got == pytest.approx(mu0, abs=2e-6)
    s = DynamicDPSGD(mu0=got, total_steps=T_EX, rho_mu=rho)
    assert s.mu_tot(P_EX) == pytest.approx(MU_TOT_EX, rel=1e-9)     # re-accounts to μ_tot


@pytest.mark.parametrize("eps, z, mu0_rho2", [
    # vanilla noise multipliers by Eqs. (1), (7) (a plausible MNIST setup, not the paper's):
    # p = 256/60000, T = 3516, δ = 1/600000
    (0.4, 2.5391, 0.266108), (0.6, 1.8099, 0.371212), (1.2, 1.0988, 0.600033),
    (2.0, 0.8288, 0.779263),
])
def test_gdp_calibration_presets(eps, z, mu0_rho2):
    budget = dict(target_epsilon=eps, delta=1 / 600000, sample_rate=256 / 60000,
                  total_steps=3516, calibration="gdp")
    vanilla = calibrate_dynamic("vanilla", **budget)
    assert vanilla.noise_multiplier(0) == pytest.approx(z, abs=1e-4)
    dyn = calibrate_dynamic("dynamic", rho_mu=2, rho_c=3, **budget)
    assert dyn.mu0 == pytest.approx(mu0_rho2, abs=2e-6)
    # sensitivity decay has vanilla's accounting: same μ_0, ρ_μ = 1 (§4.3, Eq. 15)
    sd = calibrate_dynamic("sensitivity_decay", rho_c=3, **budget)
    assert (sd.mu0, sd.rho_mu, sd.rho_c) == (pytest.approx(vanilla.mu0), 1.0, 3.0)


@pytest.mark.parametrize("rho, expected", [
    # consumption ε(t) at 25/50/75/100 % of T by Eqs. (9), (1) (ε = 0.4, δ = 1e-5)
    (1, [0.1880, 0.2742, 0.3420, 0.4000]),
    (2, [0.1329, 0.2160, 0.3023, 0.4000]),
    (10, [0.0455, 0.1002, 0.1990, 0.4000]),
])
def test_consumption_curve_table(rho, expected):
    mu0 = solve_mu0(MU_TOT_EX, sample_rate=P_EX, total_steps=T_EX, rho_mu=rho)
    s = DynamicDPSGD(mu0=mu0, total_steps=T_EX, rho_mu=rho)
    for frac, eps in zip([0.25, 0.5, 0.75, 1.0], expected):
        mu = s.mu_tot(P_EX, steps=int(frac * T_EX))
        assert gdp.epsilon_for_delta(DELTA_EX, mu) == pytest.approx(eps, abs=1e-4)


def test_consumption_stays_below_vanilla_until_T():
    # §4.2, Fig. 2: for ρ_μ > 1 the cumulative CLT cost is strictly below vanilla for t < T
    vanilla = DynamicDPSGD(mu0=solve_mu0(MU_TOT_EX, sample_rate=P_EX, total_steps=T_EX,
                                         rho_mu=1), total_steps=T_EX, preset="vanilla")
    grow = DynamicDPSGD(mu0=solve_mu0(MU_TOT_EX, sample_rate=P_EX, total_steps=T_EX, rho_mu=2.5),
                        total_steps=T_EX, rho_mu=2.5)
    # μ_tot(t)² is a cumulative sum, so compare it at every t at once
    cum_v = np.cumsum(np.expm1(vanilla.mus() ** 2))
    cum_g = np.cumsum(np.expm1(grow.mus() ** 2))
    assert np.all(cum_g[:-1] < cum_v[:-1])
    assert cum_g[-1] == pytest.approx(cum_v[-1], rel=1e-9)
    for t in (1, 1000, 4999):                          # and in ε, through the accountant
        assert (gdp.epsilon_for_delta(DELTA_EX, grow.mu_tot(P_EX, t))
                < gdp.epsilon_for_delta(DELTA_EX, vanilla.mu_tot(P_EX, t)))


# -- rigorous accounting (PLD) -------------------------------------------------------------
def test_rho_c_does_not_change_the_ledger_or_epsilon():
    a = DynamicDPSGD(mu0=0.8, total_steps=40, rho_mu=2, rho_c=1, stages=4)
    b = DynamicDPSGD(mu0=0.8, total_steps=40, rho_mu=2, rho_c=7, clip0=5.0, stages=4)
    la, lb = a.ledger(sample_rate=0.05), b.ledger(sample_rate=0.05)
    assert la.to_dict() == lb.to_dict()
    assert epsilon(la, delta=1e-5, accountant="rdp") == epsilon(lb, delta=1e-5, accountant="rdp")


@pytest.mark.parametrize("preset", ["vanilla", "dynamic"])
def test_pld_calibration_hits_target(preset):
    # q = 0.05 (not the worked example's 256/60000, whose smaller σ's make PLDs ~4× slower to
    # build); the claim does not depend on the rate
    s = calibrate_dynamic(preset, target_epsilon=1.2, delta=1 / 600000, sample_rate=0.05,
                          total_steps=1000, stages=10, calibration="pld")   # ρ's: the preset's
    eps = epsilon(s.ledger(sample_rate=0.05), delta=1 / 600000, accountant="pld")
    assert eps == pytest.approx(1.2, rel=0.01)
    assert eps <= 1.2 * (1 + 1e-6)                       # never above the target


def test_engine_runs_the_schedule_and_its_ledger_is_the_planned_one():
    # make_private(method=...) applies C_t and z_t each step, and the ledger it writes is the
    # one calibration accounted (one formula for calibration and run: same steps, same σ's)
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    import dpfy

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 5), torch.randint(0, 3, (64,)))
    model = torch.nn.Linear(5, 3)
    sched = DynamicDPSGD(mu0=0.5, total_steps=8, rho_mu=2, rho_c=4, clip0=2.0)
    model, opt, loader = dpfy.make_private(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                           DataLoader(data, batch_size=16), method=sched,
                                           seed=1)
    seen = []
    while opt.step_count < 8:
        for x, y in loader:
            if opt.step_count == 8:
                break
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            seen.append((opt.last_step_info["clip"], opt.last_step_info["noise_multiplier"]))
    assert seen == [(sched.clip(t), sched.noise_multiplier(t)) for t in range(8)]
    assert opt.ledger.to_dict() == sched.ledger(sample_rate=16 / 64, dataset_size=64).to_dict()
