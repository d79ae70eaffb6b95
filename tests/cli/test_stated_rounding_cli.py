"""`dpfy account`'s sentence and `dpfy calibrate`'s reached ε are rounded *up*: they never show
a smaller ε or δ than the accountant computed, which the same command's JSON holds (the report's
side: tests/privacy/test_stated_rounding.py, where the derivation of the δ and steps below is).
"""

from __future__ import annotations

import json
import re

import pytest

from dpfy.cli import main

DELTA = 1438**-1.1  # 3.36097e-4, which three digits rounded to nearest would state as 3.36e-4
STEPS = (7, 11, 13, 17, 19, 23)  # run lengths: some ε has a fifth digit that rounds down at four


def test_dpfy_account_states_a_computed_delta_rounded_up(capsys):
    # --epsilon makes dpfy compute δ; the sentence must not show less than the JSON's δ.
    for eps in (0.5, 0.7, 0.9, 1.1, 1.3):
        assert main(["account", "--sample-rate", "0.05", "--noise-multiplier", "1.1",
                     "--steps", "13", "--epsilon", str(eps), "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        stated = re.match(r"ε = ([0-9.e+-]+) at δ = ([0-9.e+-]+) ", out["statement"])
        assert stated is not None, out["statement"]
        assert float(stated[2]) >= out["delta"], (out["statement"], out["delta"])


@pytest.mark.parametrize("steps", STEPS)
def test_dpfy_account_states_a_computed_epsilon_rounded_up(capsys, steps):
    assert main(["account", "--sample-rate", "0.05", "--noise-multiplier", "1.1", "--steps",
                 str(steps), "--delta", str(DELTA), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    stated = re.match(r"ε = ([0-9.e+-]+) at δ = ([0-9.e+-]+) ", out["statement"])
    assert stated is not None, out["statement"]
    assert float(stated[1]) >= out["epsilon"] and float(stated[2]) >= out["delta"]


def test_dpfy_calibrate_states_the_reached_epsilon_rounded_up(capsys):
    # The calibrated σ reaches some ε ≤ target (the JSON's "epsilon"); the sentence must not
    # show less (before the fix: 1.9962 read "1.996").
    args = ["calibrate", "--target-epsilon", "2", "--delta", "1e-5", "--sample-rate", "0.004",
            "--steps", "900"]
    assert main([*args, "--json"]) == 0
    reached = json.loads(capsys.readouterr().out)["epsilon"]
    assert main(args) == 0
    stated = re.search(r"spend ε = ([0-9.e+-]+) ≤", capsys.readouterr().out)
    assert stated is not None and float(stated[1]) >= reached
