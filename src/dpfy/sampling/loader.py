"""The private loader: logical batches from a dpfy sampler, cut into physical batches, and
the cursor that tells the private step which batch it is taking."""

from __future__ import annotations

import collections
from typing import Any, Callable, Iterator, NamedTuple

import torch
from torch.utils.data import DataLoader
from torch.utils._pytree import tree_map

from dpfy._require import require
from dpfy.sampling.admit import refuse
from dpfy.sampling.augmult import Augmentation
from dpfy.sampling.collate_probe import CollateProbe
from dpfy.sampling.fetch import BatchedDataset, Collated
from dpfy.sampling.poisson import PoissonSampler
from dpfy.sampling.sampler import Sampler
from dpfy.sampling.shuffle import ShuffleSampler

__all__ = ["BatchCursor", "DPDataLoader"]


class BatchCursor:
    """What the loader last yielded, read by the optimizer at ``step()``.

    ``pending`` counts batches yielded since the last ``step()``; the optimizer resets it to 0
    when a step takes the batch, which calls ``on_taken`` (the shuffled loader then commits its
    position). Attributes: ``indices`` (dataset indices of the physical batch), ``last`` (it
    ends its logical batch), ``logical`` (id of the logical batch the last yield belongs to),
    ``batch`` (the physical batch itself, for loss probes; sensitive, dropped once taken).
    """

    def __init__(self, on_taken: Callable[[], None] | None = None) -> None:
        self.indices: torch.Tensor | None = None
        self.batch: Any = None  # sensitive: the last yielded physical batch
        self.last = True
        self.logical = 0
        self.ended = True  # the previous yield ended its logical batch
        self._pending = 0
        self._on_taken = on_taken
        # a step took the last yielded batch (a second step() before the next yield repeats it)
        self.taken = False

    @property
    def pending(self) -> int:
        return self._pending

    @pending.setter
    def pending(self, value: int) -> None:
        taken = self._pending > 0 and value == 0
        self._pending = value
        if taken:
            self.batch, self.taken = None, True
        if taken and self._on_taken is not None:
            self._on_taken()

    def discard_pending(self) -> None:
        """Forget yielded batches no step took (they are yielded again), without committing."""
        self._pending = 0

    def advance(self, indices: torch.Tensor, last: bool) -> None:
        """Record one yielded physical batch."""
        if self.ended:  # this physical batch starts a new logical batch
            self.logical += 1
        self.indices, self.last, self.ended = indices, last, last
        self._pending += 1
        self.taken = False


class _Chunk(NamedTuple):
    """One physical batch as the batch sampler produced it."""

    indices: torch.Tensor  # (B,) dataset indices
    last: bool  # ends its logical batch
    end: Any  # the sampler's position after it (None: Poisson)


class _EmptySafeCollate:
    """Collate that turns an empty index list into zero-row tensors of the right shape, and
    checks on its first batch that the user's collate function does not mix examples
    (:class:`~dpfy.sampling.collate_probe.CollateProbe`)."""

    def __init__(self, collate_fn: Any, dataset: Any) -> None:
        self.collate_fn, self.dataset = CollateProbe(collate_fn), dataset

    def __call__(self, items: list[Any] | Collated) -> Any:
        if isinstance(items, Collated):  # fetched and collated at once (sampling/fetch.py)
            return items.batch
        if items:
            return self.collate_fn(items)
        one = self.collate_fn([self.dataset[0]])
        return tree_map(lambda t: t[:0] if torch.is_tensor(t) else t, one)


class _Batches:
    """batch_sampler for the inner DataLoader: the sampler's physical batches, in order.

    Each iteration writes what it yields to a fresh ``meta`` queue, so a superseded iteration
    (still prefetching in workers) cannot mix its batches into the current one's.
    """

    def __init__(
        self,
        sampler: Sampler,
        physical: int | None,
        augmentation: Augmentation | None = None,
    ) -> None:
        self.sampler, self.augmentation = sampler, augmentation
        # the sampler cuts examples: with K copies each, a physical batch of P rows holds P // K
        self.physical = augmentation.examples_per_batch(physical) if augmentation else physical
        self.meta: collections.deque[_Chunk] = collections.deque()

    def __len__(self) -> int:
        return self.sampler.steps_per_epoch

    def __iter__(self) -> Iterator[list[int]]:
        meta: collections.deque[_Chunk] = collections.deque()
        self.meta = meta
        for chunk in self._chunks():
            if self.augmentation is not None:  # K rows per example, consecutive
                chunk = chunk._replace(indices=self.augmentation.rows(chunk.indices))
            meta.append(chunk)
            yield chunk.indices.tolist()

    def _chunks(self) -> Iterator[_Chunk]:
        raise NotImplementedError


class _PoissonBatches(_Batches):
    """⌈N/b⌉ fresh Poisson logical batches per iteration, each cut into chunks."""

    sampler: PoissonSampler

    def _chunks(self) -> Iterator[_Chunk]:
        for _ in range(self.sampler.steps_per_epoch):
            idx = self.sampler.draw()  # (B,)
            parts = self.sampler.physical_batches(idx, self.physical)
            for k, c in enumerate(parts):
                yield _Chunk(c, k == len(parts) - 1, None)


class _ShuffleBatches(_Batches):
    """The rest of the current pass of a :class:`ShuffleSampler`."""

    sampler: ShuffleSampler

    def _chunks(self) -> Iterator[_Chunk]:
        for idx, last, end in self.sampler.chunks(self.physical):
            yield _Chunk(idx, last, end)


