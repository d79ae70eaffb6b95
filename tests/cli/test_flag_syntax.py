"""Issue 35 §3: errors of the command line speak its flags, and ``--noise bandmf`` has a default
``--bands``.

A check below the CLI names Python keywords; ``dpfy`` rewrites the names that are flags of the
running subcommand (dpfy/cli/flags.py), so a user reads ``--bands``, never ``bands=b``.
"""

from __future__ import annotations

import json

import dp_accounting
import pytest

from dpfy.cli import main
from dpfy.cli.flags import as_flags
from dpfy.train.config import TrainConfig, resolve

NAMES = {"bands": "--bands", "noise": "--noise", "target_delta": "--delta",
         "batch_size": "--batch-size", "loader.batch_size": "--batch-size"}


def test_keywords_become_flags_and_words_stay_words():
    msg = ("bands must be None unless noise='bandmf', got bands = 3. Pass noise='bandmf', "
           "bands=b (e.g. bands=8), or drop bands=.")
    assert as_flags(msg, NAMES) == (
        "--bands must be None unless --noise bandmf, got --bands = 3. Pass --noise bandmf "
        "--bands b (e.g. --bands 8), or drop --bands.")
    assert as_flags("loader.batch_size must be <= 150, got loader.batch_size = 359.", NAMES) == \
        "--batch-size must be <= 150, got --batch-size = 359."
    # "noise" as a word, a longer name containing a flag's name, and a dotted path stay as they are
    words = "the noise of target_delta_x and opt.bands grows; max_bands must be 1"
    assert as_flags(words, NAMES) == words


def test_a_refusal_from_make_private_reads_in_flags(tmp_path, capsys):
    argv = ["train", "--dataset", "digits", "--model", "logreg", "--epochs", "1", "--threads",
            "1", "--no-progress", "--bands", "3", "--out", str(tmp_path / "r")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--bands must be" in err and "--noise bandmf" in err, err
    assert "bands=" not in err and "noise='bandmf'" not in err, err


def test_a_config_file_s_keys_are_named_as_the_file_spells_them(tmp_path, capsys):
    # A misspelt key in a TOML config: the message lists the keys the file may hold
    # (batch_size), not the flags (--batch-size), which the file cannot use.
    config = tmp_path / "c.toml"
    config.write_text('dataset = "digits"\nepoch = 3\n')
    assert main(["train", "--config", str(config), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "key = 'epoch'" in err and "'batch_size'" in err and "'weight_decay'" in err, err
    assert "--batch-size" not in err and "--weight-decay" not in err, err


def test_train_bandmf_without_bands_gets_the_default():
    """b = min(8, ⌊N/B⌋): digits' default batch is 1438 // 4 = 359, so ⌊1438/359⌋ = 4 bands."""
    cfg = resolve(TrainConfig(dataset="digits", noise="bandmf"), num_examples=1438,
                  reference_delta=None)[0]
    assert (cfg.batch_size, cfg.bands) == (359, 4)
    cfg = resolve(TrainConfig(dataset="fashion_mnist", noise="bandmf"), num_examples=60000,
                  reference_delta=1e-5)[0]
    assert (cfg.batch_size, cfg.bands) == (2048, 8)                  # ⌊60000/2048⌋ = 29 > 8
    assert resolve(TrainConfig(dataset="digits", noise="bandmf", bands=2), num_examples=1438,
                   reference_delta=None)[0].bands == 2


def test_account_bandmf_without_bands_gets_the_default(capsys):
    """q = 250 / 10000: ⌊1/q⌋ = 40 > 8, so b = 8 and the group rate is 8q = 0.2; ε by
    dp_accounting's RDP for ⌈120/8⌉ = 15 participations of a Poisson-subsampled Gaussian."""
    assert main(["account", "--batch-size", "250", "--dataset-size", "10000", "--epochs", "3",
                 "--noise-multiplier", "1.2", "--delta", "1e-5", "--json",
                 "--noise", "bandmf", "--accountant", "rdp"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["sample_rate"] == pytest.approx(0.2)
    event = dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
        0.2, dp_accounting.GaussianDpEvent(1.2)), 15)
    want = dp_accounting.rdp.RdpAccountant().compose(event).get_epsilon(1e-5)
    assert out["epsilon"] == pytest.approx(want, rel=1e-9)


def test_identifiers_are_rewritten_wherever_they_stand():
    names = {"user_ids": "--user-ids", "user_sampling": "--user-sampling"}
    assert as_flags("user_sampling must be left unset without user_ids.", names) == \
        "--user-sampling must be left unset without --user-ids."
    assert as_flags("read user_ids.npy or user_ids()", names) == "read user_ids.npy or user_ids()"
    assert as_flags("in /data/user_ids/ids.npy", names) == "in /data/user_ids/ids.npy"


def test_a_switch_set_true_reads_as_the_bare_switch(capsys):
    """``approximate=True`` is ``--approximate`` at the command line (a store_true flag takes no
    value): the GDP refusal of ``dpfy calibrate`` read "pass --approximate True (CLI:
    --approximate)", a command argparse rejects."""
    assert as_flags("pass approximate=True and state it", {"approximate": "--approximate"}) == \
        "pass --approximate and state it"
    argv = ["calibrate", "--target-epsilon", "3", "--delta", "1e-5", "--sample-rate", "0.01",
            "--steps", "100", "--accountant", "gdp"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--approximate True" not in err and "CLI:" not in err
    assert "pass --approximate and" in err
