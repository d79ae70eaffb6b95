"""Shared checks of the fuzz tests (issue 15 §3): every input works or fails in one line.

:func:`check_cli` runs ``dpfy.cli.main(argv)`` in-process and asserts the contract: exit code
0, 2 (bad input, refused) or 3 (budget spent); on failure one line on stderr naming the fix
(argparse's own usage errors: its usage lines, then one error line), never a traceback (an
exception escaping ``main`` fails the test with it); within :data:`LIMIT_S` seconds.
Outcomes are counted per suite; with ``DPFY_FUZZ_STATS=FILE`` the counts are written to FILE
at the end of the session by tests/fuzz/conftest.py (docs/fuzzing.md quotes them).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import importlib
import math
import os
import signal
import tempfile
import time
from typing import Iterator, Sequence

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from dpfy.cli import SUBCOMMANDS, main

# `dpfy` imports a subcommand's modules when it first runs it. Import them all now, so the
# CPU time of a check is the input's own and not the imports of whichever input an xdist
# worker happens to run first (several CPU seconds of torch and scipy on a loaded machine).
for _name in SUBCOMMANDS:
    importlib.import_module(f"dpfy.cli.{_name}")


@functools.cache
def warm_up() -> None:
    """One tiny valid private run per process before any check is timed: the first run also
    loads what a run loads on first use (a dataset module, the compiled sampler, the
    accountants' scipy parts), which is not the checked input's cost."""
    with tempfile.TemporaryDirectory() as tmp:
        main(["train", "--no-progress", "--out", f"{tmp}/run", "--dataset", "digits", "--model",
              "logreg", "--epochs", "1", "--batch-size", "1438", "--noise-multiplier", "1",
              "--accountant", "rdp", "--seed", "1", "--threads", "1"])

# The bound for one input, in CPU seconds of this process (time.process_time): the
# test machine is shared, so wall time measures the neighbours as much as dpfy.
LIMIT_S = 5.0
HANG_S = 180.0          # wall seconds: an input still running after this is reported as a hang
OUTCOMES: collections.Counter = collections.Counter()   # (suite, outcome) -> count

# capsys/tmp_path are reset by hand per example; each example is checked for its own time.
# The default run draws the same inputs every time (derandomize): CI is a gate, and a gate that
# passes or fails by the draw is not one. DPFY_FUZZ_RANDOM=1 draws fresh inputs, to explore.
FUZZ = dict(deadline=None, derandomize=os.environ.get("DPFY_FUZZ_RANDOM") != "1",
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
settings.register_profile("dpfy-fuzz", **FUZZ)

# Numbers the issue names, the edges around them, and any float (NaN and ±inf included).
EXTREME = [0.0, -0.0, -1.0, 1e-300, 5e-324, 1e-12, 1e-6, 0.5, 1.0, 1.0000001, 3.0, 100.0,
           1e6, 1e9, 1e308, math.nan, math.inf, -math.inf]
JUNK = ["", "abc", "1e", "0x10", "--", "None", "[]", "1,5", " ", "ε", "nan", "-inf"]
numbers = st.one_of(st.sampled_from(EXTREME), st.floats(), st.integers(-10**20, 10**20))
values = st.one_of(numbers.map(repr), st.sampled_from(JUNK))


@contextlib.contextmanager
def hang_guard(seconds: float = HANG_S) -> Iterator[None]:
    """Fail (instead of blocking the suite) when the block runs longer than ``seconds``."""
    def fire(signum, frame):
        raise AssertionError(f"hang: still running after {seconds:g} s")
    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def check_cli(argv: Sequence[str], capsys, suite: str, limit: float = LIMIT_S) -> int:
    """Run ``dpfy ARGV``; assert the one-line contract; count and return the exit code."""
    warm_up()
    capsys.readouterr()
    start = time.process_time()
    with hang_guard():
        try:
            code = main(list(argv))
        except SystemExit as e:           # argparse: usage error (2) or --help (0)
            code = e.code
    elapsed = time.process_time() - start
    _, err = capsys.readouterr()
    assert code in (0, 2, 3), (argv, code, err)
    assert "Traceback" not in err, (argv, err)
    if code != 0:
        lines = [ln for ln in err.splitlines() if ln.strip()]
        last = lines[-1] if lines else ""
        # ours: "dpfy <command>: error: ..."; argparse's: "dpfy[ <command>]: error: ..."
        assert last.startswith("dpfy") and "error: " in last, (argv, err)
        ours = [ln for ln in lines if not ln.startswith(("usage:", " "))]
        assert len(ours) == 1, (argv, err)            # one line (after argparse's usage)
    assert elapsed <= limit, (argv, f"{elapsed:.1f} CPU s")
    OUTCOMES[(suite, {0: "ok", 2: "refused (exit 2)", 3: "budget (exit 3)"}[code])] += 1
    return code


def count(suite: str, outcome: str) -> None:
    OUTCOMES[(suite, outcome)] += 1
