"""Every benchmark script has a smoke mode, and the test suite runs it (tiny sizes, seconds):
benchmarks that no test runs rot (``benchmarks/accounting.py`` crashed unnoticed after the GDP
calibration became opt-in). A script's smoke mode is its ``--smoke`` flag (the shared plumbing is
``benchmarks/_smoke.py``; modules starting with ``_`` are helpers, not scripts)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
ALL_SCRIPTS = sorted(p.name for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_"))
SCRIPTS = [s for s in ALL_SCRIPTS
           if '"--smoke"' in (BENCHMARKS / s).read_text(encoding="utf-8")]
SKIPPED = "smoke skipped:"   # benchmarks/_smoke.py's line for a missing optional package


def test_every_benchmark_script_has_a_smoke_mode():
    assert set(SCRIPTS) == set(ALL_SCRIPTS), sorted(set(ALL_SCRIPTS) - set(SCRIPTS))


@pytest.mark.parametrize("script", SCRIPTS)
def test_benchmark_smoke_mode_runs(script):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([sys.executable, str(BENCHMARKS / script), "--smoke"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    if done.stdout.startswith(SKIPPED):
        pytest.skip(done.stdout.strip())
    assert "|---|" in done.stdout          # the results table was printed
