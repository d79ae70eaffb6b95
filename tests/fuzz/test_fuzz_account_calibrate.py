"""Fuzzed flags of ``dpfy account`` and ``dpfy calibrate`` (issue 15 §3).

Each example is a random subset of the commands' flags with values drawn from the issue's
extremes (ε 1e-6 and 1e9, σ 1e-6 and 1e6, q 1e-12 and 1, δ 1e-300), any float (NaN, ±inf),
huge integers and junk text; :func:`conftest.check_cli` asserts the contract.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fuzz.fuzz_support import FUZZ, check_cli, values

SHAPE = ["--sample-rate", "--steps", "--batch-size", "--dataset-size", "--epochs"]
ACCOUNT = SHAPE + ["--noise-multiplier", "--delta", "--epsilon"]
CALIBRATE = SHAPE + ["--noise-multiplier", "--delta", "--target-epsilon", "--grid-runs"]
CHOICES = {"--accountant": ["rdp", "gdp", "GDP", ""], "--sampling":
           ["poisson", "shuffle", "fixed_size", "none", "x"]}
SWITCHES = ["--json", "--approximate"]

# Known, not fixed here (dpfy/privacy/accountants.py is not this change's file): the PLD
# accountant checks the grid of one step (check_pld_grid), not of the composition, so 1e14
# steps ask numpy for 221 TiB (MemoryError), and q = 0.5, σ = 0.3, 1e4 steps took 160 s.
PLD_GRID = "the random suite keeps PLD composition sizes small (refusal tested by the named cases)"

# Inputs the issue names explicitly, each run once in the default suite.
NAMED = [
    ["account", "--sample-rate", "1e-12", "--steps", "1000", "--noise-multiplier", "1",
     "--delta", "1e-300"],
    ["account", "--sample-rate", "1", "--steps", "1000", "--noise-multiplier", "1e-6",
     "--delta", "1e-5"],
    ["account", "--sample-rate", "0.01", "--steps", "1000", "--noise-multiplier", "1e6",
     "--delta", "1e-5", "--accountant", "pld"],
    ["account", "--sample-rate", "0.01", "--steps", "1000", "--noise-multiplier", "1e-6",
     "--delta", "1e-5", "--accountant", "pld"],
    ["account", "--sample-rate", "0.01", "--steps", "100000000000000",
     "--noise-multiplier", "1", "--delta", "1e-5", "--accountant", "pld"],
    ["account", "--sample-rate", "0.5", "--steps", "10000",
     "--noise-multiplier", "0.3", "--delta", "1e-5", "--accountant", "pld"],
    ["account", "--sample-rate", "0.01", "--steps", "1000", "--noise-multiplier", "1",
     "--epsilon", "1e9"],
    ["account", "--sample-rate", "0.01", "--steps", "1000", "--noise-multiplier", "1",
     "--epsilon", "1e-6", "--accountant", "pld"],
    ["calibrate", "--target-epsilon", "1e-6", "--delta", "1e-5", "--sample-rate", "0.01",
     "--steps", "1000"],
    ["calibrate", "--target-epsilon", "1e9", "--delta", "1e-5", "--sample-rate", "0.01",
     "--steps", "1000"],
    ["calibrate", "--target-epsilon", "3", "--delta", "1e-300", "--sample-rate", "1e-12",
     "--steps", "1000", "--accountant", "pld"],
    ["calibrate", "--target-epsilon", "3", "--delta", "1e-5", "--noise-multiplier", "1e6",
     "--steps", "1000"],
    ["calibrate", "--target-epsilon", "3", "--delta", "1e-5", "--noise-multiplier", "1e-6",
     "--sample-rate", "1"],
    ["calibrate", "--target-epsilon", "nan", "--delta", "1e-5", "--sample-rate", "0.01",
     "--steps", "10"],
    # found by test_calibrate_flags: (μ/q)² overflowed in the starting guess (OverflowError)
    ["calibrate", "--target-epsilon", "1e-300", "--delta", "1e-6", "--sample-rate", "1e-300",
     "--steps", "1"],
    ["account", "--sample-rate", "inf", "--steps", "10", "--noise-multiplier", "1",
     "--delta", "1e-5"],
    ["account", "--sample-rate", "0.1", "--steps", "10", "--noise-multiplier", "nan",
     "--delta", "1e-5"],
    ["account", "--sample-rate", "0.1", "--steps", "10", "--noise-multiplier", "1",
     "--delta", "nan"],
    ["account", "--sample-rate", "0.1", "--steps", "10", "--noise-multiplier", "inf",
     "--delta", "1e-5"],
]


@pytest.mark.parametrize("argv", NAMED, ids=lambda a: " ".join(a[1:]))
def test_named_extremes(argv, capsys):
    check_cli(argv, capsys, f"dpfy {argv[0]} (named extremes)")


def _argv(command: str, flags: list[str]) -> st.SearchStrategy[list[str]]:
    @st.composite
    def build(draw):
        argv = [command]
        for flag in draw(st.lists(st.sampled_from(flags), unique=True)):
            argv += [flag, draw(values)]
        for flag, options in CHOICES.items():
            if draw(st.booleans()):
                argv += [flag, draw(st.sampled_from(options))]
        argv += [s for s in SWITCHES if draw(st.booleans())]
        return argv
    return build()


# Mostly well-formed: each required flag present with a plausible or extreme value.
plausible = st.sampled_from(["1e-300", "1e-12", "1e-6", "0.001", "0.01", "0.5", "1", "3",
                             "10", "100", "1000", "1e6", "1e9"])


@st.composite
def _shaped(draw, command: str):
    target = "--delta" if command == "account" else "--target-epsilon"
    argv = [command, target, draw(plausible)]
    if command == "calibrate" or draw(st.booleans()):
        argv += ["--delta", draw(plausible)] if command == "calibrate" else []
    if command == "account" and draw(st.booleans()):
        argv = [command, "--epsilon", draw(plausible)]
    if draw(st.booleans()):
        argv += ["--sample-rate", draw(plausible), "--steps", draw(st.sampled_from(
            ["1", "10", "1000", "100000", "10000000000"]))]
    else:
        argv += ["--batch-size", draw(plausible), "--dataset-size", draw(plausible),
                 "--epochs", draw(plausible)]
    if command == "account" or draw(st.booleans()):
        argv += ["--noise-multiplier", draw(plausible)]
    argv += ["--accountant", "rdp"]        # PLD: see PLD_GRID
    return argv


@settings(max_examples=40, **FUZZ)
@given(argv=st.one_of(_argv("account", ACCOUNT), _shaped("account")))
def test_account_flags(argv, capsys):
    check_cli(argv, capsys, "dpfy account")


@settings(max_examples=40, **FUZZ)
@given(argv=st.one_of(_argv("calibrate", CALIBRATE), _shaped("calibrate")))
def test_calibrate_flags(argv, capsys):
    check_cli(argv, capsys, "dpfy calibrate")


@pytest.mark.slow
@settings(max_examples=1000, **FUZZ)
@given(argv=st.one_of(_argv("account", ACCOUNT), _shaped("account"),
                      _argv("calibrate", CALIBRATE), _shaped("calibrate")))
def test_account_and_calibrate_flags_many(argv, capsys):
    check_cli(argv, capsys, f"dpfy {argv[0]} (slow)")


@pytest.mark.parametrize("sigma, outcome", [
    ("1e-300", 2),    # was OverflowError in StepGroup.effective_noise_multiplier (σ**-2)
    ("1e-100", 0),    # the smallest σ the accountants handle: ε ≈ 1.65e200 by RDP
    ("inf", 2),       # was ZeroDivisionError ((Σ σ⁻²)^(−1/2) with Σ = 0)
    ("1e154", 2),     # σ² overflows in the accountants (found by the ledger fuzz)
    ("1e100", 0),     # the largest σ accepted: ε = 0 to every printed digit
])
def test_tiny_and_infinite_noise_multipliers(sigma, outcome, capsys):
    argv = ["account", "--delta", "1e-5", "--sample-rate", "0.5", "--steps", "3",
            "--accountant", "rdp", "--noise-multiplier", sigma]   # the outcomes are RDP's
    assert check_cli(argv, capsys, "dpfy account (named extremes)") == outcome
