"""`dpfy tune` (issue 11; digest 002 §3.3) on the command line: a grid with a public validation
split, selection on the loss and a method option, and its refusals in one line. The grid's ε is
checked with dp_accounting on the composed events of every run's ledger (tests/ledger_events.py),
never with dpfy's accountants. (``run_grid``'s tests: tests/train/test_tune.py.)
"""

import json

import pytest

from dpfy.cli import main
from ledger_events import dp_accounting_epsilon
from ledger_events import grid_ledger as _composed


def test_cli_public_test_split_loss_and_method_option(tmp_path, capsys):
    out = tmp_path / "w"
    code = main(["tune", "--dataset", "digits", "--model", "logreg", "--epochs", "1",
                 "--batch-size", "256", "--threads", "1", "--noise-multiplier", "2",
                 "--accountant", "rdp", "--method", "oso", "--lr", "0.5",
                 "--grid", "oso.rule=sign,additive", "--public-validation", "test",
                 "--select", "loss", "--out", str(out), "--no-progress"])
    assert code == 0, capsys.readouterr().err
    grid = json.loads((out / "grid.json").read_text())
    assert [r["settings"]["oso.rule"] for r in grid["runs"]] == ["sign", "additive"]
    assert grid["winner"] == min(grid["runs"], key=lambda r: r["metric"])["index"]
    assert "declared public" in grid["selected_on"]
    # Fixed σ: the grid's ε is only computed, from both ledgers composed (each step releases
    # OSO's two sums, one Gaussian at σ together).
    eps = dp_accounting_epsilon(_composed(grid), grid["delta"], "rdp")
    assert grid["epsilon"] == pytest.approx(eps, rel=1e-6)


@pytest.mark.parametrize("argv, word", [
    (["--grid", "batch_size=64,128"], "grid name"),
    (["--grid", "lr=logspace:-1:1"], "grid"),
    (["--grid", "lr=0.1", "--method", "noise_decay", "--method-options", "kind=time",
      "rate=0.5"], "keeps the run's σ"),
    (["--grid", "lr=0.1", "--resume", "x"], "resume"),
    (["--grid", "clip=0.1,1", "--method", "oso"], "initial_clip"),
    (["--grid", "oso.clip_rate=0.1,5", "--method", "oso"], "clip_rate"),   # 2nd config bad
])
def test_cli_refusals_are_one_line(argv, word, tmp_path, capsys):
    code = main(["tune", "--dataset", "digits", "--model", "logreg", "--out",
                 str(tmp_path / "o"), *argv])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and word in err
    assert not (tmp_path / "o").exists() and not (tmp_path / "o.grid").exists()
