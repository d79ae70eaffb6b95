"""The privacy report: the guide's checklist items are present and numbers come from the ledger."""

import json

import pytest

from dpfy.privacy import Ledger, Release, Sampling, epsilon
from dpfy.privacy.report import PrivacyReport, TuningCost, tier


def _ledger():
    ledger = Ledger(dataset_size=60000)
    ledger.record_step(sampling=Sampling.POISSON, sample_rate=256 / 60000,
                       releases=[Release("gradient", 1.1), Release("quantile_count", 20.0)],
                       count=200)
    return ledger


def test_report_files_and_checklist(tmp_path):
    ledger = _ledger()
    report = PrivacyReport.from_ledger(
        ledger, delta=1e-6, accountant="pld", released="final model weights",
        tuning=TuningCost("composition of 5 runs", 3.0, 1e-6), group_size=2,
        model_description="MLP", layer_table=[{"layer": "fc1", "route": "ghost"}])
    paths = report.write(tmp_path)
    assert {p.name for p in paths.values()} == {"privacy_report.md", "privacy_report.json",
                                                "epsilon_over_steps.png"}
    assert paths["plot"].read_bytes()[:4] == b"\x89PNG"
    md = paths["markdown"].read_text()
    for item in ("DP setting", "Data accesses covered", "Released", "Unit of privacy",
                 "Adjacency", "Accountant", "Sampling", "Without amplification", "Training",
                 "Tuning", "δ convention", "ε tier", "quantile_count", "approximation"):
        assert item in md, item
    data = json.loads(paths["json"].read_text())
    assert data["epsilon"] == pytest.approx(epsilon(ledger, delta=1e-6, accountant="pld"))
    assert data["epsilons"]["rdp"] == pytest.approx(epsilon(ledger, delta=1e-6))
    assert "approximation" in data["accountant_labels"]["gdp"]
    assert data["adjacency"] == "add_or_remove"
    assert data["tuning"]["epsilon"] == 3.0
    assert data["delta_convention"]["ok"] is True          # 1e-6 ≤ 60000^-1.1 = 5.5e-6
    shares = {m["mechanism"]: m["noise_share"] for m in data["mechanisms"]}
    # shares of Σσ⁻²: 1.1⁻² : 20⁻² (Galli et al. 2024, Proposition 1)
    assert shares["gradient"] == pytest.approx(1.1 ** -2 / (1.1 ** -2 + 20.0 ** -2))
    assert data["curve"][-1][0] == 200


def test_shuffle_report_says_no_amplification_and_replace_one():
    ledger = Ledger.homogeneous(sample_rate=0.01, noise_multiplier=2.0, steps=300,
                                sampling=Sampling.SHUFFLE, dataset_size=10000)
    report = PrivacyReport.from_ledger(ledger, delta=1e-4, accountant="rdp",
                                       sampling_note="dpfy's ShuffleSampler, b = 100")
    md = report.to_markdown()
    assert "No amplification" in md and "replace-one" in md and "ShuffleSampler" in md
    assert report.to_dict()["delta_convention"]["ok"] is False   # 1e-4 > 10000^-1.1 = 4e-5


def test_shuffle_report_names_dpfys_own_permutation_sampler():
    # SHUFFLE is recorded only by dpfy's ShuffleSampler (user samplers are refused), so the
    # report must not say the batches came from the user's loader.
    ledger = Ledger.homogeneous(sample_rate=0.01, noise_multiplier=2.0, steps=3,
                                sampling=Sampling.SHUFFLE, dataset_size=10000)
    line = next(x for x in PrivacyReport.from_ledger(ledger, delta=1e-5, accountant="rdp")
                .to_markdown().splitlines() if x.startswith("  - `shuffle`"))
    assert "the user's loader" not in line
    for words in ("dpfy's own permutation sampler", "one random permutation per pass",
                  "cut into batches of b", "restarts continue the pass"):
        assert words in line, words


def test_methods_and_public_data_are_stated_and_survive_the_json(tmp_path):
    methods = [{"name": "noise_decay", "releases": "the clipped-gradient sum, σ_t."},
               {"name": "plateau", "releases": ""}]
    public = "the user declared the test split public (--public-validation test; 5 examples)"
    report = PrivacyReport.from_ledger(_ledger(), delta=1e-6, methods=methods,
                                       public_data=public)
    md = report.to_markdown()
    covers = md[md.index("## 2."):md.index("## 3.")]
    assert "  - `noise_decay` — releases per step: the clipped-gradient sum, σ_t." in covers
    assert "  - `plateau` — releases per step: not stated by the method." in covers
    assert f"- **Public data (not protected):** {public}." in covers
    paths = report.write(tmp_path)
    saved = json.loads(paths["json"].read_text())
    assert saved["methods"] == methods and saved["public_data"] == public
    again = PrivacyReport.from_ledger(_ledger(), delta=1e-6,
                                      **PrivacyReport.context_from_dict(saved))
    assert again.to_markdown() == md
    plain = PrivacyReport.from_ledger(_ledger(), delta=1e-6).to_markdown()
    assert "Adaptive methods" not in plain and "Public data" not in plain
    with pytest.raises(ValueError, match="methods must be rows with a non-empty 'name'"):
        PrivacyReport.from_ledger(_ledger(), delta=1e-6, methods=[{"releases": "x"}])


def test_gdp_report_is_labelled_approximation():
    report = PrivacyReport.from_ledger(_ledger(), delta=1e-6, accountant="gdp")
    assert "approximation" in report.statement()
    assert report.to_dict()["approximate"] is True


def test_tiers():
    assert (tier(0.9), tier(5), tier(11)) == (1, 2, 3)


def test_report_rejects_bad_input():
    with pytest.raises(ValueError, match="accountant"):
        PrivacyReport.from_ledger(_ledger(), delta=1e-6, accountant="moments")
    with pytest.raises(ValueError, match="ledger"):
        PrivacyReport.from_ledger(Ledger(), delta=1e-6)


def test_extra_sections_render_and_round_trip_through_json():
    """A feature's extra section (ReportSection) appears in the Markdown after the model
    section and survives privacy_report.json, so `dpfy report` re-renders it byte for byte."""
    import json
    from dpfy.privacy.report import ReportSection
    ledger = Ledger(dataset_size=1000)
    ledger.record_step(sampling=Sampling.POISSON, sample_rate=0.01,
                       releases=[Release("gradient", 1.0)], count=5)
    sec = ReportSection("Empirical audit", ("- lower bound: 0.5",), {"lower_bound": 0.5})
    rep = PrivacyReport.from_ledger(ledger, delta=1e-5, sections=[sec])
    md = rep.to_markdown()
    assert "## Empirical audit\n\n- lower bound: 0.5\n" in md
    saved = json.loads(json.dumps(rep.to_dict()))
    again = PrivacyReport.from_ledger(ledger, delta=1e-5,
                                      **PrivacyReport.context_from_dict(saved))
    assert again.to_markdown() == md
    assert again.sections[0].data == {"lower_bound": 0.5}
