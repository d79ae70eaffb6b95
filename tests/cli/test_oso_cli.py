"""`dpfy train --method oso` (OSO-DPSGD, Galli, Palamidessi & Cucinotta 2024): the ledger records
both releases of each step, and a bad rule is refused in one line. (The method:
tests/adaptive/test_oso.py.)"""

from __future__ import annotations

import json
import warnings

from dpfy.adaptive.oso import THRESHOLD_GRADIENT
from dpfy.cli import main


BASE = ["train", "--dataset", "digits", "--model", "logreg", "--noise-multiplier", "1",
        "--epochs", "1", "--accountant", "rdp", "--batch-size", "128", "--no-progress"]


def test_dpfy_train_method_oso_records_both_releases(tmp_path, capsys):
    out = tmp_path / "run"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        code = main(BASE + ["--out", str(out), "--method", "oso",
                            "--method-options", "clip_rate=0.01", "rule=sign"])
    assert code == 0
    ledger = json.loads((out / "ledger.json").read_text())
    assert {r["mechanism"] for g in ledger["groups"] for r in g["releases"]} == {
        "gradient", THRESHOLD_GRADIENT}
    code = main(BASE + ["--out", str(tmp_path / "bad"), "--method", "oso",
                        "--method-options", "rule=bogus"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "rule must be one of" in err and len(err.splitlines()) == 1
