"""Issue 10 §1.1 and §4: what a finished run directory publishes.

- Without --seed, re-running training from everything in the run directory (checkpoints are
  deleted when a run finishes) does not reproduce model.pt: no seed was published.
- No published file holds a seed, given or drawn.
- With --seed, the report's first lines warn that the seed undoes the privacy.
- ``dpfy report RUN_DIR`` re-renders privacy_report.md byte for byte.
"""

import secrets
from pathlib import Path

import torch

from dpfy.cli import main

TINY = ["--dataset", "digits", "--model", "logreg", "--epochs", "1", "--batch-size", "256",
        "--lr", "1.0", "--clip", "1.0", "--threads", "1", "--no-progress"]
SECRET_INIT_SEED = 4242424242424242      # what the trainer's OS draw returns in the test
GIVEN_SEED = 987654321


def _published_bytes(run: Path) -> dict[str, bytes]:
    files = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    assert "checkpoint.pt" not in files                     # deleted when the run finished
    return files


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=True)


def _contains(files: dict[str, bytes], number: int) -> list[str]:
    return [name for name, raw in files.items() if str(number).encode() in raw]


def test_rerun_from_the_published_directory_does_not_reproduce_the_model(tmp_path, monkeypatch,
                                                                         capsys):
    # Every OS draw through `secrets` is pinned to a recognisable number so the test can look
    # for it in the published files.
    monkeypatch.setattr(secrets, "randbits", lambda k: SECRET_INIT_SEED)
    first = tmp_path / "published"
    assert main(["train", *TINY, "--out", str(first)]) == 0
    files = _published_bytes(first)
    assert _contains(files, SECRET_INIT_SEED) == []
    monkeypatch.undo()
    # An attacker holding the run directory re-runs it from its config.json.
    again = tmp_path / "attacker"
    assert main(["train", "--config", str(first / "config.json"), "--no-progress",
                 "--out", str(again)]) == 0
    a, b = _weights(first / "model.pt"), _weights(again / "model.pt")
    assert a.keys() == b.keys()
    assert any(not torch.equal(a[k], b[k]) for k in a)
    capsys.readouterr()


def test_a_given_seed_is_never_published_and_the_report_warns_first(tmp_path, capsys):
    run = tmp_path / "seeded"
    assert main(["train", *TINY, "--seed", str(GIVEN_SEED), "--out", str(run)]) == 0
    out = capsys.readouterr().out
    assert "anyone who holds the seed" in out                   # dpfy train says it too
    files = _published_bytes(run)
    assert _contains(files, GIVEN_SEED) == []
    head = (run / "privacy_report.md").read_text().splitlines()[:4]
    assert any("WARNING" in line and "anyone who holds the seed" in line for line in head)
    assert "not part of the release" in (run / "privacy_report.md").read_text()


def test_dpfy_report_re_renders_the_same_report(tmp_path, capsys):
    run = tmp_path / "r"
    assert main(["train", *TINY, "--seed", "5", "--out", str(run)]) == 0
    written = (run / "privacy_report.md").read_bytes()
    assert b"## 7. Model" in written and b"Note: Poisson sampling" in written
    (run / "privacy_report.md").unlink()
    assert main(["report", str(run)]) == 0
    assert (run / "privacy_report.md").read_bytes() == written
    capsys.readouterr()
