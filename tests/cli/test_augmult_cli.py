"""`dpfy train --augmult K` (issue 28 §3): the run's report says augmentation multiplicity K
and that its ledger is the K = 1 run's; the flags go together (exit 2 otherwise)."""

import json

import pytest

from dpfy.cli import main

FAST = ["--dataset", "digits", "--model", "logreg", "--epochs", "1", "--lr", "1.0",
        "--clip", "0.5", "--threads", "1", "--no-progress", "--seed", "3",
        "--accountant", "rdp", "--epsilon", "3", "--delta", "1e-4", "--batch-size", "64"]


@pytest.mark.slow   # two whole runs and their reports
def test_augmult_run_from_the_command_line_keeps_the_plain_ledger(tmp_path):
    out, plain = tmp_path / "r", tmp_path / "p"
    assert main(["train", *FAST, "--augmult", "3", "--augment", "crop_flip",
                 "--augment-padding", "1", "--out", str(out)]) == 0
    assert main(["train", *FAST, "--out", str(plain)]) == 0
    report = (out / "privacy_report.md").read_text()
    assert "augmentation multiplicity K = 3" in report
    assert (json.loads((out / "ledger.json").read_text())
            == json.loads((plain / "ledger.json").read_text()))


@pytest.mark.parametrize("flags, field", [
    (["--augment", "crop"], "augment"),
    (["--augment-padding", "3"], "--augment-padding"),   # the flag, not the keyword
    (["--augmult", "100000"], "augmult"),
    (["--augmult", "0"], "augmult"),
    (["--augmult", "2", "--augment", "rotate"], "augment"),
])
def test_augmult_flags_are_checked(tmp_path, capsys, flags, field):
    assert main(["train", *FAST, *flags, "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and field in err[0], err


def test_augmult_refuses_data_that_are_not_images(tmp_path, capsys):
    flags = ["--dataset", "breast_cancer", "--model", "logreg", "--epochs", "1", "--seed", "3",
             "--no-progress", "--augmult", "2", "--out", str(tmp_path / "r")]
    assert main(["train", *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "augmult" in err[0] and "not images" in err[0], err
