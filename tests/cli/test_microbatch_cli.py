"""`dpfy train --clipping microbatch --microbatch-size K` (issue 28 §1): the run's report says
microbatch clipping at sensitivity 2C, its ledger is the per-example Poisson ledger (ε at σ is
unchanged, the noise is σ·2C), and the flags go together (exit 2 otherwise)."""

import json

import pytest

from dpfy.cli import main

FAST = ["--dataset", "digits", "--model", "logreg", "--epochs", "1", "--lr", "1.0",
        "--clip", "0.5", "--threads", "1", "--no-progress", "--seed", "3",
        "--accountant", "rdp", "--epsilon", "3", "--delta", "1e-4", "--batch-size", "64"]


@pytest.mark.slow   # a whole run and its report
def test_microbatch_run_from_the_command_line(tmp_path):
    out = tmp_path / "r"
    assert main(["train", *FAST, "--clipping", "microbatch", "--microbatch-size", "4",
                 "--out", str(out)]) == 0
    report = (out / "privacy_report.md").read_text()
    assert "microbatch clipping" in report and "2C = 1" in report
    ledger = json.loads((out / "ledger.json").read_text())
    assert ledger["groups"][0]["sampling"] == "poisson"


@pytest.mark.parametrize("flags", [["--clipping", "microbatch"], ["--microbatch-size", "4"]])
def test_microbatch_flags_go_together(tmp_path, capsys, flags):
    assert main(["train", *FAST, *flags, "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--microbatch-size" in err[0], err
