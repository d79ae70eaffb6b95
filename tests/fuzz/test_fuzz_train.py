"""Fuzzed ``dpfy train`` flags (issue 15 §3): a tiny valid run (digits, logistic regression,
one step per epoch) with one to three flags replaced by extremes, wrong types or junk.

Either the run finishes (``--out`` holds a finished run, no ``.partial``) or it fails in one
line with exit code 2 and leaves nothing behind: nothing half-written that looks finished.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fuzz.fuzz_support import FUZZ, LIMIT_S, check_cli, values

DIGITS_TRAIN = 1438  # digits' training split: the base batch takes it in one step
BASE = {"--dataset": "digits", "--model": "logreg", "--epochs": "1", "--batch-size": "1438",
        "--lr": "1", "--clip": "1", "--noise-multiplier": "1", "--accountant": "rdp",
        "--seed": "1", "--threads": "1"}
FLAGS = sorted(BASE) + ["--epsilon", "--delta", "--physical-batch-size", "--momentum",
                        "--weight-decay", "--optimizer", "--clipping", "--route", "--method",
                        "--public-validation", "--method-options"]
NAMED = {"--epsilon": ["1e-6", "1e9", "100", "nan", "inf"], "--delta": ["1e-300", "nan", "1"],
         "--noise-multiplier": ["1e-6", "1e6", "nan", "inf", "0"],
         "--batch-size": ["1", "0", "1437", "1439", "100000000000"],
         "--epochs": ["0", "1000000000", "-1"], "--lr": ["inf", "1e300", "nan"],
         "--clip": ["inf", "1e-300", "1e300", "nan"], "--method": ["nope", "noise_decay"],
         "--optimizer": ["adam", "rmsprop"], "--seed": ["-1", str(2**63)],
         "--threads": ["0", "100000", "1000000000"]}   # 100000: a segfault before the bound


def _argv(changes: dict[str, str], out) -> list[str]:
    flags = {**BASE, **changes}
    if "--epsilon" in changes and "--noise-multiplier" not in changes:
        del flags["--noise-multiplier"]
    argv = ["train", "--no-progress", "--out", str(out)]
    for k, v in flags.items():
        argv += [k, v]
    return argv


def _limit(changes: dict[str, str]) -> float:
    """CPU seconds a run may take: LIMIT_S, plus the honest work of a valid run longer than
    the base run's one step: 0.1 s per epoch beyond the first (a valid ``--epochs 623`` took
    28 CPU s, found by CI) and 0.02 s per step beyond one an epoch (``--batch-size 1`` is
    1,438 steps of one example, 5.6 CPU s on a loaded machine; about 2 ms a step). Both are
    capped, so the bound still catches a hang.
    """
    def number(flag: str, default: int) -> int:
        try:
            return int(changes.get(flag, str(default)))
        except ValueError:
            return default

    epochs = max(number("--epochs", 1), 1)
    batch = number("--batch-size", DIGITS_TRAIN)
    steps_per_epoch = -(-DIGITS_TRAIN // batch) if batch > 0 else 1
    extra_epochs = min(epochs - 1, 1200)
    extra_steps = min(extra_epochs + 1, 1200) * (steps_per_epoch - 1)
    return LIMIT_S + 0.1 * extra_epochs + 0.02 * min(extra_steps, 5000)


def check_train(changes: dict[str, str], tmp, capsys, suite: str) -> int:
    out = tmp / "run"
    code = check_cli(_argv(changes, out), capsys, suite, limit=_limit(changes))
    partial = out.with_name("run.partial")
    if code == 0:
        assert (out / "summary.json").is_file() and (out / "model.pt").is_file()
        assert not partial.exists() and not list(out.glob("checkpoint*"))
    else:
        assert not out.exists() and not partial.exists(), (changes, list(tmp.iterdir()))
    return code


@pytest.mark.parametrize("flag, value", [(f, v) for f, vs in NAMED.items() for v in vs])
def test_named_train_extremes(flag, value, tmp_path, capsys):
    check_train({flag: value}, tmp_path, capsys, "dpfy train (named extremes)")


@settings(max_examples=15, **FUZZ)
@given(changes=st.dictionaries(st.sampled_from(FLAGS), values, min_size=1, max_size=3))
def test_train_flags(changes, tmp_path_factory, capsys):
    check_train(changes, tmp_path_factory.mktemp("train"), capsys, "dpfy train")


@pytest.mark.slow
@settings(max_examples=300, **FUZZ)
@given(changes=st.dictionaries(st.sampled_from(FLAGS), st.one_of(
    values, st.sampled_from(sorted({v for vs in NAMED.values() for v in vs}))),
    min_size=1, max_size=3))
def test_train_flags_many(changes, tmp_path_factory, capsys):
    check_train(changes, tmp_path_factory.mktemp("train"), capsys, "dpfy train (slow)")
