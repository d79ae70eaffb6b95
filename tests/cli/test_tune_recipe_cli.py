"""`dpfy tune --recipe guide` (issue 28 §2) on the command line: its refusals name the flags,
private selection accounts the lr sweep, and a recipe run says what its ε covers. ε values are
checked with dp_accounting on the ledger's raw numbers (tests/ledger_events.py), never with
dpfy's accountants. (The recipe: tests/train/test_tune_recipe.py.)
"""

import json

import pytest

from dpfy.cli import main
from dpfy.privacy.ledger import Ledger
from ledger_events import dp_accounting_epsilon


def _tune(tmp_path, *argv):
    return main(["tune", "--dataset", "digits", "--model", "logreg", "--epochs", "1",
                 "--batch-size", "256", "--threads", "1", "--accountant", "rdp", "--no-progress",
                 "--out", str(tmp_path / "o"), *argv])


@pytest.mark.parametrize("argv, words", [
    (["--recipe", "guide", "--private-selection", "--lr", "1", "--clip", "1",
      "--lr-grid", "0.1,1"], ["--lr-grid", "ε = ∞"]),
    (["--recipe", "guide", "--private-selection", "--clip", "1"], ["--lr", "public data"]),
    (["--recipe", "guide", "--private-selection", "--lr", "1", "--clip", "1",
      "--tan-batch-size", "16"], ["--tan-batch-size"]),
    (["--tan-batch-size", "16", "--grid", "lr=1"], ["--recipe guide", "--tan-batch-size"]),
    (["--recipe", "guide", "--grid", "lr=1"], ["--lr-grid"]),
    ([], ["--grid NAME=SPEC", "--recipe guide"]),
    (["--recipe", "guide", "--clip-grid", "0,1"], ["--clip-grid"]),
    (["--recipe", "guide", "--method", "oso"], ["flat clipping", "drop --method"]),
    (["--recipe", "guide", "--noise", "tree"], ["drop --noise"]),
    (["--clip-tolerance", "0.01", "--grid", "lr=1"], ["--clip-tolerance"]),
    (["--recipe", "guide", "--lr-factors", "logspace:1:2"], ["--lr-factors logspace"]),
])
def test_cli_refusals_name_the_flags(argv, words, tmp_path, capsys):
    code = _tune(tmp_path, *argv)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert all(w in err for w in words), err
    assert not (tmp_path / "o").exists()


@pytest.mark.slow   # two full dpfy train runs (~20 s on the loaded 2-core machine)
def test_cli_private_selection_accounts_the_lr_sweep(tmp_path, capsys):
    code = _tune(tmp_path, "--recipe", "guide", "--private-selection", "--lr", "2",
                 "--clip", "1", "--lr-factors", "0.5,2", "--epsilon", "2")
    assert code == 0, capsys.readouterr().err
    grid = json.loads((tmp_path / "o" / "grid.json").read_text())
    assert grid["axes"] == {"lr": [1.0, 4.0]}
    ledgers = [Ledger.from_dict(d) for d in grid["ledgers"]]
    both = Ledger(ledgers[0].dataset_size)
    for one in ledgers:
        both.extend(one)
    eps = dp_accounting_epsilon(both, grid["delta"], "rdp")
    assert grid["epsilon"] == pytest.approx(eps, rel=1e-6) and eps <= 2.0 * (1 + 1e-9)


def test_cli_recipe_runs(tmp_path, capsys):
    code = _tune(tmp_path, "--recipe", "guide", "--lr-grid", "1", "--clip-grid", "0.1,1000",
                 "--lr-factors", "1", "--seed", "1")
    captured = capsys.readouterr()
    out = captured.out
    assert code == 0, captured.err
    assert "ClipSearch chose C" in out and "for the final run ONLY" in out
    assert "NOT covered by that ε: searches 1-2 trained 3 models" in out
    assert json.loads((tmp_path / "o" / "recipe.json").read_text())["recipe"] == "guide"
