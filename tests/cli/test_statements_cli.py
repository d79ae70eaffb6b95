"""Every statement of ε that `dpfy account` and `dpfy calibrate` print names its unit of privacy
and neighbouring relation, and an accountant that does not apply to a mechanism is left out with
the reason (issue 35 §3); calibrate and account default to PLD, as train does. (The same
statements from the library: tests/privacy/test_statements.py.)"""

from __future__ import annotations

import json

from dpfy.cli import main
from dpfy.privacy.ledger import Ledger, Sampling


def test_account_ledger_of_a_user_level_run_names_the_user(tmp_path, capsys):
    ledger = Ledger.homogeneous(sample_rate=0.2, noise_multiplier=1.5, steps=10,
                                sampling=Sampling.ULS, dataset_size=30)
    (tmp_path / "ledger.json").write_text(ledger.to_json())
    assert main(["account", "--ledger", str(tmp_path / "ledger.json"), "--delta", "1e-5"]) == 0
    out = capsys.readouterr().out
    assert "for user-level add-or-remove adjacency (one user added or removed" in out, out
    assert main(["account", "--ledger", str(tmp_path / "ledger.json"), "--delta", "1e-5",
                 "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["unit"] == "user" and "user-level" in record["statement"]


# σ of the ELS ledgers: at 2 (not 1) the mixture's PLD builds quicker; what is left out does
# not depend on σ
ELS_SIGMA = 2.0


def _els_run_dir(tmp_path):
    ledger = Ledger.homogeneous(sample_rate=0.05, noise_multiplier=ELS_SIGMA, steps=40,
                                sampling=Sampling.ELS, max_examples_per_user=4, dataset_size=100)
    (tmp_path / "ledger.json").write_text(ledger.to_json())
    (tmp_path / "config.json").write_text(json.dumps({"accountant": "pld"}))
    return str(tmp_path)


def test_els_run_leaves_gdp_out_with_the_reason(tmp_path, capsys):
    """The issue's run printed GDP ε = 68.42 beside PLD's 2.998: the CLT is derived for the
    subsampled Gaussian, an ELS step is a mixture of Gaussians."""
    run = _els_run_dir(tmp_path)
    assert main(["account", "--ledger", run, "--delta", "1e-5"]) == 0
    out = capsys.readouterr().out
    assert "gdp: ε" not in out and "rdp: ε" in out, out
    assert "gdp left out: the GDP CLT is derived for the subsampled Gaussian" in out, out
    assert main(["account", "--ledger", run, "--delta", "1e-5", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert set(record["others"]) == {"rdp"} and "mixture" in record["left_out"]["gdp"]
    assert main(["account", "--ledger", run, "--delta", "1e-5", "--accountant", "gdp"]) == 2
    assert "accountant must be one that applies" in capsys.readouterr().err


def test_calibrate_and_account_default_to_pld_like_train(capsys):
    """One default: dpfy train and make_private account with PLD; calibrate and account did
    with RDP (σ 11.18 against 10.41 for the same tree run in the issue)."""
    from dpfy.train.config import TrainConfig

    assert TrainConfig().accountant == "pld"
    shape = ["--delta", "1e-5", "--sample-rate", "0.01", "--steps", "200", "--json"]
    assert main(["calibrate", "--target-epsilon", "2", *shape]) == 0
    default = json.loads(capsys.readouterr().out)
    assert default["accountant"] == "pld"
    assert main(["calibrate", "--target-epsilon", "2", *shape, "--accountant", "pld"]) == 0
    assert json.loads(capsys.readouterr().out)["noise_multiplier"] == default["noise_multiplier"]
    assert main(["account", "--noise-multiplier", "1", *shape]) == 0
    assert json.loads(capsys.readouterr().out)["accountant"] == "pld"
