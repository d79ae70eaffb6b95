"""`dpfy calibrate --grid-runs` (issue 11; Galli, Palamidessi & Cucinotta 2024, a budget per grid
of runs): σ for k runs composed, the per-run ε and share, and bad input in one line.

ε checks here use dp_accounting directly on the composed events, not dpfy's accountants. (The
library's grid budgets: tests/privacy/test_grid_budget.py, where Q, T and δ are derived.)
"""

import json

import dp_accounting
import pytest

from dpfy.cli import main

# Galli et al. 2024 Table 1, Fashion-MNIST: q = 512/60000, T = round(10·60000/512); δ = 1e-5
# (the paper states none).
Q, T, DELTA = 0.008533, 1172, 1e-5


def _rdp_epsilon(sigma: float, total_steps: int, q: float = Q) -> float:
    """dp_accounting's RDP ε of ``total_steps`` Poisson-subsampled Gaussian steps at σ."""
    step = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
    composed = dp_accounting.SelfComposedDpEvent(step, total_steps)
    return dp_accounting.rdp.RdpAccountant().compose(composed).get_epsilon(DELTA)


CLI = ["calibrate", "--target-epsilon", "3", "--delta", "1e-5", "--sample-rate", str(Q),
       "--steps", str(T), "--accountant", "rdp"]   # the RDP values of Galli et al. 2024


def test_cli_grid_runs_json(capsys):
    assert main(CLI + ["--grid-runs", "7", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["runs"] == 7 and out["steps"] == T and out["total_steps"] == 7 * T
    assert out["noise_multiplier"] == pytest.approx(1.358, rel=0.01)
    assert out["epsilon"] == pytest.approx(_rdp_epsilon(out["noise_multiplier"], 7 * T))
    assert out["epsilon"] <= 3
    assert out["epsilon_per_run"] == pytest.approx(_rdp_epsilon(out["noise_multiplier"], T))
    assert out["epsilon_per_run"] < out["epsilon"]
    assert out["budget_share_per_run"] == pytest.approx(1 / 7)


def test_cli_without_grid_runs_is_unchanged(capsys):
    assert main(CLI + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert "runs" not in out and "epsilon_per_run" not in out
    assert out["noise_multiplier"] == pytest.approx(0.837, rel=0.01)


def test_cli_grid_runs_text(capsys):
    assert main(CLI + ["--grid-runs", "49"]) == 0
    text = capsys.readouterr().out
    assert "49 runs × 1172 steps" in text and "σ = 3.14" in text


@pytest.mark.parametrize("extra", [["--grid-runs", "0"],
                                   ["--grid-runs", "7", "--noise-multiplier", "1"]])
def test_cli_grid_runs_bad_input_exits_2(extra, capsys):
    argv = CLI + extra
    if "--noise-multiplier" in extra:
        argv = [a for a in argv if a not in ("--steps", str(T))]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "must be" in err[0]
