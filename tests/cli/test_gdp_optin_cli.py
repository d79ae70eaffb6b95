"""Issue 10 §1.4, on the command line: ``dpfy calibrate --accountant gdp`` refuses without
``--approximate`` and, with it, prints the rigorous PLD ε of the calibrated run next to the GDP
one; reading ε with GDP (``dpfy account``) stays available and labelled. The rigorous ε is
checked against dp_accounting called directly in the test. (The calibration functions' refusal:
tests/privacy/test_gdp_optin.py.)
"""

import json

import dp_accounting
import pytest
from dp_accounting.pld import pld_privacy_accountant

from dpfy.cli import main
from dpfy.privacy import Ledger, epsilon

Q, T, D = 0.01, 1000, 1e-5


def _pld_epsilon_by_dp_accounting(sigma: float) -> float:
    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    acc.compose(dp_accounting.PoissonSampledDpEvent(Q, dp_accounting.GaussianDpEvent(sigma)), T)
    return acc.get_epsilon(D)


def test_cli_gdp_calibration_needs_approximate_and_states_the_pld_epsilon(capsys):
    argv = ["calibrate", "--target-epsilon", "3", "--delta", str(D), "--sample-rate", str(Q),
            "--steps", str(T), "--accountant", "gdp"]
    assert main(argv) == 2
    assert "--approximate" in capsys.readouterr().err
    assert main([*argv, "--approximate", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["approximate"] is True and out["epsilon"] <= 3
    rigorous = _pld_epsilon_by_dp_accounting(out["noise_multiplier"])
    assert out["epsilon_pld"] == pytest.approx(rigorous, rel=1e-3)
    assert rigorous > 3          # the CLT under-reports: the run really spends more than 3
    assert main([*argv, "--approximate"]) == 0
    assert "rigorous PLD ε of this run" in capsys.readouterr().out


def test_reading_epsilon_with_gdp_stays_available_and_labelled(capsys):
    ledger = Ledger.homogeneous(sample_rate=Q, noise_multiplier=1.0, steps=T)
    assert epsilon(ledger, delta=D, accountant="gdp") > 0
    assert main(["account", "--sample-rate", str(Q), "--noise-multiplier", "1", "--steps",
                 str(T), "--delta", str(D), "--accountant", "gdp"]) == 0
    assert "approximation" in capsys.readouterr().out
