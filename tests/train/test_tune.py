"""Hyperparameter tuning under one budget (issue 11; digest 002 §3.3): ``run_grid``/``dpfy tune``.

The grid's ε is checked with dp_accounting directly on the composed events of every run's
ledger (tests/ledger_events.py), never with dpfy's accountants. `dpfy tune`'s command-line
tests: tests/cli/test_tune_cli.py.
"""

import json

import numpy as np
import pytest

import torch

from dpfy.data import load_dataset
from dpfy.models import build_model
from dpfy.privacy.ledger import Ledger
from dpfy.train import TrainConfig
from dpfy.train.grid import parse_axis, run_grid
from ledger_events import dp_accounting_epsilon
from ledger_events import grid_ledger as _composed

QUIET = dict(echo=lambda s: None)
BASE = dict(dataset="digits", model="logreg", epochs=1, batch_size=128, clip=1.0, seed=3,
            threads=1, accountant="rdp")


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    out = tmp_path_factory.mktemp("tune") / "winner"
    cfg = TrainConfig(**BASE, epsilon=2.0)
    result = run_grid(cfg, [parse_axis("lr=logspace:-1:1:3")], out=out, **QUIET)
    grid = json.loads((out / "grid.json").read_text())
    return result, grid, json.loads((out / "privacy_report.json").read_text())


def test_grid_spends_the_target_by_dp_accounting_on_all_runs_composed(tuned):
    result, grid, _ = tuned
    assert len(grid["ledgers"]) == 3
    composed = _composed(grid)
    assert composed.num_steps == 3 * Ledger.from_dict(grid["ledgers"][0]).num_steps
    eps = dp_accounting_epsilon(composed, result.delta, "rdp")
    assert result.epsilon == pytest.approx(eps, rel=1e-6)
    # σ is the smallest on a 1e-3 grid that keeps the three runs within ε = 2.
    assert eps <= 2.0 * (1 + 1e-9)
    assert eps == pytest.approx(2.0, rel=5e-3)
    # One run alone spends less: each run gets the budget of one run out of three composed.
    one = dp_accounting_epsilon(Ledger.from_dict(grid["ledgers"][0]), result.delta, "rdp")
    assert all(r.epsilon == pytest.approx(one, rel=1e-6) for r in result.runs)
    assert one < eps


def test_report_holds_the_tuning_statement_and_the_table(tuned):
    result, grid, report = tuned
    assert report["tuning"]["epsilon"] == pytest.approx(result.epsilon)
    assert "3 runs composed" in report["tuning"]["method"]
    (section,) = [s for s in report["sections"] if s["title"] == "Tuning grid"]
    rows = [line for line in section["lines"] if line.startswith("| ") and "run |" not in line]
    assert len(rows) == 3 and sum("(winner)" in r for r in rows) == 1
    md = (result.out / "privacy_report.md").read_text()
    assert "## Tuning grid" in md and "- **Tuning:** (" in md
    assert "held out of the training data" in report["public_data"]
    # The lr values are 002's logspace points (np.logspace, endpoints included).
    assert [r["settings"]["lr"] for r in grid["runs"]] == list(np.logspace(-1, 1, 3))
    assert "seed" not in json.dumps(grid)


def test_the_grid_s_epsilon_and_delta_are_stated_rounded_up(tuned):
    # A stated (ε, δ) is never smaller than the one computed (tests/privacy/test_stated_rounding.py)
    import re
    result, _, _ = tuned
    md = (result.out / "privacy_report.md").read_text()
    (eps, delta), = re.findall(r"The grid's ε = ([0-9.e+-]+) at δ = ([0-9.e+-]+) ", md)
    (eps_t, delta_t), = re.findall(r"\*\*Tuning:\*\* \(([0-9.e+-]+), ([0-9.e+-]+)\)", md)
    for e, d in ((eps, delta), (eps_t, delta_t)):
        assert float(e) >= result.epsilon and float(d) >= result.delta, (e, d, result)


def test_winner_is_the_best_validation_metric(tuned):
    result, grid, _ = tuned
    best = max(grid["runs"], key=lambda r: r["metric"])
    assert grid["winner"] == best["index"] == result.winner.index
    rows = json.loads((result.out / "metrics.json").read_text())
    assert rows[-1]["test_acc"] == pytest.approx(best["metric"])   # on the validation split
    # The published model on the real test split (reported, not selected on), recomputed here.
    data = load_dataset("digits")
    model = build_model("logreg", input_shape=data.input_shape, num_classes=data.num_classes)
    model.load_state_dict(torch.load(result.out / "model.pt", weights_only=True))
    x, y = data.test.tensors
    with torch.no_grad():
        acc = float((model(x).argmax(1) == y).double().mean())
    assert grid["winner_on_test"]["accuracy"] == pytest.approx(acc)
    assert result.winner_on_test["examples"] == len(y)
    assert not result.out.with_name(result.out.name + ".grid").exists()


def test_interrupted_grid_is_not_silently_rerun(tmp_path):
    (tmp_path / "w.grid").mkdir()
    with pytest.raises(ValueError, match="spends more"):
        run_grid(TrainConfig(**BASE), [parse_axis("lr=1")], out=tmp_path / "w", **QUIET)
