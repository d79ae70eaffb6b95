"""Noise decay schedules (Yu et al. 2019, as reviewed by Monir, Fauzan & Ghinita 2023, §3.1.1):
formulas, per-epoch stepping, calibration, early stop.

Expected σ values are derived by hand in each test from the review's pre-defined schedules
(§3.1.1: time, exponential, step and polynomial decay).
"""

import inspect
import math

import pytest

from dpfy.adaptive import REGISTRY, NoiseDecay, make
from dpfy.adaptive._planned import steps_within_budget
from dpfy.adaptive.base import calibrate_for_run
from dpfy.privacy import epsilon
from dpfy.types import RunFacts, Sampling, StepPlan


def facts(**kw) -> RunFacts:
    """A run of 30 steps, 10 per epoch, at q = 0.1 with target (1, 1e-5): three epochs, as a
    per-epoch schedule needs, at a rate whose PLD is quick to build (a calibration at q = 0.01
    took ~3× the CPU time; no claim here depends on the rate)."""
    base = dict(sampling=Sampling.POISSON, sample_rate=0.1, steps=30, steps_per_epoch=10,
                delta=1e-5, target_epsilon=1.0, accountant="pld", max_grad_norm=1.0)
    return RunFacts(**{**base, **kw})


def sigmas(**kw):
    return list(NoiseDecay(per="step", **kw).noise_multipliers())


def test_registered_in_schedules_file():
    # one method, one file: key "noise_decay" lives in adaptive/schedules.py
    assert inspect.getfile(REGISTRY["noise_decay"]).endswith("adaptive/schedules.py")


def test_time_decay():
    # σ_0/(1+kt), σ_0 = 10, k = 0.5: 10, 10/1.5, 10/2, 10/2.5
    assert sigmas(kind="time", initial=10, rate=0.5, total_steps=4) == pytest.approx(
        [10, 20 / 3, 5, 4])


def test_exponential_decay():
    # σ_0 e^{-kt}, σ_0 = 2, k = 0.1
    assert sigmas(kind="exponential", initial=2, rate=0.1, total_steps=3) == pytest.approx(
        [2, 2 * math.exp(-0.1), 2 * math.exp(-0.2)])


def test_step_decay_is_a_step_function():
    # σ_0 k^⌊t/period⌋, σ_0 = 8, k = 0.5, period = 2: 8 8 4 4 2
    assert sigmas(kind="step", initial=8, rate=0.5, period=2, total_steps=5) == pytest.approx(
        [8, 8, 4, 4, 2])


def test_polynomial_decay_holds_final_after_period():
    # (σ_0−σ_end)(1−t/P)^k + σ_end, σ_0 = 10, σ_end = 2, P = 4, k = 2:
    # t=0: 10; t=1: 8·(3/4)²+2 = 6.5; t=2: 8·¼+2 = 4; t=4: 2; t=6: held at 2
    got = sigmas(kind="polynomial", initial=10, final_ratio=0.2, rate=2, period=4, total_steps=7)
    assert got == pytest.approx([10, 6.5, 4, 8 / 16 + 2, 2, 2, 2])


def test_per_epoch_stepping():
    # per="epoch": u = step // steps_per_epoch, so σ changes every 3 steps
    s = NoiseDecay(kind="time", initial=6, rate=1.0, total_steps=7, per="epoch", steps_per_epoch=3)
    assert list(s.noise_multipliers()) == pytest.approx([6, 6, 6, 3, 3, 3, 2])
    assert len(s.ledger(sample_rate=0.1).step_groups) == 3       # one ledger group per epoch


def test_plan_is_a_pure_function_of_the_step():
    # a pure function of the step: plan(t) computed fresh equals plan(t) after any history
    # (no compounding)
    s = NoiseDecay(kind="exponential", initial=3, rate=0.2, total_steps=10, per="step")
    base = lambda t: StepPlan(step=t, sample_rate=0.1, noise_multiplier=0.0, clip=1.5)
    later = [s.plan(None, base(t)) for t in range(10)][7]
    fresh = NoiseDecay(kind="exponential", initial=3, rate=0.2, total_steps=10,
                       per="step").plan(None, base(7))
    assert later == fresh
    assert fresh.noise_multiplier == pytest.approx(3 * math.exp(-1.4)) and fresh.clip == 1.5
    with pytest.raises(ValueError, match="total_steps"):
        s.plan(None, base(10))


@pytest.mark.parametrize("kw, name", [
    (dict(kind="time", rate=-0.1), "rate"),                     # k < 0
    (dict(kind="exponential", rate=0.0), "rate"),
    (dict(kind="step", rate=1.5), "rate"),                      # step needs 0 < k < 1
    (dict(kind="polynomial", rate=1.0, final_ratio=1.2), "final_ratio"),   # σ_end > σ_0
    (dict(kind="polynomial", rate=1.0, final_ratio=0.0), "final_ratio"),
    (dict(kind="time", rate=1.0, calibration="gdp"), "calibration"),  # GDP only opted in
    (dict(kind="time", rate=1.0, calibration="moments"), "calibration"),
    (dict(kind="linear", rate=1.0), "kind"),
    (dict(kind="time", rate=1.0, per="batch"), "per"),
])
def test_bad_parameters_are_clear_errors(kw, name):
    with pytest.raises(ValueError, match=f"^{name} must be .*got {name} = "):
        NoiseDecay(initial=10.0, total_steps=5, **kw)


