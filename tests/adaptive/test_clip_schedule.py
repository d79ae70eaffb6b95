"""Clip-norm schedules: Eq. (14) of Dynamic DP-SGD (anonymous submission, under review), and
step / function variants."""

import inspect

import pytest

from dpfy.adaptive import REGISTRY, ClipSchedule, DynamicDPSGD
from dpfy.types.plan import StepPlan


def test_registered_in_clip_schedules_file():
    assert inspect.getfile(REGISTRY["clip_schedule"]).endswith("adaptive/clip_schedules.py")


def test_exponential_matches_sensitivity_decay_eq14():
    # Eq. (14): C_t = C_0 ρ_c^{-t/T}, t = step+1; with r = 1/ρ_c, period = T, offset 1
    T, rho_c = 20, 4.0
    clip = ClipSchedule(kind="exponential", initial=2.0, rate=1 / rho_c, period=T, offset=1)
    dyn = DynamicDPSGD(mu0=1.0, total_steps=T, rho_c=rho_c, clip0=2.0)
    for step in range(T):
        assert clip.clip(step) == pytest.approx(dyn.clip(step), rel=1e-12)
    assert clip.clip(T - 1) == pytest.approx(0.5)        # C_T = C_0/ρ_c


def test_step_and_function_kinds_and_plan():
    step = ClipSchedule(kind="step", initial=1.0, rate=0.5, period=3)
    assert [step.clip(s) for s in range(7)] == [1, 1, 1, 0.5, 0.5, 0.5, 0.25]
    fn = ClipSchedule(kind="function", fn=lambda s: 1.0 + s)
    p = fn.plan(None, StepPlan(step=4, sample_rate=0.1, noise_multiplier=1.3, clip=9.0))
    assert (p.clip, p.noise_multiplier) == (5.0, 1.3)     # σ untouched


@pytest.mark.parametrize("kw, name", [(dict(kind="exponential", rate=1.5), "rate"),
                                      (dict(kind="function"), "fn"),
                                      (dict(kind="cosine"), "kind"),
                                      (dict(kind="step", initial=0.0), "initial")])
def test_bad_parameters_are_clear_errors(kw, name):
    with pytest.raises(ValueError, match=f"^{name} must be"):
        ClipSchedule(**kw)
