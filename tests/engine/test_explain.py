"""``dpfy explain``: one row per layer with its rule file and route (STYLE.md R7)."""

from __future__ import annotations

import torch
from torch import nn

from dpfy.cli import main
from dpfy.cli.explain import explain_model


def test_explain_routes_at_size():
    model = nn.Sequential(nn.Conv2d(1, 16, 8, stride=2, padding=3), nn.Flatten(),
                          nn.Linear(16 * 14 * 14, 10), nn.PReLU())
    rows = explain_model(model, example=torch.randn(4, 1, 28, 28))
    by = {r["module"]: r for r in rows}
    # conv: L=196 positions, D=64, C_out=16: L·(D+C_out) > D·C_out -> per-sample
    assert by["0"]["engine"] == "per-sample" and by["0"]["rule"].endswith("rules/conv.py")
    assert by["2"]["engine"] == "ghost"  # T = 1: ghost norm ‖a‖·‖g‖
    assert by["3"]["engine"] == "vmap" and "no layer rule" in by["3"]["why"]
    assert all(p.requires_grad for p in model.parameters())  # explain leaves the model as is


def test_cli_explain(capsys):
    assert main(["explain", "tanh_cnn", "--batch-size", "2"]) == 0
    out = capsys.readouterr().out
    assert "| 0 | Conv2d | 1040 | dpfy/grads/rules/conv.py |" in out