def test_scaled_keeps_the_shape():
    s = NoiseDecay(kind="polynomial", initial=1.0, final_ratio=0.25, rate=1.0, period=3,
                   total_steps=5, per="step")
    assert list(s.scaled(4.0).noise_multipliers()) == pytest.approx(
        list(4.0 * s.noise_multipliers()))


@pytest.mark.parametrize("kind, opts", [("constant", {}), ("time", {"rate": 1.0}),
                                        ("exponential", {"rate": 0.3}),
                                        ("polynomial", {"rate": 1.0, "final_ratio": 0.4})])
def test_calibrated_schedule_spends_the_target(kind, opts):
    # the whole run's PLD ε equals the target within 1 % (issue 5), never above it
    s = calibrate_for_run(make("noise_decay", kind=kind, **opts), facts())
    eps = epsilon(s.ledger(sample_rate=0.1), delta=1e-5, accountant="pld")
    assert eps == pytest.approx(1.0, rel=0.01) and eps <= 1.0 + 1e-9
    assert s.calibrated_for == facts() and s.total_steps == 30


def test_the_gdp_calibration_is_an_explicit_opt_in():
    # the paper's CLT (an approximation) only with approximate=True; its rigorous ε may exceed
    # the target, which the ledger (by PLD) then says
    with pytest.raises(ValueError, match="calibration must be 'pld' or 'rdp' unless "
                                         "approximate=True"):
        make("noise_decay", kind="time", rate=1.0, calibration="gdp")
    s = calibrate_for_run(make("noise_decay", kind="time", rate=1.0, calibration="gdp",
                     approximate=True), facts())
    rigorous = calibrate_for_run(make("noise_decay", kind="time", rate=1.0), facts())
    assert s.initial != rigorous.initial


def test_per_epoch_default_and_the_polynomial_period_from_the_run():
    # period unset: polynomial decays over the run's units, epochs 0..2, so period = 2
    s = calibrate_for_run(make("noise_decay", kind="polynomial", rate=1.0, final_ratio=0.5, initial=50.0),
                facts(target_epsilon=None))
    assert s.per == "epoch" and s.period == 2 and s.steps_per_epoch == 10
    assert s.noise_multiplier(29) == pytest.approx(25.0)                      # σ_end at the end


def test_a_calibrated_schedule_needs_the_runs_budget():
    # σ_0 unset: it is solved for the run's target ε, so a run without one is refused
    with pytest.raises(ValueError, match="target_epsilon must be given for method 'noise_decay'"):
        calibrate_for_run(make("noise_decay", kind="time", rate=1.0), facts(target_epsilon=None))
    with pytest.raises(ValueError, match="sampling must be 'poisson' for method 'noise_decay'"):
        calibrate_for_run(make("noise_decay", kind="time", rate=1.0), facts(sampling=Sampling.SHUFFLE))
    with pytest.raises(ValueError, match="uncalibrated"):    # used before calibration
        make("noise_decay", kind="time", rate=1.0).plan(None, StepPlan(0, 0.01, 1.0, 1.0))


def test_early_stopping_at_target_epsilon():
    # review Table 8 "stopping criterion ε": an explicit σ_0 stops at the last step within ε
    sched = NoiseDecay(kind="time", initial=3.0, rate=0.5, total_steps=400, per="epoch",
                       steps_per_epoch=50)
    stop = steps_within_budget(sched, target_epsilon=1.0, delta=1e-5, sample_rate=0.02,
                               accountant="rdp")
    full = sched.ledger(sample_rate=0.02)
    assert 0 < stop < 400
    assert epsilon(full.prefix(stop), delta=1e-5) <= 1.0 < epsilon(full.prefix(stop + 1),
                                                                     delta=1e-5)
    via_make = calibrate_for_run(make("noise_decay", kind="time", initial=3.0, rate=0.5),
                       facts(sample_rate=0.02, steps=400, steps_per_epoch=50, accountant="rdp"))
    assert via_make.total_steps == stop


def test_the_defaults_run():
    # `dpfy train --method noise_decay` with no options: the defaults must calibrate and decay.
    # Polynomial k = 1 with final_ratio 0.5 and period = the run's last epoch (2 here): σ_u =
    # σ_0·(1 − u/2·(1 − 0.5)) = σ_0, 0.75·σ_0, 0.5·σ_0 for the 3 epochs of 10 steps.
    s = REGISTRY["noise_decay"]().calibrate(facts())
    got = list(s.noise_multipliers())
    assert len(got) == 30
    assert [got[0] / got[0], got[10] / got[0], got[29] / got[0]] == pytest.approx(
        [1.0, 0.75, 0.5])
