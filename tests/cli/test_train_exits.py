"""`dpfy train` exit codes (issue 10 §2, §4): Ctrl-C prints the --resume line, exit 130;
a spent budget (BudgetExhausted) is one line and exit 3."""

import pytest

import dpfy.train.trainer as trainer_mod
from dpfy.cli import main
from dpfy.errors import BudgetExhausted

FAST = ["--dataset", "digits", "--model", "logreg", "--epochs", "2", "--batch-size", "256",
        "--lr", "1.0", "--clip", "1.0", "--threads", "1", "--no-progress"]


def _raise_after(monkeypatch, epochs: int, error: BaseException) -> None:
    real, calls = trainer_mod.run_epoch, []

    def epoch(*args, **kwargs):
        calls.append(1)
        if len(calls) > epochs:
            raise error
        return real(*args, **kwargs)
    monkeypatch.setattr(trainer_mod, "run_epoch", epoch)


def test_ctrl_c_after_an_epoch_prints_the_resume_command(tmp_path, monkeypatch, capsys):
    out = tmp_path / "r"
    _raise_after(monkeypatch, 1, KeyboardInterrupt())
    assert main(["train", *FAST, "--out", str(out)]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0]
    assert f"dpfy train --resume {out}" in err[0]
    assert (tmp_path / "r.partial" / "checkpoint.pt").is_file()
    monkeypatch.undo()
    assert main(["train", "--resume", str(out), "--no-progress"]) == 0
    assert (out / "model.pt").is_file()


def test_budget_exhausted_is_one_line_and_exit_3(tmp_path, monkeypatch, capsys):
    _raise_after(monkeypatch, 0, BudgetExhausted("the run was planned for 12 steps"))
    assert main(["train", *FAST, "--out", str(tmp_path / "r")]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["dpfy train: budget exhausted: the run was planned for 12 steps"]
    assert list(tmp_path.iterdir()) == []               # nothing to resume: nothing left


@pytest.mark.parametrize("error, code", [(ValueError("x must be y"), 2),
                                         (KeyboardInterrupt(), 130)])
def test_other_commands_exit_codes(monkeypatch, capsys, error, code):
    import dpfy.cli.account as account

    def boom(args):
        raise error
    monkeypatch.setattr(account, "run", boom)
    assert main(["account", "--sample-rate", "0.1", "--steps", "1", "--noise-multiplier", "1",
                 "--delta", "1e-5"]) == code
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
