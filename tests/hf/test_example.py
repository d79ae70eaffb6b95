"""examples/hf_lora_private.py runs (a short run: half an epoch, σ = 1) and prints its ε.

The expected ε is dp_accounting's RDP for the run's 8 Poisson-subsampled Gaussian steps (q =
64/1024, σ = 1, δ = 1e-5), not dpfy's accountant. σ is given rather than calibrated here:
calibrating a PLD target costs more CPU than the whole run (about 4 s per target).
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import dp_accounting
import pytest

pytest.importorskip("peft")
pytest.importorskip("transformers")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "hf_lora_private.py"


def test_lora_example_runs_and_prints_dp_accountings_epsilon(capsys):
    spec = importlib.util.spec_from_file_location("hf_lora_private", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    start = time.process_time()
    eps = example.main(["--epochs", "0.5", "--noise-multiplier", "1", "--accountant", "rdp"])
    assert time.process_time() - start < 20  # CPU seconds: the brief's bound for this run
    out = capsys.readouterr().out
    assert "8 private steps" in out  # ⌈0.5 × 1024/64⌉ logical batches
    assert f"ε = {eps:.3f}" in out
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.PoissonSampledDpEvent(64 / 1024, dp_accounting.GaussianDpEvent(1.0)),
                8)
    assert eps == pytest.approx(acc.get_epsilon(1e-5), rel=1e-6)
