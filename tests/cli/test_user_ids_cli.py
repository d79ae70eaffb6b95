"""`dpfy train --user-ids FILE --user-sampling uls|els` (issue 26 §1): a user-level run from
the command line, its report naming the unit, its ledger's ε by dp_accounting at the user
level, and one-line errors with exit 2."""

import json

import dp_accounting
import numpy as np
import pytest

from dpfy.cli import main

FAST = ["--dataset", "digits", "--model", "logreg", "--epochs", "1", "--lr", "1.0",
        "--clip", "1.0", "--threads", "1", "--no-progress", "--seed", "3",
        "--accountant", "rdp", "--epsilon", "3", "--delta", "1e-4"]
TRAIN = 1438   # digits' training split


def _ids(tmp_path, users: int = 60):
    path = tmp_path / "ids.npy"
    np.save(path, np.random.default_rng(0).integers(0, users, TRAIN))
    return str(path)


@pytest.mark.slow   # a whole run and its report: about 20 s alone, more on a loaded machine
def test_uls_from_the_command_line_is_a_user_level_run(tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["train", *FAST, "--batch-size", "12", "--user-ids", _ids(tmp_path),
                 "--user-sampling", "uls", "--max-examples-per-user", "5",
                 "--out", str(out)]) == 0
    report = json.loads((out / "privacy_report.json").read_text())
    assert report["unit"]["name"] == "user"
    assert "one user, with all of their examples under add-or-remove" in report["statement"]
    (section,) = [s for s in report["sections"] if s["title"] == "Unit of privacy: users"]
    assert section["data"]["num_users"] == 60 and section["data"]["user_sampling"] == "uls"
    ledger = json.loads((out / "ledger.json").read_text())
    (group,) = ledger["groups"]
    assert group["sampling"] == "uls" and group["sample_rate"] == pytest.approx(12 / 60)
    acc = dp_accounting.rdp.RdpAccountant()   # the user-level Poisson-subsampled Gaussian
    acc.compose(dp_accounting.PoissonSampledDpEvent(
        12 / 60, dp_accounting.GaussianDpEvent(group["releases"][0]["noise_multiplier"])),
        ledger["num_steps"])
    assert report["epsilon"] == pytest.approx(acc.get_epsilon(1e-4), rel=1e-9)
    assert report["epsilon"] <= 3.0 + 1e-9
    assert "U = 60 users" in (out / "privacy_report.md").read_text()


@pytest.mark.parametrize("flags, match", [
    (["--user-sampling", "uls"], "--user-sampling must be left unset without --user-ids"),
    (["--user-ids", "IDS", "--user-sampling", "els"], "--max-examples-per-user must be given"),
    (["--user-ids", "IDS", "--user-sampling", "xls"], "--user-sampling must be 'uls' or 'els'"),
])
def test_bad_user_flags_exit_2(tmp_path, capsys, flags, match):
    flags = [_ids(tmp_path) if f == "IDS" else f for f in flags]
    assert main(["train", *FAST, "--batch-size", "12", *flags,
                 "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and __import__("re").search(match, err[0]), err
