"""Every benchmark script has a smoke mode, and the test suite runs it (tiny sizes, seconds):
benchmarks that no test runs rot (``benchmarks/accounting.py`` crashed unnoticed after the GDP
calibration became opt-in). A script's smoke mode is its ``--smoke`` flag (the shared plumbing is
``benchmarks/_smoke.py``; modules starting with ``_`` are helpers, not scripts).

Each script runs in its own process as ``python SCRIPT --smoke``, forked from one server per
test process that has imported torch, dp_accounting and dpfy once (``tests/benchmark_runner.py``
says what the child is and what differs: only those modules are already loaded); a fresh
interpreter per script spent ~5 s of CPU on those imports, most of each smoke run."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
RUNNER = Path(__file__).with_name("benchmark_runner.py")
ALL_SCRIPTS = sorted(p.name for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_"))
SCRIPTS = [s for s in ALL_SCRIPTS if '"--smoke"' in (BENCHMARKS / s).read_text(encoding="utf-8")]
SKIPPED = "smoke skipped:"  # benchmarks/_smoke.py's line for a missing optional package
TIMEOUT = 600  # seconds per script


class Runner:
    """The fork server (tests/benchmark_runner.py) and the one request it runs at a time."""

    def __init__(self) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        self.proc = subprocess.Popen(
            [sys.executable, str(RUNNER)],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,
        )

        self.pending = b""  # the server's answers read but not yet taken, by line

    def _line(self, deadline: float) -> str:
        """The server's next answer line; "" if it ended or ``deadline`` passed first."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.pending:
            if not select.select([fd], [], [], max(deadline - time.time(), 0))[0]:
                return ""
            chunk = os.read(fd, 4096)
            if not chunk:
                return ""
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return line.decode()

    def run(self, script: Path, out: Path) -> tuple[int | None, str, str]:
        """(exit status or None on timeout, stdout, stderr) of ``python script --smoke``."""
        assert self.proc.stdin is not None
        files = {"stdout": str(out / "stdout"), "stderr": str(out / "stderr")}
        self.proc.stdin.write((json.dumps({"script": str(script), **files}) + "\n").encode())
        self.proc.stdin.flush()
        started = self._line(time.time() + TIMEOUT)  # the server's imports come first
        assert started.startswith("pid "), f"the fork server ended: {started!r}"
        ended = self._line(time.time() + TIMEOUT)
        timed_out = not ended
        if timed_out:
            os.kill(int(started.split()[1]), signal.SIGKILL)
            ended = self._line(time.time() + 60)
        assert ended.startswith("rc "), f"the fork server ended: {ended!r}"
        read = {k: Path(v).read_text(errors="replace") for k, v in files.items()}
        return None if timed_out else int(ended.split()[1]), read["stdout"], read["stderr"]

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


@pytest.fixture(scope="module")
def runner() -> Iterator[Runner]:
    r = Runner()
    yield r
    r.close()


def test_every_benchmark_script_has_a_smoke_mode():
    assert set(SCRIPTS) == set(ALL_SCRIPTS), sorted(set(ALL_SCRIPTS) - set(SCRIPTS))


@pytest.mark.parametrize("script", SCRIPTS)
def test_benchmark_smoke_mode_runs(script, runner, tmp_path):
    code, stdout, stderr = runner.run(BENCHMARKS / script, tmp_path)
    assert code == 0, stderr[-2000:] if code is not None else f"over {TIMEOUT} s"
    if stdout.startswith(SKIPPED):
        pytest.skip(stdout.strip())
    assert "|---|" in stdout  # the results table was printed
