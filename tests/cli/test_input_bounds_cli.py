"""Issue 10 §4 on the command line: inputs are bounded before the accountant runs.

Before: `dpfy train --epsilon 1e9` / `--noise-multiplier 1e-4` ended in a TiB allocation,
`--epsilon 1000` hung for minutes leaving a `.partial` directory, and `dpfy account
--noise-multiplier 0.05 --accountant pld` / `dpfy calibrate --target-epsilon 200 --accountant
pld` took over a minute. Now each is a one-line error with the fix and exit code 2, in seconds.
Each case is timed in-process against a wall-clock limit generous for a loaded CI machine. (The
library's bounds: tests/privacy/test_input_bounds.py.)
"""

import time

import pytest

from dpfy.cli import main

LIMIT_S = 20            # generous for a loaded 2-core CI machine; the errors take < 1 s
TRAIN = ["train", "--dataset", "digits", "--model", "logreg", "--epochs", "1", "--no-progress",
         "--threads", "1", "--batch-size", "256"]
RUN = ["account", "--sample-rate", "0.005", "--steps", "20000", "--delta", "1e-5"]


def _dpfy(args, cwd, monkeypatch, capsys):
    """(exit code, stderr lines, seconds) of ``dpfy args`` run in ``cwd``."""
    monkeypatch.chdir(cwd)
    capsys.readouterr()
    start = time.monotonic()
    code = main(args)
    seconds = time.monotonic() - start
    return code, capsys.readouterr().err.strip().splitlines(), seconds


@pytest.mark.parametrize("args, needle", [
    (TRAIN + ["--epsilon", "1e9", "--out", "r"], "epsilon must be <= 100"),
    (TRAIN + ["--epsilon", "1000", "--out", "r"], "epsilon must be <= 100"),
    (TRAIN + ["--noise-multiplier", "1e-4", "--out", "r"], "--noise-multiplier must be >= 0.293"),
    (RUN + ["--noise-multiplier", "0.05", "--accountant", "pld"],
     "--noise-multiplier must be >= 0.293"),
    (["calibrate", "--target-epsilon", "200", "--delta", "1e-5", "--sample-rate", "0.004",
      "--steps", "3000", "--accountant", "pld"], "--target-epsilon must be <= 100"),
])
def test_cli_refuses_in_seconds_with_one_line(tmp_path, monkeypatch, capsys, args, needle):
    code, err, seconds = _dpfy(args, tmp_path, monkeypatch, capsys)
    assert code == 2 and len(err) == 1 and needle in err[0], err
    assert "--accountant rdp" in err[0] or "Lower" in err[0]                 # names the fix
    assert seconds < LIMIT_S
    assert not (tmp_path / "r.partial").exists()     # a refused run leaves nothing behind


def test_a_refused_run_does_not_block_the_next_one(tmp_path, monkeypatch, capsys):
    assert _dpfy(TRAIN + ["--epsilon", "1000", "--out", "r"], tmp_path, monkeypatch,
                 capsys)[0] == 2
    code, err, _ = _dpfy(TRAIN + ["--noise-multiplier", "1", "--accountant", "rdp", "--out", "r"],
                         tmp_path, monkeypatch, capsys)
    assert code == 0, err
    assert (tmp_path / "r" / "model.pt").is_file()


def test_a_target_epsilon_below_the_accountants_resolution_is_refused_at_once():
    """ε = 1e-12 used to 'calibrate' σ ≈ 6e6, where dp_accounting's RDP reports ε = 0 from a
    negative Rényi divergence (rounding): a σ resting on rounding error. Refused in one line."""
    import time

    from dpfy.cli import main
    start = time.process_time()
    code = main(["calibrate", "--target-epsilon", "1e-12", "--delta", "1e-12", "--batch-size",
                 "3", "--dataset-size", "100", "--epochs", "3", "--accountant", "rdp"])
    assert code == 2 and time.process_time() - start < 1.0
