"""dpfy account / dpfy calibrate with --noise tree | bandmf (--bands)."""

import json
import math

import dp_accounting
import pytest

from dpfy.cli import main

SHAPE = ["--batch-size", "250", "--dataset-size", "10000", "--epochs", "3"]


def _json(capsys):
    return json.loads(capsys.readouterr().out)


def test_account_bandmf_one_band_is_dp_sgd(capsys):
    main(["account", *SHAPE, "--noise-multiplier", "1.2", "--delta", "1e-5", "--json"])
    dpsgd = _json(capsys)
    main(["account", *SHAPE, "--noise-multiplier", "1.2", "--delta", "1e-5", "--json",
          "--noise", "bandmf", "--bands", "1"])
    assert _json(capsys)["epsilon"] == pytest.approx(dpsgd["epsilon"], rel=1e-12)


def test_account_bandmf_bands_use_group_rate_and_cycles(capsys):
    main(["account", *SHAPE, "--noise-multiplier", "1.2", "--delta", "1e-5", "--json",
          "--noise", "bandmf", "--bands", "4", "--accountant", "rdp"])
    out = _json(capsys)
    assert out["sampling"] == "cyclic_poisson" and out["sample_rate"] == pytest.approx(0.1)
    event = dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
        0.1, dp_accounting.GaussianDpEvent(1.2)), math.ceil(120 / 4))
    want = dp_accounting.rdp.RdpAccountant().compose(event).get_epsilon(1e-5)
    assert out["epsilon"] == pytest.approx(want, rel=1e-9)


def test_account_tree_restarts_every_pass(capsys):
    main(["account", *SHAPE, "--noise-multiplier", "4", "--delta", "1e-5", "--json",
          "--noise", "tree", "--accountant", "rdp"])
    out = _json(capsys)
    assert out["sampling"] == "shuffle" and out["period"] == 40
    acc = dp_accounting.rdp.RdpAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_SPECIAL)
    acc.compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.SingleEpochTreeAggregationDpEvent(2.0, 40), 3))
    assert out["epsilon"] == pytest.approx(acc.get_epsilon(1e-5), rel=1e-9)


@pytest.mark.parametrize("noise", [["--noise", "tree"], ["--noise", "bandmf", "--bands", "5"]])
def test_calibrate_correlated_noise(capsys, noise):
    main(["calibrate", "--target-epsilon", "2", "--delta", "1e-5", *SHAPE, "--json", *noise])
    out = _json(capsys)
    assert out["solved"] == "noise_multiplier" and 1.99 < out["epsilon"] <= 2.0


def test_bands_needs_bandmf(capsys):
    assert main(["account", *SHAPE, "--noise-multiplier", "1", "--delta", "1e-5",
                 "--bands", "3"]) != 0
    assert "--noise bandmf" in capsys.readouterr().err


def test_explain_memory_states_the_noise_buffer():
    from torch import nn

    from dpfy.cli.explain import noise_memory
    text = noise_memory(nn.Linear(10, 3), [1, 8])     # d = 33
    assert "--bands 1: (b - 1) x d = 0 floats" in text
    assert "--bands 8: (b - 1) x d = 231 floats" in text
