"""The privacy report of a user-level run names the unit (issue 26 §1): the first sentence,
the unit line and adjacency, the JSON, and the "Unit of privacy: users" section with ELS's
group-privacy bound computed here with dp_accounting (Vadhan 2017, Lemma 2.2: (kε, k·e^{kε}·δ))."""

from __future__ import annotations

import json
import math

import dp_accounting
import pytest
from dp_accounting.rdp import rdp_privacy_accountant

from dpfy.privacy import Ledger, Sampling
from dpfy.privacy.report import PrivacyReport
from dpfy.privacy.user_level import user_level_section

DELTA = 1e-4
UNIT = "one user, with all of their examples"


def _uls() -> Ledger:
    return Ledger.homogeneous(sample_rate=0.1, noise_multiplier=1.5, steps=30,
                              sampling=Sampling.ULS, dataset_size=200)


def test_a_user_level_report_names_the_unit_everywhere():
    report = PrivacyReport.from_ledger(_uls(), delta=DELTA, accountant="rdp", num_points=5)
    assert report.statement().startswith(f"Training satisfies (")
    assert f"for {UNIT} under add-or-remove adjacency" in report.statement()
    md = report.to_markdown()
    assert f"**Unit of privacy:** {UNIT}" in md
    assert "add-or-remove one user: the datasets differ by all of one user's examples" in md
    assert "δ = 0.0001 ≤ 1/U^1.1" in md and "U = 200 users" in md
    d = json.loads(json.dumps(report.to_dict()))
    assert d["unit"]["name"] == "user" and d["unit"]["description"] == UNIT
    assert d["unit_of_privacy"] == UNIT and d["samplings"] == ["uls"]
    example = PrivacyReport.from_ledger(
        Ledger.homogeneous(sample_rate=0.1, noise_multiplier=1.5, steps=30), delta=DELTA,
        accountant="rdp", num_points=5)
    assert example.to_dict()["unit"]["name"] == "example"
    assert "for one example under" in example.statement()


def test_a_user_level_ledger_refuses_a_report_that_says_example():
    with pytest.raises(ValueError, match="unit_of_privacy"):
        PrivacyReport.from_ledger(_uls(), delta=DELTA, accountant="rdp",
                                  unit_of_privacy="one example", num_points=5)


def test_the_els_section_shows_the_group_privacy_bound_beside_the_user_level_epsilon():
    q, sigma, steps, k = 0.05, 4.0, 20, 2
    ledger = Ledger.homogeneous(sample_rate=q, noise_multiplier=sigma, steps=steps,
                                sampling=Sampling.ELS, max_examples_per_user=k,
                                dataset_size=50)
    section = user_level_section(ledger, delta=DELTA, accountant="rdp", num_users=50,
                                 num_examples=180, algorithm="ELS")
    acc = rdp_privacy_accountant.RdpAccountant()
    acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)),
                steps)
    example = acc.get_epsilon(DELTA)
    group = section.data["group_privacy"]
    assert section.data["epsilon_example"] == pytest.approx(example, rel=1e-9)
    assert group["epsilon"] == pytest.approx(k * example, rel=1e-9)
    assert group["delta"] == pytest.approx(k * math.exp(k * example) * DELTA, rel=1e-9)
    text = "\n".join(section.lines)
    assert UNIT in text and "k = 2" in text and "Group privacy instead" in text
    assert section.data["unit"] == "user" and section.data["num_users"] == 50
