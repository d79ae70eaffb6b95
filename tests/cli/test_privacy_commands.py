"""`dpfy account`, `dpfy calibrate`, `dpfy report`: flags of issue 2, JSON output, exit code 2."""

import json

import pytest

from dpfy.cli import main
from dpfy.privacy import Ledger, epsilon


def _json(capsys):
    return json.loads(capsys.readouterr().out)


def test_account_json_matches_the_accountant(capsys):
    assert main(["account", "--sample-rate", "0.005", "--noise-multiplier", "1", "--steps",
                 "20000", "--delta", "1e-6", "--accountant", "rdp", "--json"]) == 0
    out = _json(capsys)
    assert out["epsilon"] == pytest.approx(4.95, abs=0.01)     # the guide's 100-epoch RDP value


def test_account_batch_dataset_epochs(capsys):
    assert main(["account", "--batch-size", "5000", "--dataset-size", "1000000", "--epochs", "1",
                 "--noise-multiplier", "1", "--delta", "1e-6", "--accountant", "pld",
                 "--json"]) == 0
    out = _json(capsys)
    assert out["steps"] == 200 and out["sample_rate"] == 0.005
    assert out["epsilon"] == pytest.approx(0.59, abs=0.01)     # the guide's 1-epoch PLD value


def test_account_gdp_is_labelled(capsys):
    main(["account", "--sample-rate", "0.01", "--noise-multiplier", "1", "--steps", "100",
          "--delta", "1e-5", "--accountant", "gdp"])
    assert "approximation" in capsys.readouterr().out


def test_calibrate_json(capsys):
    assert main(["calibrate", "--target-epsilon", "2", "--delta", "1e-5", "--sample-rate",
                 "0.01", "--steps", "500", "--accountant", "rdp", "--json"]) == 0
    out = _json(capsys)
    ledger = Ledger.homogeneous(sample_rate=0.01, noise_multiplier=out["noise_multiplier"],
                                steps=500)
    assert out["epsilon"] == pytest.approx(epsilon(ledger, delta=1e-5)) and out["epsilon"] <= 2


@pytest.mark.parametrize("argv", [
    ["account", "--sample-rate", "1.5", "--noise-multiplier", "1", "--steps", "10",
     "--delta", "1e-5"],
    ["account", "--sample-rate", "0.1", "--noise-multiplier", "-1", "--steps", "10",
     "--delta", "1e-5"],
    ["account", "--sample-rate", "0.1", "--noise-multiplier", "1", "--steps", "0",
     "--delta", "1e-5"],
    ["account", "--sample-rate", "0.1", "--noise-multiplier", "1", "--steps", "10",
     "--delta", "1"],
    ["calibrate", "--target-epsilon", "0", "--delta", "1e-5", "--sample-rate", "0.1",
     "--steps", "10"],
    ["calibrate", "--target-epsilon", "0.0001", "--delta", "1e-5", "--sample-rate", "1",
     "--steps", "1000000", "--sampling", "none"],
])
def test_bad_input_exits_2_with_one_line(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "must be" in err[0]


def test_report_command(tmp_path, capsys):
    ledger = Ledger.homogeneous(sample_rate=0.01, noise_multiplier=1.0, steps=100,
                                dataset_size=10000)
    (tmp_path / "ledger.json").write_text(ledger.to_json())
    assert main(["report", str(tmp_path), "--delta", "1e-5", "--accountant", "rdp"]) == 0
    assert (tmp_path / "privacy_report.md").is_file()
    assert (tmp_path / "epsilon_over_steps.png").is_file()
    capsys.readouterr()
    assert main(["account", "--ledger", str(tmp_path), "--delta", "1e-5", "--accountant", "rdp",
                 "--json"]) == 0
    assert _json(capsys)["epsilon"] == pytest.approx(epsilon(ledger, delta=1e-5))


def test_report_refuses_a_gdp_headline_unless_asked_and_never_keeps_it(tmp_path, capsys):
    # A review found `dpfy report RUN --accountant gdp` rewrote the run's published report
    # with the CLT approximation, and later plain re-renders kept it as the headline.
    ledger = Ledger.homogeneous(sample_rate=0.01, noise_multiplier=1.0, steps=100,
                                dataset_size=10000)
    (tmp_path / "ledger.json").write_text(ledger.to_json())
    assert main(["report", str(tmp_path), "--delta", "1e-5", "--accountant", "gdp"]) == 2
    assert "--approximate" in capsys.readouterr().err
    assert not (tmp_path / "privacy_report.md").exists()
    assert main(["report", str(tmp_path), "--delta", "1e-5", "--accountant", "gdp",
                 "--approximate"]) == 0
    assert "not a guarantee" in capsys.readouterr().out
    assert main(["report", str(tmp_path), "--delta", "1e-5"]) == 0   # the default again
    assert "by the PLD accountant" in capsys.readouterr().out


@pytest.mark.parametrize(
    "solve",
    [
        # σ solved, 0.8289392923: to nearest 0.828939 (below), shown rounded up
        ["--sample-rate", "0.01", "--steps", "400"],
        # q solved, 0.0176323735: to nearest 0.0176324 (above), shown rounded down
        ["--noise-multiplier", "1.1", "--steps", "500"],
    ],
)
def test_calibrate_shows_the_solution_on_the_side_that_spends_no_more(solve, capsys):
    """A user copies the printed value into a run: σ shown to 6 digits must not be below the
    calibrated σ, nor q above the calibrated q (rounding to nearest can go either way)."""
    argv = ["calibrate", "--target-epsilon", "2", "--delta", "1e-5"]  # PLD, the default
    assert main(argv + solve + ["--json"]) == 0
    out = _json(capsys)
    assert main(argv + solve) == 0
    line = capsys.readouterr().out
    solved = out["solved"]
    shown = float(line.split(f"{solved} = ")[1].split(":")[0])
    if solved == "noise_multiplier":
        assert out[solved] <= shown <= out[solved] * (1 + 1e-5)
    else:
        assert out[solved] * (1 - 1e-5) <= shown <= out[solved]


@pytest.mark.parametrize(
    "solve, solved",
    [
        # T solved: 3,813,822 steps (RDP); 6 digits read 3.81382e+06, not a whole count
        (["--sample-rate", "0.001", "--noise-multiplier", "3", "--accountant", "rdp"], "steps"),
        # σ solved for tree noise, 8.398163614: to nearest 8.39816 (below the solution)
        (["--sample-rate", "0.01", "--steps", "100", "--noise", "tree"], "noise_multiplier"),
    ],
)
def test_calibrate_shows_steps_whole_tree_sigma_up_and_delta_up(solve, solved, capsys):
    """Every solved kind is shown on the side that spends no more (steps as the integer
    itself, σ not below the solution), and the δ given, 3.361e-4, reads 0.000337 as in every
    statement (to nearest, 0.000336 is below the δ the ε holds at)."""
    argv = ["calibrate", "--target-epsilon", "3", "--delta", "3.361e-4"]
    assert main(argv + solve + ["--json"]) == 0
    out = _json(capsys)
    assert out["solved"] == solved
    assert main(argv + solve) == 0
    line = capsys.readouterr().out
    shown = line.split(f"{solved} = ")[1].split(":")[0]
    if solved == "steps":
        assert shown == str(out["steps"])
    else:
        assert out[solved] <= float(shown) <= out[solved] * (1 + 1e-5)
    assert "δ = 0.000337 " in line and "0.000336" not in line
