"""`dpfy train --model batchnorm_cnn --batchnorm privatized|public`: the ledger of a privatized
run holds the statistics releases beside the gradient's and the run spends its target; the
public run names its public data in the report; without --batchnorm the BatchNorm is refused,
and BatchNorm flags without --batchnorm are refused (exit 2, one line)."""

import json

import pytest

from dpfy.cli import main

FAST = ["--dataset", "digits", "--model", "batchnorm_cnn", "--epochs", "1", "--lr", "1.0",
        "--clip", "1", "--threads", "1", "--no-progress", "--seed", "3",
        "--epsilon", "3", "--delta", "1e-4", "--batch-size", "256"]


@pytest.mark.slow   # a whole run and its report
def test_privatized_run_records_the_statistics(tmp_path):
    out = tmp_path / "r"
    assert main(["train", *FAST, "--batchnorm", "privatized", "--bn-bound", "2",
                 "--bn-share", "0.2", "--out", str(out)]) == 0
    ledger = json.loads((out / "ledger.json").read_text())
    releases = ledger["groups"][0]["releases"]
    assert [r["mechanism"] for r in releases] == [
        "gradient", "bn_mean:1", "bn_square:1", "bn_mean:4", "bn_square:4"]
    # the share: the 4 statistics releases hold 20 % of the step's precision Σ σ⁻²
    prec = [r["noise_multiplier"] ** -2 for r in releases]
    assert sum(prec[1:]) == pytest.approx(0.2 * sum(prec), rel=1e-12)
    summary = json.loads((out / "summary.json").read_text())
    assert 2.97 <= summary["epsilon"] <= 3.0  # calibrated to the target with the statistics
    assert "bn_mean:1" in (out / "privacy_report.md").read_text()
    # config.json's run spec: the statistics as make_private recorded them, the ledger's σs
    spec = json.loads((out / "config.json").read_text())["spec"]
    assert spec["batchnorm"] == {"kind": "privatized", "bound": 2.0, "share": 0.2,
                                 "noise_multiplier": releases[1]["noise_multiplier"],
                                 "releases": 4, "public_data": None}
    assert spec["noise"]["noise_multiplier"] == releases[0]["noise_multiplier"]
    report = json.loads((out / "privacy_report.json").read_text())["model_description"]
    assert f"σ_bn = {releases[1]['noise_multiplier']:.4g}" in report  # read from the spec


def test_plain_batchnorm_is_refused(tmp_path, capsys):
    assert main(["train", *FAST, "--out", str(tmp_path / "r")]) != 0
    assert "BatchNorm" in capsys.readouterr().err


def test_plain_batchnorm_is_refused_naming_the_command_line_fix(tmp_path, capsys):
    # A command-line user is told the flags, not the Python API's dpfy.validate(fix=True).
    assert main(["train", *FAST, "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--batchnorm privatized --bn-bound" in err[0], err
    assert "--model groupnorm_cnn" in err[0] and "dpfy.validate" not in err[0], err


@pytest.mark.parametrize("flags", [["--bn-bound", "2"], ["--bn-share", "0.1"],
                                   ["--batchnorm", "public", "--bn-bound", "2"]])
def test_batchnorm_flags_need_their_mode(tmp_path, capsys, flags):
    assert main(["train", *FAST, *flags, "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "batchnorm" in err[0], err


def test_privatized_needs_a_declared_bound(tmp_path, capsys):
    assert main(["train", *FAST, "--batchnorm", "privatized", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--bn-bound" in err[0], err


def test_public_digits_are_for_fashion_mnist(tmp_path, capsys):
    assert main(["train", *FAST, "--batchnorm", "public", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "fashion_mnist" in err[0], err
