"""`dpfy calibrate` and `dpfy account` take ELS's cap k (issue 26 §2): a σ calibrated for a
user-level target spends it when accounted, and an ELS ledger without k is refused. (The
accounting itself, against dp_accounting: tests/privacy/test_user_level_accounting.py.)"""


def test_dpfy_account_and_calibrate_take_els_k(capsys):
    import json

    from dpfy.cli import main
    shape = ["--delta", "1e-5", "--sample-rate", "0.05", "--steps", "20", "--sampling", "els",
             "--accountant", "rdp", "--json"]
    assert main(["calibrate", "--target-epsilon", "2", *shape,
                 "--max-examples-per-user", "2"]) == 0
    sigma = json.loads(capsys.readouterr().out)["noise_multiplier"]
    assert main(["account", *shape, "--noise-multiplier", str(sigma),
                 "--max-examples-per-user", "2"]) == 0
    assert 1.95 <= json.loads(capsys.readouterr().out)["epsilon"] <= 2.0 + 1e-9
    assert main(["account", *shape, "--noise-multiplier", "2"]) == 2   # ELS without k
    assert "--max-examples-per-user" in capsys.readouterr().err
