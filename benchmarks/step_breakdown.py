"""Where a private step's CPU time beyond non-private training goes: the same step with one
piece at a time taken out (an ablation; the ablated rows are NOT private and exist only here).

    OMP_NUM_THREADS=1 PYTHONPATH=src .venv/bin/python benchmarks/step_breakdown.py
        [--models mlp,cnn] [--batches 256,8] [--rounds 40]
    PYTHONPATH=src .venv/bin/python benchmarks/step_breakdown.py --smoke

The models, batch and step are ``benchmarks/engine.py``'s (zero_grad + forward + loss + backward
+ optimizer.step on one fixed batch, secure ChaCha20 noise, σ = C = 1). Rows, all in one process,
interleaved (each round runs every row once, in a fresh seeded order, one untimed step of a row
before its timed step): non-private; dpfy as users get it; dpfy with the model-state guard
detached (``guard_of(model).detach()``: no fingerprints, snapshots or guard hooks); dpfy with
the noise draw skipped (the compiled sampler's ``axpy_`` replaced, during that row's steps, by
the division it also does: x ← x/b); both; and dpfy with the guard's fingerprint sums replaced by
a constant (its Python and hooks kept), which separates the guard's memory reads from the rest.
Reported: median process CPU time per step and its ratio to non-private's (CPU time, not wall:
the machine this was written on is shared), so "× non-private" of a row minus the full dpfy
row's is what that piece costs. Batch 8 shows the per-step fixed cost (the arithmetic that
scales with the batch is then negligible).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import engine  # noqa: E402
import dpfy.buffers.prints as prints  # noqa: E402
from dpfy.buffers.guard import _GUARDS  # noqa: E402
from dpfy.native import gaussian  # noqa: E402
from _smoke import HELP, size  # noqa: E402
from _timing import interleaved_medians  # noqa: E402

Step = Callable[[], None]


@contextlib.contextmanager
def no_draw() -> Iterator[None]:
    """The compiled sampler's x ← a·x + s·z without z (the division kept): NOT private."""
    kept = gaussian._CompiledStream.axpy_
    gaussian._CompiledStream.axpy_ = lambda self, x, a, s: x.mul_(a)  # type: ignore[method-assign]
    try:
        yield
    finally:
        gaussian._CompiledStream.axpy_ = kept  # type: ignore[method-assign]


@contextlib.contextmanager
def no_fingerprint_sums() -> Iterator[None]:
    """The guard's per-parameter integer sums replaced by one constant: NOT a guard."""
    kept, zero = prints._cached_sum, torch.zeros((), dtype=torch.int64)
    prints._cached_sum = lambda p, key, cache, ptr: zero  # type: ignore[assignment]
    try:
        yield
    finally:
        prints._cached_sum = kept  # type: ignore[assignment]


def ablated(name: str, guard: bool, noise: bool, sums: bool = True) -> Step:
    """engine.py's dpfy row with the pieces switched off (a fresh model each)."""
    before = {id(m) for m in _GUARDS.keys()}
    model_step = engine.dpfy_row(name, "auto")
    if not guard:  # the guard make_private attached to this row's model
        for model in list(_GUARDS.keys()):
            if id(model) not in before:
                _GUARDS[model].detach()

    def step() -> None:
        with contextlib.ExitStack() as stack:
            if not noise:
                stack.enter_context(no_draw())
            if not sums:
                stack.enter_context(no_fingerprint_sums())
            model_step()

    return step


ROWS: dict[str, tuple[bool, bool, bool]] = {  # guard, noise, fingerprint sums
    "dpfy (default)": (True, True, True),
    "guard detached": (False, True, True),
    "noise draw skipped": (True, False, True),
    "guard detached, no draw": (False, False, True),
    "fingerprint sums constant": (True, True, False),
}


def bench(name: str, rounds: int) -> list[tuple[str, float, float]]:
    steps: dict[str, Step] = {"non-private": engine.nonprivate(name)}
    for row, (guard, noise, sums) in ROWS.items():
        steps[row] = ablated(name, guard, noise, sums)
    med = interleaved_medians(steps, rounds, size(3, 1), time.process_time)  # CPU time
    return [(r, med[r] * 1e3, med[r] / med["non-private"]) for r in steps]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="mlp,cnn")
    ap.add_argument("--batches", default="256,8")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--smoke", action="store_true", help=HELP)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(
        f"threads 1; torch {torch.__version__}; {args.rounds if not args.smoke else 1} rounds; "
        "CPU time per step, median"
    )
    print("| model | batch | row | CPU ms / step | × non-private |")
    print("|---|---:|---|---:|---:|")
    batches = [int(b) for b in args.batches.split(",")] if not args.smoke else [engine.BATCH]
    for name in args.models.split(","):
        for b in batches:
            engine.BATCH = b
            for row, ms, ratio in bench(name, size(args.rounds, 1)):
                print(f"| {name} | {b} | {row} | {ms:.3f} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
