"""Parameter averaging (issue 28 §3) on the command line: `dpfy train --ema` refuses a β outside
(0, 1) and saves and evaluates the average beside the raw weights, reporting both as released.
(The average itself: tests/train/test_parameter_averaging.py.)"""

import json

import pytest
import torch

from dpfy.cli import main


def test_ema_must_be_in_0_1(tmp_path, capsys):
    assert main(["train", "--dataset", "digits", "--model", "logreg", "--ema", "1.5",
                 "--out", str(tmp_path / "r")]) == 2
    assert "ema" in capsys.readouterr().err


@pytest.mark.slow   # a whole run
def test_dpfy_train_ema_saves_and_evaluates_the_average_beside_the_raw_weights(tmp_path):
    out = tmp_path / "r"
    assert main(["train", "--dataset", "digits", "--model", "logreg", "--epochs", "2",
                 "--lr", "1.0", "--clip", "1.0", "--threads", "1", "--no-progress",
                 "--seed", "3", "--epsilon", "3", "--batch-size", "64", "--ema", "0.9",
                 "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    raw = torch.load(out / "model.pt")
    ema = torch.load(out / "model_ema.pt")
    assert raw.keys() == ema.keys() and any(not torch.equal(raw[k], ema[k]) for k in raw)
    assert 0 < summary["test_acc_ema"] <= 1 and summary["ema"] == 0.9
    report = json.loads((out / "privacy_report.json").read_text())
    (section,) = [s for s in report["sections"] if s["title"] == "Parameter averaging"]
    assert section["data"]["released"] == ["model.pt", "model_ema.pt"]
    rows = json.loads((out / "metrics.json").read_text())
    assert rows[-1]["test_acc_ema"] == summary["test_acc_ema"]
