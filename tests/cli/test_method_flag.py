"""``dpfy train --method`` (repeatable, chained), ``--method-options``, ``dpfy methods``.

Schedules are methods: ``--method noise_decay|dynamic|plateau`` with options replaces the former
``--schedule NAME --schedule-options``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpfy.adaptive import REGISTRY
from dpfy.cli import main
from dpfy.cli.methods import markdown

DOCS = Path(__file__).resolve().parents[2] / "docs" / "METHODS.md"
# ε = 0.5: the calibrated σ's are large enough that their PLDs are quick to build (at ε = 2 a
# schedule's PLD calibration took ~4× the CPU time); no test here depends on the budget's size
BASE = ["train", "--dataset", "digits", "--model", "logreg", "--epsilon", "0.5", "--epochs", "1",
        "--batch-size", "128", "--no-progress"]


def test_chained_methods_run_and_their_releases_reach_the_ledger(tmp_path):
    out = tmp_path / "run"
    code = main(BASE + ["--out", str(out), "--method", "noise_decay", "--method", "quantile",
                        "--method-options", "noise_decay.kind=exponential",
                        "noise_decay.rate=0.3"])
    assert code == 0
    ledger = json.loads((out / "ledger.json").read_text())
    mechanisms = {r["mechanism"] for g in ledger["groups"] for r in g["releases"]}
    assert mechanisms == {"gradient", "unclipped_count"}
    # the report describes each method's releases from its specs, not from prose
    report = (out / "privacy_report.md").read_text()
    assert "`unclipped_count` (values): the centred count of unclipped examples" in report


def test_a_noise_schedule_is_a_method_calibrated_to_the_target(tmp_path):
    # formerly --schedule exponential --schedule-options rate=0.5: σ_0 is solved for ε = 0.5
    out = tmp_path / "run"
    assert main(BASE + ["--out", str(out), "--epochs", "2", "--method", "noise_decay",
                        "--method-options", "kind=exponential", "rate=0.5"]) == 0
    rows = json.loads((out / "metrics.json").read_text())
    # exponential decay per epoch u: σ_1 = σ_0·exp(−0.5) (adaptive/schedules.py)
    assert rows[1]["noise_multiplier"] == pytest.approx(rows[0]["noise_multiplier"]
                                                        * 2.718281828 ** -0.5, rel=1e-6)
    assert rows[-1]["epsilon"] <= 0.5 + 1e-6             # the schedule spends the target


def test_the_schedule_flags_are_gone(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(BASE + ["--out", str(tmp_path / "r"), "--schedule", "exponential"])
    assert e.value.code == 2 and "--schedule" in capsys.readouterr().err


def test_a_method_reading_validation_needs_a_declared_public_split(tmp_path, capsys):
    code = main(BASE + ["--out", str(tmp_path / "r"), "--method", "plateau",
                        "--method-options", "initial=3"])
    assert code == 2 and "public-validation test" in capsys.readouterr().err


def test_unaddressed_option_in_a_chain_is_refused(tmp_path, capsys):
    code = main(BASE + ["--out", str(tmp_path / "r"), "--method", "noise_decay",
                        "--method", "quantile", "--method-options", "rate=0.3"])
    assert code == 2 and "NAME.KEY=VALUE" in capsys.readouterr().err


def test_dpfy_methods_lists_every_registered_method(capsys):
    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in REGISTRY)


def test_methods_doc_is_current():
    assert DOCS.read_text() == markdown(), "regenerate: dpfy methods --markdown > docs/METHODS.md"


def test_hyfree_trains_from_the_cli_with_loss_probes_in_the_ledger(tmp_path):
    """`dpfy train --method hyfree` gets per-example losses from the trainer (no loss_fn to
    write) and its probe rounds reach the ledger and the report."""
    out = tmp_path / "run"
    code = main(BASE + ["--out", str(out), "--method", "hyfree", "--optimizer", "adam",
                        "--lr", "1e-3", "--method-options", "probe_every=2",
                        "--accountant", "rdp"])   # RDP: its calibration takes milliseconds
    assert code == 0
    ledger = json.loads((out / "ledger.json").read_text())
    mechanisms = {r["mechanism"] for g in ledger["groups"] for r in g["releases"]}
    assert mechanisms == {"gradient", "loss_probe_at_theta", "loss_probe_descent",
                          "loss_probe_ascent"}
    report = (out / "privacy_report.md").read_text()
    assert "loss_probe_descent" in report and "`hyfree`" in report


def test_a_method_that_clips_itself_is_named_instead_of_the_unused_clip(tmp_path, capsys):
    """hyfree clips automatically: the banner and the report must not claim `clip C = 0.1`."""
    out = tmp_path / "run"
    assert main(BASE + ["--out", str(out), "--method", "hyfree", "--optimizer", "adam",
                        "--lr", "1e-3", "--accountant", "rdp"]) == 0
    captured = capsys.readouterr()
    printed = captured.err + captured.out
    report = (out / "privacy_report.md").read_text()
    for text in (printed, report):
        assert "clipping by method 'hyfree' (--clip not used)" in text
        assert "clip C = 0.1" not in text and "clip 0.1" not in text


def test_noisy_max_trains_from_the_cli_with_its_candidates_in_the_ledger(tmp_path):
    # dpfy train wraps every method in a chain: before the chain forwarded post-release
    # probes, the optimizer refused the run (the chain would have dropped the selection)
    out = tmp_path / "run"
    assert main(BASE + ["--out", str(out), "--method", "noisy_max", "--momentum", "0",
                        "--accountant", "rdp"]) == 0
    ledger = json.loads((out / "ledger.json").read_text())
    got = {r["mechanism"] for g in ledger["groups"] for r in g["releases"]}
    assert got == {"gradient"} | {f"noisy_max_loss_{j}" for j in range(6)}
