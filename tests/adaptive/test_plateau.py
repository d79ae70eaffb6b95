"""Validation-plateau noise decay (Yu et al. 2019, as reviewed by Monir, Fauzan & Ghinita 2023,
§3.1.1; the printed rule read as σ_{e+1} = kσ_e when the moving-average validation accuracy
improves by at most the threshold)."""

import inspect

import pytest

from dpfy.adaptive import REGISTRY, PlateauNoiseDecay
from dpfy.adaptive import make as make_method
from dpfy.adaptive.base import calibrate_for_run
from dpfy.privacy import Ledger, epsilon
from dpfy.types import RunFacts, Sampling, StepPlan


def make(**kw):
    args = dict(initial=4.0, factor=0.5, threshold=0.01, min_noise_multiplier=1.0,
                total_steps=100)
    return PlateauNoiseDecay(**{**args, **kw})


def test_registered_in_its_own_file():
    assert inspect.getfile(REGISTRY["plateau"]).endswith("adaptive/plateau.py")


def test_decays_only_on_a_plateau_and_respects_the_floor():
    s = make()
    st = s.init()
    # gains vs S_0 = 0: 0.5 (no decay); 0.6-0.5 = 0.1 (no); 0.605-0.6 = 0.005 ≤ 0.01 (decay 4→2)
    for metric, sigma in [(0.5, 4.0), (0.6, 4.0), (0.605, 2.0), (0.60, 1.0), (0.59, 1.0)]:
        st = s.observe(st, val_metric=metric)
        assert st.noise_multiplier == sigma            # last two: 2→1, then the floor σ_min = 1
    assert st.decays == 2 and len(st.metrics) == 5
    plan = s.plan(st, StepPlan(step=3, sample_rate=0.1, noise_multiplier=0.0, clip=1.0))
    assert plan.noise_multiplier == 1.0


def test_moving_average_smooths_one_bad_evaluation():
    # window 2: metrics .5,.7,.68 -> averages .5,.6,.69: gains .5,.1,.09 > .01, no decay,
    # although the raw metric fell from .7 to .68
    s = make(window=2)
    st = s.init()
    for m in (0.5, 0.7, 0.68):
        st = s.observe(st, val_metric=m)
    assert st.noise_multiplier == 4.0


def test_calibration_raises_and_names_the_budget_guard():
    # calibration must build the run's own ledger: it depends on released data, so no σ_0 can
    # be solved for a target ε
    with pytest.raises(ValueError, match="initial must be given .*budget guard"):
        make_method("plateau")
    with pytest.raises(ValueError, match="initial must be given .*budget guard"):
        PlateauNoiseDecay(factor=0.5)
    assert not make_method("plateau", initial=2.0).is_data_independent()


def test_built_by_name_with_the_runs_steps():
    # the former make_schedule("plateau", initial=3.0, factor=0.8): defaults k = 0.9 → 0.8
    # given, δ_val = 0, σ_min = σ_0/4; the horizon is the run's steps
    facts = RunFacts(sampling=Sampling.POISSON, sample_rate=0.01, steps=300, delta=1e-5,
                     target_epsilon=2.0)
    s = calibrate_for_run(make_method("plateau", initial=3.0, factor=0.8), facts)
    assert (s.initial, s.factor, s.threshold, s.min_noise_multiplier, s.total_steps) == (
        3.0, 0.8, 0.0, 0.75, 300)
    assert s.implements("observe") and "noise_multiplier" in s.sets


def test_worst_case_ledger_bounds_any_run():
    s = make()
    worst = s.worst_case_ledger(sample_rate=0.05)
    # a run that never decays spends less than the worst case (every step at σ_min)
    never = Ledger.homogeneous(sample_rate=0.05, noise_multiplier=4.0, steps=100)
    assert epsilon(never, delta=1e-5) < epsilon(worst, delta=1e-5)


@pytest.mark.parametrize("kw, name", [(dict(factor=1.0), "factor"),
                                      (dict(threshold=-1), "threshold"),
                                      (dict(min_noise_multiplier=5.0), "min_noise_multiplier"),
                                      (dict(window=0), "window")])
def test_bad_parameters_are_clear_errors(kw, name):
    with pytest.raises(ValueError, match=f"^{name} must be"):
        make(**kw)


def test_trainer_feeds_the_metric_through_the_optimizer():
    # the documented hook: optimizer.observe(val_metric=...) after each public evaluation
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    import dpfy

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,)))
    model = torch.nn.Linear(4, 2)
    sched = make(total_steps=4)
    model, opt, loader = dpfy.make_private(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                           DataLoader(data, batch_size=16), method=sched,
                                           seed=3)
    sigmas = []
    for metric in (0.5, 0.5):                       # 2nd evaluation: gain 0 ≤ δ_val -> decay
        for x, y in loader:                         # 2 logical steps per epoch
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            sigmas.append(opt.last_step_info["noise_multiplier"])
        opt.observe(val_metric=metric)
    assert sigmas == [4.0, 4.0, 4.0, 4.0] and opt.method_state.noise_multiplier == 2.0
