"""The interleaved timing loop the step benchmarks share: every row runs once per round, in a
fresh seeded order, so that load from other processes and cache state hit all rows alike."""

from __future__ import annotations

import random
import statistics
import time
from typing import Callable


def interleaved_medians(
    steps: dict[str, Callable[[], None]],
    rounds: int,
    warm: int,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, float]:
    """Median ``clock`` seconds per step of each row: ``warm`` untimed steps of every row
    first; then each round, in round i's order (``random.Random(i)`` shuffles the last
    round's), every row runs one untimed step and the timed one right after it, as in a
    training loop, where a step follows one of its own (warm caches)."""
    for s in steps.values():
        for _ in range(warm):
            s()
    times: dict[str, list[float]] = {r: [] for r in steps}
    order = list(steps.items())
    for i in range(rounds):
        random.Random(i).shuffle(order)
        for r, s in order:
            s()
            t0 = clock()
            s()
            times[r].append(clock() - t0)
    return {r: statistics.median(v) for r, v in times.items()}
