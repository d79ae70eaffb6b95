"""Contract every schedule from ``make_schedule`` must keep (STYLE.md R5, R9, R10).

For each name, on a tiny model trained through ``make_private(schedule=...)``:
- every step's release is in the ledger with the σ_t the schedule planned for that step, and
  the engine applied the planned C_t (R2/R9: the ledger records the truth);
- ``plan(step=t)`` is a pure function of the step and the state, also after the state went
  through a checkpoint round trip (R5);
- the budget guard stops the run after the schedule's ``total_steps``.
"""

from __future__ import annotations

import io

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from dpfy.errors import BudgetExhausted
from dpfy.adaptive import make_schedule
from dpfy.adaptive.factory import SCHEDULE_NAMES
from dpfy.types.plan import StepPlan

N, BATCH, STEPS = 200, 20, 4
Q = BATCH / N
OPTIONS = {                                  # the smallest options each name needs
    "time": dict(rate=0.5, per="step"), "exponential": dict(rate=0.3, per="step"),
    "step": dict(rate=0.5, period=2, per="step"),
    "polynomial": dict(rate=1.0, final_ratio=0.5, per="step"),
    "plateau": dict(initial=2.0),
    "growing_mu": dict(stages=2), "sensitivity_decay": dict(stages=2), "dynamic": dict(stages=2),
}


def _run(name: str):
    torch.manual_seed(0)
    sched = make_schedule(name, target_epsilon=4.0, delta=1e-5, sample_rate=Q,
                          total_steps=STEPS, steps_per_epoch=N // BATCH, max_grad_norm=1.0,
                          accountant="rdp", **OPTIONS.get(name, {}))
    ds = TensorDataset(torch.randn(N, 6), torch.randint(0, 2, (N,)))
    model = nn.Sequential(nn.Linear(6, 4), nn.Tanh(), nn.Linear(4, 2))
    model, opt, loader = dpfy.make_private(
        model, torch.optim.SGD(model.parameters(), lr=0.1), DataLoader(ds, batch_size=BATCH),
        schedule=sched, max_grad_norm=1.0, seed=1, accountant="rdp")
    return sched, opt, loader, model


@pytest.mark.parametrize("name", sorted(SCHEDULE_NAMES))
def test_schedule_contract(name):
    sched, opt, loader, model = _run(name)
    planned, applied = [], []
    batches = iter(loader)
    for t in range(STEPS):
        x, y = next(batches)
        plan = sched.plan(opt.schedule_state, StepPlan(t, Q, 0.0, 1.0))
        # R5: the same step and state give the same plan, also after a checkpoint round trip.
        buf = io.BytesIO()
        torch.save(opt.state_dict(), buf)
        buf.seek(0)
        restored = torch.load(buf, weights_only=False)["method_state"]
        assert sched.plan(restored, StepPlan(t, Q, 0.0, 1.0)) == plan
        assert sched.plan(opt.schedule_state, StepPlan(t, Q, 0.0, 1.0)) == plan
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        planned.append(plan.noise_multiplier)
        applied.append(opt.last_step_info["clip"] == pytest.approx(plan.clip))
    # Every release is in the ledger, with the σ_t that was planned for its step.
    recorded = [r.noise_multiplier for g in opt.ledger.groups for _ in range(g.count)
                for r in g.releases if r.mechanism == "gradient"]
    assert opt.ledger.num_steps == STEPS and recorded == pytest.approx(planned)
    assert all(applied) and all(s > 0 for s in planned)
    # The budget guard: the schedule planned STEPS steps; one more is refused.
    x, y = next(batches)
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    with pytest.raises(BudgetExhausted, match="max_steps"):
        opt.step()
