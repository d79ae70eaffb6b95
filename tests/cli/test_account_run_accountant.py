"""``dpfy account --ledger RUN`` reads ε with the run's own accountant (its config.json) and shows
the others beside it; the numbers are checked against dp_accounting's accountants."""

import json

import dp_accounting
import pytest

from dpfy.cli import main
from dpfy.privacy import Ledger

Q, SIGMA, T, DELTA = 0.01, 1.0, 200, 1e-5


def _reference(accountant: str) -> float:
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(Q, dp_accounting.GaussianDpEvent(SIGMA)), T)
    acc = (dp_accounting.pld.PLDAccountant() if accountant == "pld"
           else dp_accounting.rdp.RdpAccountant())
    return acc.compose(event).get_epsilon(DELTA)


def test_the_run_s_accountant_is_the_default_and_the_others_are_beside_it(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "ledger.json").write_text(
        Ledger.homogeneous(sample_rate=Q, noise_multiplier=SIGMA, steps=T).to_json())
    (run / "config.json").write_text(json.dumps({"accountant": "pld", "seed": None}))
    assert main(["account", "--ledger", str(run), "--delta", str(DELTA), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["accountant"] == "pld"
    assert out["epsilon"] == pytest.approx(_reference("pld"), rel=1e-2)
    assert out["others"]["rdp"] == pytest.approx(_reference("rdp"), rel=1e-2)
    assert set(out["others"]) == {"rdp", "gdp"}
    assert main(["account", "--ledger", str(run), "--delta", str(DELTA), "--accountant",
                 "rdp", "--json"]) == 0                   # an explicit choice wins
    assert json.loads(capsys.readouterr().out)["accountant"] == "rdp"


def test_the_gdp_value_beside_the_run_s_accountant_is_labelled_an_approximation(tmp_path, capsys):
    """The GDP CLT may under-report ε (docs/accounting.md); shown beside a rigorous ε without a
    label, a reader could take it for a bound. Checked: PLD by dp_accounting here is above it."""
    path = tmp_path / "ledger.json"
    path.write_text(Ledger.homogeneous(sample_rate=Q, noise_multiplier=SIGMA, steps=T).to_json())
    assert main(["account", "--ledger", str(path), "--delta", str(DELTA)]) == 0
    line = capsys.readouterr().out
    gdp_part = line[line.index("gdp: ε"):]
    assert "approximation" in gdp_part.split(";")[0]
    assert main(["account", "--ledger", str(path), "--delta", str(DELTA), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert "approximation" in out["others_labels"]["gdp"]
    assert "upper bound" in out["others_labels"]["rdp"]
