"""Fay et al.'s data-independent PUR schedule: the shape is the derived gradient-norm bound,
the step size is 1/(2M), and the calibrated run spends the target ε by dp_accounting's own
RDP accountant over the σ_t it plans."""

import itertools
import math

import dp_accounting
import pytest
from dp_accounting.rdp import RdpAccountant

from dpfy.adaptive import REGISTRY, make
from dpfy.adaptive.base import calibrate_for_run
from dpfy.types import RunFacts, Sampling, StepPlan

N, BATCH, EPOCHS, LR = 200, 20, 6, 0.1
Q, STEPS, SPE = BATCH / N, EPOCHS * N // BATCH, N // BATCH


def _facts(lr=LR, target=4.0):
    return RunFacts(sampling=Sampling.POISSON, sample_rate=Q, steps=STEPS, dataset_size=N,
                    steps_per_epoch=SPE, delta=1e-5, target_epsilon=target, accountant="rdp",
                    max_grad_norm=1.0,
                    inner_hyperparameters=None if lr is None else {"lr": lr})  # fmt: skip


def test_registered_and_listed():
    assert "pur" in REGISTRY
    from dpfy.cli.methods import markdown

    assert "`pur`" in markdown() and "Hong et al." in markdown()


def test_convex_shape_is_the_derived_bound():
    # GD at η = 1/(2M) on a convex M-smooth F: ‖∇F(θ_0)‖ ≤ M·D and
    # ‖∇F(θ_u)‖ ≤ sqrt(2M · M D²/u) = √2·M·D/√u, so G_u/G_0 = min(1, √(2/u))
    # (the shape does not depend on the target; ε = 1 calibrates larger σ's, whose RDP is quicker)
    s = calibrate_for_run(make("pur", smoothness=3.0), _facts(target=1.0))
    expected = [min(1.0, math.sqrt(2 / u)) if u else 1.0 for u in range(EPOCHS)]
    sig = s.noise_multipliers()
    for t in range(STEPS):
        assert sig[t] / sig[0] == pytest.approx(expected[t // SPE], rel=1e-12)


def test_pl_shape_is_the_derived_contraction():
    # descent lemma at η = 1/(2M): gap_{u+1} ≤ (1 − 3μ/(4M)) gap_u; ‖∇F‖² ≤ 2M·gap
    m, mu = 4.0, 1.0
    s = calibrate_for_run(make("pur", smoothness=m, bound="pl", pl_constant=mu),
                          _facts(target=1.0))  # ε = 1, as above
    sig = s.noise_multipliers()
    for t in range(STEPS):
        assert sig[t] / sig[0] == pytest.approx((1 - 0.75 * mu / m) ** ((t // SPE) / 2),
                                                rel=1e-12)  # fmt: skip


@pytest.mark.parametrize(
    "options", [dict(smoothness=3.0), dict(smoothness=4.0, bound="pl", pl_constant=2.0)]
)
def test_calibrated_to_the_target_by_dp_accounting(options):
    s = calibrate_for_run(make("pur", **options), _facts())
    acc = RdpAccountant()
    # the planned σ_t as runs of equal σ (one per epoch), each a self-composed step: RDP adds
    # over composition, so k equal steps are k times one (computed once, not k times)
    for sigma, run in itertools.groupby(s.noise_multipliers()):
        step = dp_accounting.PoissonSampledDpEvent(Q, dp_accounting.GaussianDpEvent(sigma))
        acc.compose(dp_accounting.SelfComposedDpEvent(step, len(list(run))))
    eps = acc.get_epsilon(1e-5)
    # the scale search stops within its tolerance below the target
    assert eps <= 4.0 * (1 + 1e-6) and eps == pytest.approx(4.0, rel=0.02)


def test_step_size_is_one_over_two_m():
    s = calibrate_for_run(make("pur", smoothness=5.0), _facts())
    plan = s.plan(None, StepPlan(0, Q, 1.0, 1.0))
    assert LR * plan.lr_scale == pytest.approx(1 / (2 * 5.0), rel=1e-12)
    kept = calibrate_for_run(make("pur", smoothness=5.0, step_size="optimizer"), _facts())
    assert kept.plan(None, StepPlan(0, Q, 1.0, 1.0)).lr_scale == 1.0


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(smoothness=0.0), "smoothness must be > 0"),
        (dict(smoothness=1.0, bound="pl"), "pl_constant must be in"),
        (dict(smoothness=1.0, bound="pl", pl_constant=2.0), "pl_constant must be in"),
        (dict(smoothness=1.0, pl_constant=0.5), "pl_constant must be unset"),
        (dict(smoothness=1.0, bound="strong"), "bound must be one of"),
    ],
)
def test_refusals(options, message):
    with pytest.raises(ValueError, match=message):
        make("pur", **options)


def test_refuses_pur_step_without_a_learning_rate():
    with pytest.raises(ValueError, match="optimizer lr must be a positive number"):
        calibrate_for_run(make("pur", smoothness=1.0), _facts(lr=None))
