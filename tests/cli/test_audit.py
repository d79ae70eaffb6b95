"""``dpfy audit``: the train flags plus --canaries/--json, the claim beside the bounds, and the
audit section in the run's privacy report."""

from __future__ import annotations

import json

import torch
from torch.utils.data import TensorDataset

from dpfy.adaptive.describe import EXAMPLE_FACTS
from dpfy.audit.canaries import CanaryDataset, CanaryGradients, CanarySet
from dpfy.cli import EXIT_BAD_INPUT, main
from dpfy.train.report import methods_ran

# A fixed σ and RDP keep the test fast (calibrating σ with PLD at q ≈ 0.3 takes tens of seconds).
FLAGS = ["--dataset", "digits", "--model", "logreg", "--epochs", "1", "--batch-size", "512",
         "--noise-multiplier", "2", "--accountant", "rdp", "--canaries", "200",
         "--no-progress", "--threads", "1"]


def test_audit_json_and_report(tmp_path, capsys) -> None:
    out = tmp_path / "audit"
    assert main(["audit", *FLAGS, "--json", "--out", str(out)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["canaries"] == 200 and 0 < result["canaries_in"] < 200
    assert result["confidence"] == 0.95
    # one epoch is ⌈N / b⌉ steps, N = 1,438 digits training examples + the included canaries
    assert result["steps"] == -(-(1438 + result["canaries_in"]) // 512)
    assert result["accountant"] == "rdp"
    assert result["claimed_epsilon"] > 0
    assert 0 <= result["lower_bound_one_run"] <= result["claimed_epsilon"]
    assert 0 <= result["lower_bound_fdp"] <= result["claimed_epsilon"]
    report = json.loads((out / "privacy_report.json").read_text())
    sections = [s for s in report["sections"] if s["title"] == "Empirical privacy audit"]
    assert sections and sections[0]["data"]["lower_bound_fdp"] == result["lower_bound_fdp"]
    assert "Empirical privacy audit" in (out / "privacy_report.md").read_text()
    assert json.loads((out / "config.json").read_text())["seed"] is None


def test_audit_refuses_resume(tmp_path, capsys) -> None:
    assert main(["audit", *FLAGS, "--resume", str(tmp_path)]) == EXIT_BAD_INPUT
    assert "resume must be unset for dpfy audit" in capsys.readouterr().err


def test_audit_refuses_a_setting_it_would_drop(tmp_path, capsys) -> None:
    # the audit's loop feeds no validation metric: auditing this would audit another run
    args = ["audit", *FLAGS, "--public-validation", "test", "--out", str(tmp_path / "a")]
    assert main(args) == EXIT_BAD_INPUT
    assert "--public-validation must be unset for dpfy audit" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "a.partial").exists()


def test_the_report_says_what_the_unregistered_canary_method_releases():
    """The audit's canary method is not in the registry; the report still says what a run with
    it releases, read from its specs: the clipped sum of the transformed gradients, nothing
    of its own."""
    model = torch.nn.Linear(4, 2)
    draw = CanarySet.draw(model, 8, torch.Generator().manual_seed(0))
    train = TensorDataset(torch.zeros(10, 4), torch.zeros(10, dtype=torch.long))
    method = CanaryGradients(draw, CanaryDataset(train, draw, (torch.zeros(4), 0)))
    (row,) = methods_ran(method.calibrate(EXAMPLE_FACTS))
    assert row["name"] == "_audit_canaries"
    assert "the clipped sum of the transformed per-example gradients" in row["releases"]


def test_audit_json_names_and_a_planted_run_is_never_published(tmp_path, capsys) -> None:
    out = tmp_path / "planted"
    assert main(["audit", *FLAGS, "--json", "--plant-noise-scale", "0.5",
                 "--out", str(out)]) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    for name in ("claimed_epsilon", "lower_bound_one_run", "lower_bound_fdp",
                 "epsilon_estimate"):
        assert isinstance(result[name], float)
    assert result["planted_noise_scale"] == 0.5 and result["published"] is False
    assert result["canary_kind"] == "dirac"
    assert "PLANTED behind the ledger's back" in captured.err
    assert "never published" in captured.err
    assert (out / "audit.json").exists()
    assert not (out / "privacy_report.md").exists() and not (out / "ledger.json").exists()
