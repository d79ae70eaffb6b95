"""``dpfy explain``: one row per layer with its rule file and route (one rule per layer type,
fallbacks reported). The command and its one-line refusals: tests/cli/test_explain_cli.py."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpfy
from dpfy.cli.explain import explain_model, format_table


def test_explain_routes_at_size():
    model = nn.Sequential(nn.Conv2d(1, 16, 8, stride=2, padding=3), nn.Flatten(),
                          nn.Linear(16 * 14 * 14, 10), nn.PReLU())
    rows = explain_model(model, example=torch.randn(4, 1, 28, 28))
    by = {r["module"]: r for r in rows}
    # conv: L=196 positions, D=64, C_out=16: L·(D+C_out) > D·C_out -> per-sample
    assert by["0"]["route"] == "per-sample" and by["0"]["rule"].endswith("rules/conv.py")
    assert by["2"]["route"] == "ghost"  # T = 1: ghost norm ‖a‖·‖g‖
    assert by["3"]["route"] == "vmap" and "no layer rule" in by["3"]["why"]
    assert all(p.requires_grad for p in model.parameters())  # explain leaves the model as is


def test_private_optimizer_reports_planned_routes():
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
    ds = TensorDataset(torch.randn(16, 1, 8, 8), torch.randint(0, 2, (16,)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt, dl = dpfy.make_private(model, opt, DataLoader(ds, batch_size=8),
                                       noise_multiplier=1.0, seed=0)
    for x, y in dl:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    rows = opt.grads.explain_planned()  # for the privacy report: no training batch's route
    assert {r["route"] for r in rows} == {"ghost or per-sample, by size per batch"}
    assert opt.grads.explain() == rows  # captures are dropped after each step
    assert "dpfy/grads/rules/linear.py" in format_table(rows)
