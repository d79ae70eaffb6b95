"""Contract every noise schedule keeps (one shared contract test that every implementation
inherits); schedules are methods.

Each case is one of the former schedule names, now a registered method with options, built
by ``dpfy.adaptive.make`` and calibrated by ``make_private`` for a tiny run. On it:
- every step's release is in the ledger with the σ_t the schedule planned for that step, and
  the step applied the planned C_t (every release is an accounting event built where it
  happens, and calibration builds the very ledger the run writes: the ledger records the truth);
- ``plan(step=t)`` is a pure function of the step and the state, also after the state went
  through a checkpoint round trip (nothing that changes during training is captured in a
  closure or compounded from a mutable attribute);
- the budget guard stops the run after the planned steps.
"""

from __future__ import annotations

import io

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from dpfy.adaptive import make
from dpfy.adaptive.base import calibrate_for_run
from dpfy.errors import BudgetExhausted
from dpfy.privacy import epsilon
from dpfy.types import RunFacts, Sampling, StepPlan

N, BATCH, STEPS = 200, 20, 4
Q = BATCH / N
TARGET = 1.0   # ε; at 4 the calibrated σ's are smaller and their RDP ~1.5-3× slower to compute
CASES = {                          # former schedule name -> (method, the smallest options)
    "constant": ("noise_decay", dict(kind="constant")),
    "time": ("noise_decay", dict(kind="time", rate=0.5, per="step")),
    "exponential": ("noise_decay", dict(kind="exponential", rate=0.3, per="step")),
    "step": ("noise_decay", dict(kind="step", rate=0.5, period=2, per="step")),
    "polynomial": ("noise_decay", dict(kind="polynomial", rate=1.0, final_ratio=0.5,
                                       per="step")),
    "plateau": ("plateau", dict(initial=2.0)),
    "vanilla": ("dynamic", dict(preset="vanilla", stages=2)),
    "growing_mu": ("dynamic", dict(preset="growing_mu", stages=2)),
    "sensitivity_decay": ("dynamic", dict(preset="sensitivity_decay", stages=2)),
    "dynamic": ("dynamic", dict(preset="dynamic", stages=2)),
}


def _run(case: str):
    torch.manual_seed(0)
    name, options = CASES[case]
    ds = TensorDataset(torch.randn(N, 6), torch.randint(0, 2, (N,)))
    model = nn.Sequential(nn.Linear(6, 4), nn.Tanh(), nn.Linear(4, 2))
    model, opt, loader = dpfy.make_private(
        model, torch.optim.SGD(model.parameters(), lr=0.1), DataLoader(ds, batch_size=BATCH),
        method=make(name, **options), target_epsilon=TARGET, target_delta=1e-5, max_steps=STEPS,
        max_grad_norm=1.0, seed=1, accountant="rdp")
    return opt.method, opt, loader, model


@pytest.mark.parametrize("case", sorted(CASES))
def test_schedule_contract(case):
    sched, opt, loader, model = _run(case)
    planned, applied = [], []
    batches = iter(loader)
    for t in range(STEPS):
        x, y = next(batches)
        plan = sched.plan(opt.method_state, StepPlan(t, Q, 0.0, 1.0))
        # Pure plan: the same step and state give the same plan, also after a checkpoint round trip.
        buf = io.BytesIO()
        torch.save(opt.state_dict(), buf)
        buf.seek(0)
        restored = torch.load(buf, weights_only=False)["method_state"]
        assert sched.plan(restored, StepPlan(t, Q, 0.0, 1.0)) == plan
        assert sched.plan(opt.method_state, StepPlan(t, Q, 0.0, 1.0)) == plan
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        planned.append(plan.noise_multiplier)
        applied.append(opt.last_step_info["clip"] == pytest.approx(plan.clip))
    # Every release is in the ledger, with the σ_t that was planned for its step.
    recorded = [r.noise_multiplier for g in opt.ledger.step_groups for _ in range(g.count)
                for r in g.releases if r.mechanism == "gradient"]
    assert opt.ledger.num_steps == STEPS and recorded == pytest.approx(planned)
    assert all(applied) and all(s > 0 for s in planned)
    # The budget guard: the run planned STEPS steps; one more is refused.
    x, y = next(batches)
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    with pytest.raises(BudgetExhausted, match="max_steps"):
        opt.step()


@pytest.mark.parametrize("case", sorted(c for c in CASES if CASES[c][0] != "plateau"))
def test_calibrated_schedule_spends_at_most_the_target(case):
    # One formula: calibrate() solves the schedule's scale for the run's target by its
    # accountant, and
    # the ledger the run will write (the step's own step_releases) spends at most that target
    name, options = CASES[case]
    facts = RunFacts(sampling=Sampling.POISSON, sample_rate=Q, steps=STEPS, dataset_size=N,
                     steps_per_epoch=N // BATCH, delta=1e-5, target_epsilon=TARGET,
                     accountant="rdp", max_grad_norm=1.0)
    sched = calibrate_for_run(make(name, **options), facts)
    eps = epsilon(sched.ledger(sample_rate=Q), delta=1e-5, accountant="rdp")
    assert eps <= TARGET * (1 + 1e-6) and eps == pytest.approx(TARGET, rel=0.05)
