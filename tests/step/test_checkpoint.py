"""Resuming from a checkpoint gives bit-identical next steps (determinism: a seeded run is
reproducible, and a checkpoint holds everything needed to resume)."""

from __future__ import annotations

import io
from dataclasses import dataclass, replace

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from dpfy.adaptive.base import Method


@dataclass(frozen=True)
class CountState:
    updates: int


class Decay(Method):
    """σ_t = 2·0.9^(number of updates seen): its state must survive the checkpoint."""

    sets = frozenset({"noise_multiplier"})

    def init(self):
        return CountState(0)

    def plan(self, state, plan):
        return replace(plan, noise_multiplier=2.0 * 0.9 ** state.updates)

    def update(self, state, released):
        return CountState(state.updates + 1)


def build(seed, schedule=None, opt_cls=torch.optim.Adam):
    torch.manual_seed(123)
    ds = TensorDataset(torch.randn(48, 6), torch.randint(0, 3, (48,)))
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    opt = opt_cls(model.parameters(), lr=0.05)
    kwargs = {"method": schedule} if schedule else {"noise_multiplier": 1.0}
    return dpfy.make_private(model, opt, DataLoader(ds, batch_size=8), seed=seed,
                             max_physical_batch_size=3, **kwargs)


def run(model, opt, dl, logical_steps):
    it = iter(dl)
    done = 0
    while done < logical_steps:
        x, y = next(it)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        done += dl.cursor.last


@pytest.mark.parametrize("schedule", [None, Decay()])
@pytest.mark.parametrize("opt_cls", [torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD])
def test_resume_is_bit_identical(schedule, opt_cls):
    model, opt, dl = build(seed=11, schedule=schedule, opt_cls=opt_cls)
    run(model, opt, dl, 3)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, buf)
    run(model, opt, dl, 2)
    want = [p.detach().clone() for p in model.parameters()]

    model2, opt2, dl2 = build(seed=999, schedule=schedule, opt_cls=opt_cls)  # other seed
    buf.seek(0)
    ckpt = torch.load(buf, weights_only=False)
    model2.load_state_dict(ckpt["model"])
    opt2.load_state_dict(ckpt["optimizer"])
    assert opt2.seed == 11 and opt2.step_count == 3
    run(model2, opt2, dl2, 2)
    for a, b in zip(want, model2.parameters()):
        assert torch.equal(a, b)
    assert opt2.ledger.to_dict() == opt.ledger.to_dict()
    if schedule is not None:
        assert opt2.method_state == opt.method_state == CountState(5)


def test_seed_none_is_secure_and_resumes_its_ledger():
    # seed=None: no seed exists to publish and two runs draw different noise. A resumed secure
    # run continues the ledger and step count (bit-identical resumes need a seed).
    model_a, opt_a, dl_a = build(seed=None)
    model_b, opt_b, dl_b = build(seed=None)
    assert opt_a.seed is None and opt_a.state_dict()["seed"] is None
    run(model_a, opt_a, dl_a, 2)
    run(model_b, opt_b, dl_b, 2)
    assert any(not torch.equal(a, b) for a, b in zip(model_a.parameters(),
                                                      model_b.parameters()))
    buf = io.BytesIO()
    torch.save({"model": model_a.state_dict(), "optimizer": opt_a.state_dict()}, buf)
    model_c, opt_c, dl_c = build(seed=None)
    buf.seek(0)
    ckpt = torch.load(buf, weights_only=False)
    model_c.load_state_dict(ckpt["model"])
    opt_c.load_state_dict(ckpt["optimizer"])
    run(model_c, opt_c, dl_c, 2)
    assert opt_c.step_count == 4 and opt_c.ledger.num_steps == 4
