"""``dpfy train`` from the command line: flags, config files and the bad inputs of issue 4,
each a one-line error with exit code 2 and no output directory left behind."""

import json
import math

import pytest

from dpfy.cli import main
from fake_idx import write_fake

FAST = ["--dataset", "digits", "--model", "logreg", "--epochs", "1", "--batch-size", "256",
        "--lr", "1", "--clip", "1", "--seed", "3", "--threads", "1", "--no-progress"]


def fails(argv, capsys, match):
    assert main(["train", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dpfy train: error: ") and "\n" not in err, err
    assert match in err, err
    return err


def test_flags_run_and_print_where_the_report_is(tmp_path, capsys):
    assert main(["train", *FAST, "--out", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert f"privacy report: {tmp_path / 'r' / 'privacy_report.md'}" in out
    assert "resolved config" in out and "Poisson sampling" in out
    assert json.loads((tmp_path / "r" / "config.json").read_text())["epochs"] == 1


def test_config_file_with_flag_override(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text('dataset = "digits"\nmodel = "logreg"\nepochs = 1\nbatch_size = 256\n'
                   'noise_multiplier = 2.0\nclip = 0.5\nseed = 5\nthreads = 1\n')
    assert main(["train", "--config", str(cfg), "--clip", "2", "--no-progress",
                 "--out", str(tmp_path / "r")]) == 0
    c = json.loads((tmp_path / "r" / "config.json").read_text())
    # the file's fixed σ replaced the default target ε; the flag overrode the file's clip
    assert (c["noise_multiplier"], c["epsilon"], c["clip"]) == (2.0, None, 2.0)


@pytest.mark.parametrize("argv, match", [
    (["--model", "resnet"], "model must be one of"),
    (["--dataset", "cifar10"], "dataset must be one of"),
    (["--epsilon", "0"], "epsilon must be > 0"),
    (["--epsilon", "-2"], "epsilon must be > 0"),
    (["--delta", "1"], "delta must be in (0, 1)"),
    (["--delta", "1.5"], "delta must be in (0, 1)"),
    (["--epsilon", "3", "--noise-multiplier", "1"], "Give either a target --epsilon"),
    (["--method", "noise_decay", "--method-options", "rate"], "KEY=VALUE"),
])
def test_bad_values(tmp_path, capsys, argv, match):
    fails([*FAST, *argv, "--out", str(tmp_path / "r")], capsys, match)
    assert list(tmp_path.iterdir()) == []


def test_data_dir_without_files(tmp_path, capsys):
    fails(["--data-dir", str(tmp_path), "--epochs", "1", "--out", str(tmp_path / "r")],
          capsys, "apt-get install dataset-fashion-mnist")
    assert list(tmp_path.iterdir()) == []


def test_corrupt_idx_file(tmp_path, capsys):
    data = tmp_path / "fm"
    write_fake(data)
    p = data / "train-images-idx3-ubyte.gz"
    p.write_bytes(p.read_bytes()[:40])                    # a cut-off download
    fails(["--data-dir", str(data), "--out", str(tmp_path / "r")], capsys, "--reinstall")
    assert not (tmp_path / "r").exists() and not (tmp_path / "r.partial").exists()


def test_unwritable_out(tmp_path, capsys):
    (tmp_path / "file").write_text("")                    # a path under a file: never writable
    fails([*FAST, "--out", str(tmp_path / "file" / "run")], capsys,
          "out must be a writable directory")


def test_resume_with_a_config_that_does_not_match(tmp_path, capsys, monkeypatch, interrupt):
    import dpfy.train.trainer as trainer_mod
    monkeypatch.setattr(trainer_mod, "run_epoch", lambda *a, **k: (_ for _ in ()).throw(
        KeyboardInterrupt))
    # Ctrl-C before any epoch finished: one line, exit 130, nothing is kept
    assert main(["train", *FAST, "--out", str(tmp_path / "r")]) == 130
    assert "nothing was saved" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    fails(["--resume", str(tmp_path / "r")], capsys, "nothing to continue")

    from dpfy.train import TrainConfig
    cfg = TrainConfig(dataset="digits", model="logreg", epochs=2, batch_size=256, lr=1.0,
                      clip=1.0, seed=3, threads=1)
    interrupt(cfg, tmp_path / "r", after_epochs=1)
    capsys.readouterr()
    fails(["--resume", str(tmp_path / "r"), "--lr", "0.5", "--no-progress"], capsys,
          "--lr must match the interrupted run when resuming, got --lr = 0.5 but the run used 1.0")
    assert (tmp_path / "r.partial" / "checkpoint.pt").is_file()      # still resumable
    assert main(["train", "--resume", str(tmp_path / "r"), "--no-progress"]) == 0
    assert (tmp_path / "r" / "model.pt").is_file()


def test_noise_decay_method_builds_a_calibrated_schedule(tmp_path, capsys):
    # ε = 0.5, not the default 3: larger σ's, whose PLDs are quicker to build
    assert main(["train", *FAST, "--epochs", "2", "--epsilon", "0.5", "--method", "noise_decay",
                 "--method-options", "kind=exponential", "rate=0.5",
                 "--out", str(tmp_path / "r")]) == 0
    rows = json.loads((tmp_path / "r" / "metrics.json").read_text())
    # exponential decay σ_u = σ_0·exp(−k·u) per epoch u (adaptive/schedules.py), k = 0.5
    assert rows[1]["noise_multiplier"] == pytest.approx(rows[0]["noise_multiplier"] *
                                                        math.exp(-0.5))
    assert rows[-1]["epsilon"] <= 0.5 + 1e-6               # the schedule spends the target


def test_unknown_schedule_is_a_one_line_error(tmp_path, capsys):
    fails([*FAST, "--method", "noise_decay", "--method-options", "kind=warp", "--out",
           str(tmp_path / "r")], capsys, "kind must be one of")
    assert list(tmp_path.iterdir()) == []


def test_a_malformed_options_value_names_its_own_flag(tmp_path, capsys):
    # A review found --method-options garbage answered with another flag's name and fix.
    fails([*FAST, "--method", "hyfree", "--method-options", "garbage", "--out",
           str(tmp_path / "r")], capsys, "Write e.g. --method-options ")
