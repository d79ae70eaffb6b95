"""Start-up time: ``dpfy --help``, ``dpfy train --help`` and ``import dpfy; dpfy.make_private``
against ``import torch`` alone.

Each command runs in a fresh interpreter (no warm module cache inside the process; the OS file
cache is warm after the first round, which is what a user meets from the second call on); the
minimum wall time over ``--repeats`` rounds is reported, the least disturbed by other load on
the machine. The goals (issue 35): ``--help`` under 1 s, the import at most torch's own plus
0.5 s.

    PYTHONPATH=src python benchmarks/startup.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time

COMMANDS = {
    "python -c pass": ["-c", "pass"],
    "import torch": ["-c", "import torch"],
    "import dpfy; dpfy.make_private": ["-c", "import dpfy; dpfy.make_private"],
    "dpfy --help": ["-m", "dpfy", "--help"],
    "dpfy train --help": ["-m", "dpfy", "train", "--help"],
}


def cpu_name() -> str:
    """The CPU model from /proc/cpuinfo (Linux), else what ``platform`` says."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def wall_time(args: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, *args], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="fresh processes per command")
    repeats = parser.parse_args().repeats
    print(f"CPU: {cpu_name()}, {os.cpu_count()} logical cores")
    print(f"Python {platform.python_version()} ({sys.executable}); dpfy from {os.getcwd()}")
    print(f"load average before: {os.getloadavg()[0]:.2f}; min of {repeats} fresh processes")
    times: dict[str, float] = {}
    for name, args in COMMANDS.items():
        wall_time(args)  # warm the OS file cache
        times[name] = min(wall_time(args) for _ in range(repeats))
        print(f"  {name:34s} {times[name]:6.2f} s", flush=True)
    extra = times["import dpfy; dpfy.make_private"] - times["import torch"]
    print(f"dpfy.make_private over import torch: {extra:+.2f} s (goal: at most +0.50 s)")
    for name in ("dpfy --help", "dpfy train --help"):
        print(f"{name}: {times[name]:.2f} s (goal: under 1 s)")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
