"""Smoke mode shared by the benchmark scripts: ``--smoke`` runs a script at tiny sizes, one
round, in seconds, so the test suite notices a benchmark that no longer runs (a benchmark no test
runs rots). A smoke run's numbers measure nothing; only that every row and the table still work.

The flag is read from the command line when this module is imported, so module constants (such
as ``engine.BATCH``, which other benchmarks import) shrink in every script of the run alike. Each
script still declares ``"--smoke"`` in its own argument parser (with :data:`HELP`), which is also
how the test suite finds the scripts that have a smoke mode.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import TypeVar

T = TypeVar("T")

SMOKE = "--smoke" in sys.argv[1:]
SKIPPED = "smoke skipped:"   # the line the test suite reads as a skip
HELP = "tiny sizes, one round, seconds: only checks that the script runs (the test suite runs it)"


def size(full: T, smoke: T) -> T:
    """``full`` in a real run, ``smoke`` under ``--smoke``."""
    return smoke if SMOKE else full


def require(*modules: str) -> None:
    """Under ``--smoke``, end the run (exit status 0, a :data:`SKIPPED` line) when an optional
    package the script needs is not installed; a real run fails on its import as before."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if SMOKE and missing:
        print(f"{SKIPPED} {', '.join(missing)} not installed")
        sys.exit(0)
