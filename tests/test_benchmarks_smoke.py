"""Every benchmark script with a smoke mode runs it (tiny sizes, seconds): benchmarks that no
test runs rot (``benchmarks/accounting.py`` crashed unnoticed after the GDP calibration became
opt-in). A script joins by accepting ``--smoke``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p.name for p in (ROOT / "benchmarks").glob("*.py")
                 if '"--smoke"' in p.read_text(encoding="utf-8"))


def test_the_smoke_scripts_include_the_first_day_and_accounting_benchmarks():
    assert {"accounting.py", "first_day.py"} <= set(SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS)
def test_benchmark_smoke_mode_runs(script):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), "--smoke"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "|---|" in done.stdout          # the results table was printed
