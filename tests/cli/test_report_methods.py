"""The report of a ``dpfy train --method`` run names what ran, and the data declared public.

Two tiny digits runs (logreg, 1 epoch, batch 128), shared by the tests of this file:
- ``noise_decay`` chained with ``quantile``: both names, in chain order, with what each releases
  per step; the quantile count is a row of the mechanisms table with its share of the noise
  budget, derived here from the ledger's raw noise multipliers;
- ``plateau`` with ``--public-validation test``: the report says that the user declared the test
  split public, how many examples it has, and that its accuracy drove the noise schedule; the
  ledger holds no release for it (it is public, not released).
``dpfy report RUN_DIR`` re-renders both reports byte for byte from privacy_report.json.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from dpfy.cli import main
from dpfy.cli.methods import method_rows
from dpfy.data import load_dataset

BASE = ["train", "--dataset", "digits", "--model", "logreg", "--epochs", "1",
        "--batch-size", "128", "--threads", "1", "--no-progress"]
RUNS = {   # the chain at ε = 0.5: larger σ's, whose PLD calibration is ~4× quicker than at 2
    "chain": ["--epsilon", "0.5", "--method", "noise_decay", "--method", "quantile",
              "--method-options", "noise_decay.kind=exponential", "noise_decay.rate=0.3"],
    "plateau": ["--epsilon", "2", "--method", "plateau", "--method-options", "initial=3",
                "--public-validation", "test"],
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("report_methods")
    out = {}
    for name, flags in RUNS.items():
        out[name] = root / name
        assert main(BASE + flags + ["--out", str(out[name])]) == 0
    return out


def _labels(name: str) -> list[str]:
    """What ``dpfy methods`` says the method releases per step, without its example run's
    numbers (sensitivity and σ are those of the run the report is about)."""
    text = next(r["releases"] for r in method_rows() if r["name"] == name)
    return [part.split(" (sensitivity")[0] for part in text.split("; ")]


def _section(md: str, title: str) -> str:
    start = md.index(title)
    end = md.find("\n## ", start + 1)
    return md[start:end if end >= 0 else None]


def test_chained_methods_are_named_in_order_with_their_releases(runs, capsys):
    md = (runs["chain"] / "privacy_report.md").read_text()
    covers = _section(md, "## 2. What the guarantee covers")
    decay, quantile = covers.index("`noise_decay`"), covers.index("`quantile`")
    assert decay < quantile                                   # chain order
    for name in ("noise_decay", "quantile"):
        assert _labels(name) and all(label in covers for label in _labels(name))
    assert "Public data" not in md                            # nothing was declared public
    saved = json.loads((runs["chain"] / "privacy_report.json").read_text())
    assert [m["name"] for m in saved["methods"]] == ["noise_decay", "quantile"]
    assert all(m["releases"].rstrip(".") in covers for m in saved["methods"])
    assert saved["public_data"] is None
    capsys.readouterr()


def test_the_quantile_count_is_a_mechanism_with_its_noise_share(runs):
    ledger = json.loads((runs["chain"] / "ledger.json").read_text())
    inv_var: dict[str, float] = {}
    for g in ledger["groups"]:
        for r in g["releases"]:
            inv_var[r["mechanism"]] = (inv_var.get(r["mechanism"], 0.0)
                                       + g["count"] * r["noise_multiplier"] ** -2)
    assert set(inv_var) == {"gradient", "unclipped_count"}
    # Shares of Σ_t Σ_i σ_{t,i}⁻² (releases on one batch compose as ν⁻² = Σ ν_i⁻²).
    expected = inv_var["unclipped_count"] / sum(inv_var.values())
    table = _section((runs["chain"] / "privacy_report.md").read_text(), "## 5. Mechanisms")
    row = next(line for line in table.splitlines() if line.startswith("| unclipped_count |"))
    assert row.split("|")[4].strip() == f"{expected:.1%}"
    saved = json.loads((runs["chain"] / "privacy_report.json").read_text())
    share = {m["mechanism"]: m["noise_share"] for m in saved["mechanisms"]}
    assert math.isclose(share["unclipped_count"], expected, rel_tol=1e-12)


def test_public_validation_is_stated_plainly(runs):
    md = (runs["plateau"] / "privacy_report.md").read_text()
    covers = _section(md, "## 2. What the guarantee covers")
    assert "`plateau`" in covers and all(label in covers for label in _labels("plateau"))
    line = next(x for x in covers.splitlines() if x.startswith("- **Public data"))
    num_test = len(load_dataset("digits").test)               # the split the run evaluated on
    for words in ("the user declared the test split public", f"{num_test} examples",
                  "--public-validation test", "does not cover it as private data",
                  "must not contain private data", "read by `plateau`", "the noise schedule"):
        assert words in line, words
    # public, so not a release: the ledger holds the gradient and nothing else
    ledger = json.loads((runs["plateau"] / "ledger.json").read_text())
    assert {r["mechanism"] for g in ledger["groups"] for r in g["releases"]} == {"gradient"}
    saved = json.loads((runs["plateau"] / "privacy_report.json").read_text())
    assert saved["public_data"] in line and [m["name"] for m in saved["methods"]] == ["plateau"]


@pytest.mark.parametrize("name", sorted(RUNS))
def test_dpfy_report_re_renders_the_same_bytes(runs, name, capsys):
    report = runs[name] / "privacy_report.md"
    written = report.read_bytes()
    report.unlink()
    assert main(["report", str(runs[name])]) == 0
    assert report.read_bytes() == written
    capsys.readouterr()
