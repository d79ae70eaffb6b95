"""Label DP on the command line (`dpfy train --privacy-unit label`): a run writes the label
ledger (ε as asked, δ = 0) and a report that says the features are not protected; example-level
settings and stages with plain RR are refused. (The mechanisms: tests/label_dp/test_label_dp.py.)"""

import json

from dpfy.cli import main


def test_cli_label_dp_run(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--dataset", "digits", "--model", "logreg", "--privacy-unit",
                 "label", "--label-dp", "rr-prior", "--epsilon", "2", "--epochs", "2",
                 "--seed", "0", "--out", str(out)]) == 0  # fmt: skip
    led = json.loads((out / "label_ledger.json").read_text())
    assert led["epsilon"] == 2.0 and led["delta"] == 0.0 and led["features_protected"] is False
    assert "NOT protected" in (out / "report.md").read_text() and (out / "model.pt").is_file()


def test_cli_refuses_example_level_settings(tmp_path):
    assert main(["train", "--dataset", "digits", "--privacy-unit", "label", "--label-dp",
                 "rr", "--noise-multiplier", "1", "--out", str(tmp_path / "r")]) == 2  # fmt: skip


def test_cli_refuses_stages_with_plain_rr(tmp_path, capsys):
    assert main(["train", "--dataset", "digits", "--privacy-unit", "label", "--label-dp", "rr",
                 "--label-stages", "0.3,0.7", "--out", str(tmp_path / "r")]) == 2  # fmt: skip
    assert "--label-stages must be unset with --label-dp rr" in capsys.readouterr().err