class DPDataLoader:
    """The loader ``make_private`` returns: yields physical batches, marks logical ends.

    It keeps the user's dataset, collate_fn and workers and draws every batch from dpfy's
    sampler (Poisson draws, or the passes of a :class:`ShuffleSampler`). ``len(loader)`` is the
    number of logical batches per pass. With a :class:`ShuffleSampler`, each yielded batch
    must be taken by ``optimizer.step()`` before the next is asked for (else
    :class:`~dpfy.errors.PrivacyRefusal`), and a new ``iter(loader)`` continues the pass where
    the steps stopped; only the newest iterator may be used.

    With an :class:`~dpfy.sampling.augmult.Augmentation` of K copies, every sampled example
    is fetched K times (its rows consecutive), each batch passes through the augmentation
    (in this process, from its own generator), ``max_physical_batch_size`` counts rows (K per
    example) and the cursor holds one dataset index per row.
    """

    def __init__(
        self,
        loader: DataLoader,
        sampler: Sampler,
        *,
        max_physical_batch_size: int | None = None,
        augmentation: Augmentation | None = None,
    ) -> None:
        if max_physical_batch_size is not None:
            require(
                isinstance(max_physical_batch_size, int)
                and not isinstance(max_physical_batch_size, bool)
                and max_physical_batch_size >= 1,
                "max_physical_batch_size",
                max_physical_batch_size,
                "an integer >= 1 (or 'auto', or None)",
            )
        self.sampler = sampler
        self.cursor = BatchCursor(on_taken=self._taken)
        self.max_physical_batch_size = max_physical_batch_size
        self.original = loader
        self.dataset = loader.dataset
        kind = _PoissonBatches if isinstance(sampler, PoissonSampler) else _ShuffleBatches
        self.augmentation = augmentation
        self._batches = kind(sampler, max_physical_batch_size, augmentation)
        self._yielded: _Chunk | None = None  # last physical batch handed out
        self._current: object | None = None  # token of the newest iteration
        workers: dict[str, Any] = (
            {"prefetch_factor": loader.prefetch_factor} if loader.num_workers else {}
        )
        self.inner = DataLoader(
            BatchedDataset(loader.dataset, loader.collate_fn),  # one fetch per batch
            batch_sampler=self._batches,
            collate_fn=_EmptySafeCollate(loader.collate_fn, loader.dataset),
            num_workers=loader.num_workers,
            pin_memory=loader.pin_memory,
            timeout=loader.timeout,
            worker_init_fn=loader.worker_init_fn,
            multiprocessing_context=loader.multiprocessing_context,
            persistent_workers=loader.persistent_workers,
            **workers,
        )

    def __len__(self) -> int:
        """Logical batches (optimizer steps) per pass."""
        return len(self._batches)

    @property
    def sample_rate(self) -> float:
        """q, the sampler's rate (Opacus's ``DPDataLoader.sample_rate``)."""
        return self.sampler.sample_rate

    @property
    def batch_size(self) -> int | None:
        """The ``batch_size`` of the DataLoader this one was built from: the expected logical
        batch (per rank when data-parallel), not the size of any one drawn batch."""
        return self.original.batch_size

    @property
    def _shuffled(self) -> bool:
        """The sampler keeps a position that only taken batches move (shuffled passes, and
        the cyclic Poisson sampler's step): each yielded batch must be stepped."""
        return not isinstance(self.sampler, PoissonSampler)

    def _taken(self) -> None:
        """``optimizer.step()`` took the last yielded batch: a shuffled pass moves past it."""
        chunk, self._yielded = self._yielded, None
        if chunk is not None and chunk.end is not None:
            assert not isinstance(self.sampler, PoissonSampler), "a Poisson chunk has no end"
            self.sampler.commit(chunk.end)

    def _restart(self) -> None:
        if not self._shuffled:
            self.cursor.ended = True  # a Poisson pass never continues an abandoned batch
            return
        self.cursor.discard_pending()  # an abandoned, unstepped batch comes again
        self._yielded = None
        assert not isinstance(self.sampler, PoissonSampler), "shuffled: not Poisson"
        self.cursor.ended = self.sampler.at_batch_start()

    def _check_stepped(self) -> None:
        if self._shuffled and self.cursor.pending:
            refuse(
                "optimizer.step()",
                "not called on the previous batch",
                "called once after every batch of the shuffled private loader",
                "Each batch of a shuffled pass may be used by one optimizer.step() only, "
                "so that no example takes part twice in a pass; to stop early, break out "
                "of the loop (the next iteration continues the pass), and iterate the "
                "original DataLoader to look at data",
            )

    def __iter__(self) -> Iterator[Any]:
        token = self._current = object()
        self._restart()
        it = iter(self.inner)
        while True:
            require(
                self._current is token,
                "the loader iterator",
                "superseded",
                "the newest iter(loader)",
                "A new iteration continues the pass; use only the newest iterator",
            )
            self._check_stepped()
            try:
                batch = next(it)
            except StopIteration:
                return
            chunk = self._batches.meta.popleft()
            if self.augmentation is not None:
                batch = self.augmentation(batch)
            self._yielded = chunk
            self.cursor.advance(chunk.indices, chunk.last)
            self.cursor.batch = batch
            yield batch
