"""What machine a benchmark ran on, for the line every benchmark prints with its numbers."""

from __future__ import annotations

import platform


def cpu_name() -> str:
    """The CPU's model name (Linux ``/proc/cpuinfo``), else what ``platform`` says."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
