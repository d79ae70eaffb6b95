"""Start-up time: ``dpfy --help``, ``dpfy train --help`` and ``import dpfy; dpfy.make_private``
against ``import torch`` alone.

Each command runs in a fresh interpreter (no warm module cache inside the process; the OS file
cache is warm after the first round, which is what a user meets from the second call on); the
minimum wall time over ``--repeats`` rounds is reported, the least disturbed by other load on
the machine. Beside it, the minimum CPU time (user + system) of the child: on a shared,
loaded machine wall time is inflated by waiting for a core, CPU time much less so. The goals
(issue 35): ``--help`` under 1 s, the import at most torch's own plus 0.5 s.

    PYTHONPATH=src python benchmarks/startup.py [--repeats 7] [--smoke]

``--smoke``: each command once, no warm-up (tests/test_benchmarks_smoke.py).
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import subprocess
import sys
import time

from _smoke import HELP
from _machine import cpu_name

COMMANDS = {
    "python -c pass": ["-c", "pass"],
    "import torch": ["-c", "import torch"],
    "import dpfy; dpfy.make_private": ["-c", "import dpfy; dpfy.make_private"],
    "dpfy --help": ["-m", "dpfy", "--help"],
    "dpfy train --help": ["-m", "dpfy", "train", "--help"],
}


def timed(args: list[str]) -> tuple[float, float]:
    """(wall, CPU) seconds of one fresh interpreter running ``args``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, *args], check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="fresh processes per command")
    parser.add_argument("--smoke", action="store_true", help=HELP)
    args = parser.parse_args()
    repeats = 1 if args.smoke else args.repeats
    print(f"CPU: {cpu_name()}, {os.cpu_count()} logical cores")
    print(f"Python {platform.python_version()} ({sys.executable}); dpfy from {os.getcwd()}")
    print(f"load average before: {os.getloadavg()[0]:.2f}; min of {repeats} fresh processes\n")
    times: dict[str, float] = {}
    cpus: dict[str, float] = {}
    print("| command | wall (s) | CPU (s) |\n|---|---:|---:|")
    for name, cmd in COMMANDS.items():
        if not args.smoke:
            timed(cmd)  # warm the OS file cache
        runs = [timed(cmd) for _ in range(repeats)]
        times[name], cpus[name] = min(w for w, _ in runs), min(c for _, c in runs)
        print(f"| `{name}` | {times[name]:.2f} | {cpus[name]:.2f} |", flush=True)
    print()
    for label, t in (("wall", times), ("CPU", cpus)):
        extra = t["import dpfy; dpfy.make_private"] - t["import torch"]
        print(
            f"{label}: dpfy.make_private over import torch {extra:+.2f} s (goal: <= +0.50 s); "
            f"dpfy --help {t['dpfy --help']:.2f} s, dpfy train --help "
            f"{t['dpfy train --help']:.2f} s (goal: under 1 s)"
        )
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
