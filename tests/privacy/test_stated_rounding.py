"""Every (ε, δ) dpfy states is rounded *up*: the privacy report's headline and formal statement,
`dpfy account`'s sentence and `dpfy calibrate`'s reached ε never show a smaller ε or δ than the
accountant computed (a rounded-down pair is a stronger claim than the one proven).

`dpfy account` and `dpfy calibrate`'s side: tests/cli/test_stated_rounding_cli.py.

Before the fix the report printed ``f"{ε:.4g}"`` and ``f"{δ:.3g}"``: a run on 1438 examples
with δ = 1/N^1.1 = 3.3610e-4 read "(…, 0.000336)-differential privacy".
"""

from __future__ import annotations

import re

import pytest

from dpfy.privacy import Ledger
from dpfy.privacy.report import PrivacyReport

# δ = 1/N^1.1 for N = 1438 (dpfy train's default on digits) is 3.36097e-4: three significant
# digits rounded to nearest give 3.36e-4, below δ.
DELTA = 1438**-1.1
# Several run lengths, so that some ε has a fifth digit that rounds down at four (the steps are
# arbitrary; each pair is compared with its own computed ε).
STEPS = (7, 11, 13, 17, 19, 23)


def _pairs(text: str, prefix: str) -> list[tuple[float, float]]:
    found = re.findall(prefix + r"\(([0-9.e+-]+), ([0-9.e+-]+)\)", text)
    return [(float(e), float(d)) for e, d in found]


@pytest.mark.parametrize("steps", STEPS)
def test_the_report_states_epsilon_and_delta_rounded_up(steps):
    ledger = Ledger.homogeneous(sample_rate=0.05, noise_multiplier=1.1, steps=steps)
    report = PrivacyReport.from_ledger(ledger, delta=DELTA, accountant="rdp", num_points=3)
    (eps, delta), = _pairs(report.statement(), "satisfies ")
    assert eps >= report.epsilon and delta >= report.delta
    (eps_md, delta_md), = _pairs(report.to_markdown(), r"\*\*Training:\*\* ")
    assert eps_md >= report.epsilon and delta_md >= report.delta


@pytest.mark.parametrize("steps", STEPS)
def test_the_user_level_section_states_its_pairs_rounded_up(steps):
    """The ELS section's user-level pair, the example-level pair and the group-privacy bound
    (kε, k·e^{kε}·δ) are statements too: none shows less than its section data (before, ε to
    4 digits and δ to 3 to nearest: δ = 3.3610e-4 read 0.000336)."""
    from dpfy.privacy.ledger import Sampling
    from dpfy.privacy.user_level import user_level_section

    ledger = Ledger.homogeneous(sample_rate=0.05, noise_multiplier=1.1, steps=steps,
                                sampling=Sampling.ELS, max_examples_per_user=2,
                                dataset_size=50)
    section = user_level_section(ledger, delta=DELTA, accountant="rdp", num_users=50,
                                 num_examples=100, algorithm="ELS")
    (user_line,) = [s for s in section.lines if "User-level ε" in s]
    (group_line,) = [s for s in section.lines if "Group privacy instead" in s]
    (user,) = _pairs(user_line, "")
    (example, group) = _pairs(group_line, "")
    data = section.data
    assert user[0] >= data["epsilon_user"] and user[1] >= DELTA
    assert example[0] >= data["epsilon_example"] and example[1] >= DELTA
    assert group[0] >= data["group_privacy"]["epsilon"]
    assert group[1] >= data["group_privacy"]["delta"]


def test_rounding_up_ignores_the_float_noise_of_an_exact_value():
    """3 runs at δ = 1e-5 compose to k·δ = 3 × 1e-5, which floats compute as
    3.0000000000000004e-05 (one unit in the last place above 3e-05): it must read "3e-05", not
    "3.01e-05"; likewise 1 + 2^-52 reads "1". A real excess keeps rounding up: 1.00049 reads
    1.001 and 3e-05 · (1 + 1e-9) reads 3.01e-05 (1e-9 is far above the float noise, 2^-52)."""
    from dpfy.privacy.statement import rounded_up, stated_epsilon

    assert 3 * 1e-5 > 3e-05  # the float noise this is about
    assert rounded_up(3 * 1e-5, 3) == "3e-05"
    assert stated_epsilon(1 + 2**-52) == "1"
    assert stated_epsilon(1.00049) == "1.001"
    assert rounded_up(3e-05 * (1 + 1e-9), 3) == "3.01e-05"


def test_the_label_dp_guarantee_is_stated_rounded_up():
    """Label DP's pure ε is the sum of its releases' ε (here 0.61721 + 0.61720 = 1.23441, a
    5th digit that rounds down at 4): the guarantee reads 1.235, not 1.234."""
    from dpfy.label_dp.ledger import LabelLedger, LabelRelease

    ledger = LabelLedger()
    ledger.record(LabelRelease("rr", 0.61721, 10, 100))
    ledger.record(LabelRelease("rr", 0.61720, 10, 100))
    text = ledger.report()
    stated = float(re.search(r"pure ε-label-DP with ε = ([0-9.e+-]+),", text)[1])
    assert stated >= 0.61721 + 0.61720
    assert "ε = 0.6173." in text and "ε = 0.6172." in text  # each release, rounded up
