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
    """CPU seconds a run may take: LIMIT_S, plus 0.1 s per epoch asked for beyond the first.

    The base run is one step per epoch, so a valid ``--epochs 623`` is 623 honest steps
    (about 28 CPU s here, found by CI); the bound still catches a hang, as it is capped.
    """
    try:
        epochs = int(changes.get("--epochs", "1"))
    except ValueError:
        epochs = 1
    return LIMIT_S + 0.1 * min(max(epochs - 1, 0), 1200)


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
