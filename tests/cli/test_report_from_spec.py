"""`dpfy report RUN_DIR` without a saved report: the sampling note and the unit of privacy come
from the run spec in config.json (issue 37); a run directory without one renders as before."""

from __future__ import annotations

import json

from dpfy.cli import main
from dpfy.privacy import Ledger
from dpfy.privacy.events import Poisson, Shuffled, UserLevelSampling
from dpfy.privacy.ledger import Sampling
from dpfy.spec import RunSpec, SamplingSpec, UserUnit


def _run_dir(tmp_path, ledger: Ledger, spec: RunSpec | None) -> None:
    (tmp_path / "ledger.json").write_text(ledger.to_json())
    config = {"delta": 1e-5, **({"spec": spec.to_dict()} if spec is not None else {})}
    (tmp_path / "config.json").write_text(json.dumps(config))


def _report(tmp_path, capsys) -> dict:
    assert main(["report", str(tmp_path)]) == 0
    capsys.readouterr()
    return json.loads((tmp_path / "privacy_report.json").read_text())


def test_a_shuffled_run_is_stated_from_its_spec(tmp_path, capsys):
    ledger = Ledger.homogeneous(sample_rate=0.01, noise_multiplier=1.0, steps=100,
                                dataset_size=10000, sampling=Sampling.SHUFFLE)
    spec = RunSpec(sampling=SamplingSpec(Shuffled)).with_sampling(
        Shuffled(0.01, dataset_size=10000))
    _run_dir(tmp_path, ledger, spec)
    report = _report(tmp_path, capsys)
    note = "Shuffled passes (one per epoch) by dpfy's sampler, q = 0.01"
    assert report["sampling_note"] == note and report["unit_of_privacy"] == "one example"
    assert note in (tmp_path / "privacy_report.md").read_text()


def test_a_user_level_run_is_stated_per_user(tmp_path, capsys):
    ledger = Ledger.homogeneous(sample_rate=0.1, noise_multiplier=1.0, steps=100,
                                dataset_size=1000, sampling=Sampling.ULS)
    spec = RunSpec(unit=UserUnit("uls")).with_sampling(UserLevelSampling(0.1, dataset_size=1000))
    _run_dir(tmp_path, ledger, spec)
    report = _report(tmp_path, capsys)
    assert report["sampling_note"] == "Poisson sampling by dpfy's sampler, q = 0.1 (per user)"
    assert report["unit_of_privacy"] == "one user, with all of their examples"


def test_a_run_directory_without_a_spec_renders_as_before(tmp_path, capsys):
    ledger = Ledger.homogeneous(sample_rate=0.01, noise_multiplier=1.0, steps=100,
                                dataset_size=10000)
    _run_dir(tmp_path, ledger, None)
    report = _report(tmp_path, capsys)
    assert report["sampling_note"] is None and report["unit_of_privacy"] == "one example"


def test_the_saved_reports_note_is_kept(tmp_path, capsys):
    ledger = Ledger.homogeneous(sample_rate=0.01, noise_multiplier=1.0, steps=100,
                                dataset_size=10000)
    _run_dir(tmp_path, ledger, RunSpec().with_sampling(
        Poisson(0.01, dataset_size=10000)))
    (tmp_path / "privacy_report.json").write_text(json.dumps(
        {"sampling_note": "Poisson sampling by dpfy's sampler, q = 0.01, 100 steps per epoch",
         "accountant": "pld"}))
    report = _report(tmp_path, capsys)
    assert report["sampling_note"].endswith(", 100 steps per epoch")
