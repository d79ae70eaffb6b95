"""Checks whose answer stays on the device until a host read the step already makes.

The model-state guard (:mod:`dpfy.buffers`) compares values after every training forward and
before every step: the parameters' fingerprints, the buffers' bits. ``torch.equal`` answers
with a Python bool, so on a GPU each comparison waits for the device (two or more per step).
Where the private step is there to read them (it opts in: ``BufferGuard.defer``), the guard
instead computes each mismatch as a device tensor and adds it here; the step reads them all
with the sensitivity check's own read (:func:`dpfy.step.sums.check_bound`), before anything of
the batch is used in a release, and the guard refuses there with the same message it gives in
the forward. Anything still pending is also read before ``model.state_dict()`` (and so before
a copy or a pickle), before an evaluation forward, and when more than :data:`LIMIT` comparisons
wait (forwards with no step between them).

On the CPU a comparison is no device synchronization: the guard compares at once, as before,
unless :data:`FORCE_ON_CPU` is set (``benchmarks/step_ops.py`` counts the device code path on
the CPU; the tests check the deferred refusals there).
"""

from __future__ import annotations

import sys
from typing import Any, Callable

import torch

__all__ = ["FORCE_ON_CPU", "LIMIT", "PendingChecks"]

FORCE_ON_CPU = False  # defer on the CPU too (benchmarks and tests of the device path)
LIMIT = 16  # comparisons pending before they are read at once (forwards without a step)

Explain = Callable[[list[bool]], list[Any]]


class PendingChecks:
    """Mismatch flags on the device, each with how to explain it, read in one host transfer.

    ``refuse(changes)`` is called (and must raise) with the explanation of the first flagged
    comparison, in the order they were made; all are then forgotten.
    """

    def __init__(self, refuse: Callable[[list[Any]], None]) -> None:
        self._refuse = refuse
        self._items: list[tuple[torch.Tensor, Explain]] = []

    @staticmethod
    def applies(t: torch.Tensor) -> bool:
        """Whether a comparison on ``t``'s device is worth deferring (it would synchronize)."""
        return FORCE_ON_CPU or t.device.type != "cpu"

    def add(self, mismatch: torch.Tensor, explain: Explain) -> None:
        """``mismatch``: a 1-d bool tensor, any True = changed; ``explain(flags)`` lists what
        changed from its values read on the host."""
        self._items.append((mismatch.reshape(-1), explain))
        # not while an error propagates (a forward that raised): torch silences a forward
        # hook's refusal then, and the flags read would be forgotten with it
        if len(self._items) > LIMIT and sys.exc_info()[0] is None:
            self.flush()

    def hold(self, changes: list[Any]) -> None:
        """Refuse ``changes`` (found already) when the flags are next read: a forward that
        raised cannot refuse them itself (torch only warns of its hook's error)."""
        self.add(torch.ones(1, dtype=torch.bool), lambda flags: changes)

    def tensors(self) -> list[torch.Tensor]:
        """The flags to read (with the caller's own read: :meth:`settle` their values)."""
        return [t for t, _ in self._items]

    def settle(self, values: list[float]) -> None:
        """The flags' values read on the host, in :meth:`tensors` order: refuse the first
        comparison that found a change, else forget them all."""
        items, self._items = self._items, []
        at = 0
        for t, explain in items:
            flags = [v != 0 for v in values[at : at + t.numel()]]
            at += t.numel()
            if any(flags):
                self._refuse(explain(flags))
                return

    def flush(self) -> None:
        """Read every pending flag now (one host read per device) and refuse a change."""
        flags = self.tensors()
        if not flags:
            return
        if all(t.device == flags[0].device for t in flags):
            self.settle(torch.cat(flags).tolist())
        else:  # a model on several devices
            self.settle([v for t in flags for v in t.tolist()])
