"""The Trainer's view of dpfy's loader: one item per logical batch, i.e. per optimizer update.

``transformers.Trainer`` counts one step per item its train dataloader yields and ends an
epoch after ``len(dataloader)`` items. dpfy's :class:`~dpfy.sampling.DPDataLoader` yields
*physical* batches (``max_physical_batch_size``) but its length counts *logical* batches, so
the Trainer stepped the optimizer after every physical batch, counted each one as a step and
ended the epoch about 1/5 of the way through (issue 35). A Poisson batch has no fixed number of
physical batches, so no ``gradient_accumulation_steps`` can fix that.

:class:`LogicalBatches` yields one item per logical batch: the physical batch itself when the
logical batch is one physical batch, else a :class:`LogicalBatch`, which pulls its physical
batches from the loader lazily, one at a time (dpfy's private step reads which batch it takes
from the loader's cursor, so a physical batch must be yielded just before it is used).
:meth:`dpfy.hf.DPTrainer.training_step` runs the forward and backward of each, stepping the
private optimizer between them (it only accumulates the clipped sum there); the Trainer's own
``optimizer.step()`` after it is the one update, noise draw and ledger step of the logical
batch. Trainer steps, optimizer updates and accounting steps are then the same count.

Resuming: the sampler's state comes back with the optimizer's (``DPOptimizer.state_dict``), so
the next draws are the ones an uninterrupted run would make; the Trainer must not skip batches
by drawing them. Each iteration therefore yields ``len(loader) − done % len(loader)`` logical
batches, ``done`` being the Trainer's count of finished updates: a whole epoch normally, the
rest of the epoch on resume.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable, Iterator

from dpfy.errors import PrivacyRefusal
from dpfy.sampling.loader import DPDataLoader

__all__ = ["LogicalBatch", "LogicalBatches"]


class LogicalBatch:
    """The physical batches of one logical batch, pulled from the loader as they are iterated.

    ``rows`` and ``chunks`` count what was pulled so far. ``key in batch`` reads the first
    physical batch's keys (what the Trainer checks before the step); nothing else is a dict.
    """

    def __init__(self, first: Any, rest: Iterator[Any], loader: DPDataLoader) -> None:
        self.first, self.rest, self.loader = first, rest, loader
        self.chunks = 0
        self.exhausted = False
        self.flos = 0.0  # the Trainer's floating-point operation estimate, summed as trained

    def __contains__(self, key: object) -> bool:
        return isinstance(self.first, Mapping) and key in self.first

    def __iter__(self) -> Iterator[Any]:
        if self.chunks:
            raise PrivacyRefusal(
                "dpfy.hf.LogicalBatch must be iterated once, got a second iteration: its "
                "physical batches are drawn from the private loader as they are used"
            )
        batch = self.first
        self.first = _keys_of(batch)  # the tensors are not kept past their step
        while True:
            self.chunks += 1
            yield batch
            if self.loader.cursor.last:  # that physical batch ended the logical batch
                self.exhausted = True
                return
            batch = next(self.rest)


class LogicalBatches:
    """Iterates a :class:`DPDataLoader` as one item per logical batch (module docstring).

    Args:
      loader: the private loader ``make_private`` returned.
      done: the number of updates already finished (the Trainer's ``global_step``).
    """

    def __init__(self, loader: DPDataLoader, done: Callable[[], int]) -> None:
        self.loader, self.done = loader, done

    def __len__(self) -> int:
        return len(self.loader)

    @property
    def batch_size(self) -> int | None:
        return self.loader.batch_size

    @property
    def dataset(self) -> Any:
        return self.loader.dataset

    def __iter__(self) -> Iterator[Any]:
        n = len(self.loader)
        it = iter(self.loader)
        for _ in range(n - self.done() % n):
            try:
                first = next(it)
            except StopIteration:
                return
            if self.loader.cursor.last:  # one physical batch: the logical batch itself
                yield first
                continue
            logical = LogicalBatch(first, it, self.loader)
            yield logical
            if not logical.exhausted:
                raise PrivacyRefusal(
                    "dpfy.hf.DPTrainer: a logical batch must be used whole before the next "
                    "one is drawn, got one whose physical batches were not all trained on. "
                    "Iterate each LogicalBatch to its end in training_step"
                )


def _keys_of(batch: Any) -> Any:
    return dict.fromkeys(batch) if isinstance(batch, Mapping) else None
