"""Sampling: Poisson logical batches (uniform or per-example rates), physical batches, and the
one object whose facts both the loader and the ledger read.

DESIGN.md: "the sampler that produced the batches and the accountant's assumption must be the
same object's facts". A sampler here exposes ``sampling`` (a :class:`dpfy.privacy.Sampling`),
``sample_rate`` (the q recorded in the ledger), ``normalizer`` (the public b the clipped noisy sum
is divided by) and ``dataset_size``; the private loader draws its batches from it and the private
optimizer records its facts in the ledger.

- :class:`PoissonSampler`: example i joins a logical batch independently with probability q
  (or q_i). Batch sizes are random, Binomial(N, q) with mean qN and variance qN(1−q), and may be
  0: an empty batch still makes one (noise-only) step, since the accountant assumes every step
  happens. b = qN (= Σ q_i with per-example rates); the ledger records q = max_i q_i, which bounds
  every example's amplification.
- :class:`ShuffleSampler`: the user's own fixed-size shuffled loader, kept as is and recorded as
  ``Sampling.SHUFFLE`` (no amplification claimed); b = the batch size.

A logical batch (one optimizer update, one noise draw, one ledger step) is split into physical
batches of at most ``max_physical_batch_size`` rows; the loader tells the optimizer through a
:class:`BatchCursor` which physical batch ends a logical one.
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import torch
from torch.utils.data import DataLoader
from torch.utils._pytree import tree_flatten, tree_map

from dpfy._validate import require
from dpfy.noise import secure_uniform
from dpfy.privacy import Sampling

__all__ = ["PoissonSampler", "ShuffleSampler", "BatchCursor", "DPDataLoader"]


class PoissonSampler:
    """Draws Poisson logical batches of dataset indices.

    Args:
      dataset_size: N.
      sample_rate: q in (0, 1], or ``sample_rates``: one q_i per example.
      seed: seeds the sampling generator (state in the checkpoint).
      secure: draw from the OS CSPRNG instead (not reproducible by design).
    """

    sampling = Sampling.POISSON

    def __init__(self, dataset_size: int, *, sample_rate: float | None = None,
                 sample_rates: Sequence[float] | torch.Tensor | None = None, seed: int = 0,
                 secure: bool = False) -> None:
        require(dataset_size >= 1, "dataset_size", dataset_size, ">= 1")
        require((sample_rate is None) != (sample_rates is None), "sample_rate / sample_rates",
                (sample_rate, sample_rates), "exactly one given")
        self.dataset_size = dataset_size
        if sample_rates is not None:
            rates = torch.as_tensor(sample_rates, dtype=torch.float64)
            require(rates.shape == (dataset_size,) and bool(((rates > 0) & (rates <= 1)).all()),
                    "sample_rates", f"shape {tuple(rates.shape)}",
                    f"{dataset_size} rates in (0, 1]", "Give one rate per example")
            self.rates: torch.Tensor | None = rates  # (N,) public
            self.sample_rate = float(rates.max())
            self.normalizer = float(rates.sum())
        else:
            require(0 < sample_rate <= 1, "sample_rate", sample_rate, "in (0, 1]",
                    "Use batch_size / dataset_size")
            self.rates = None
            self.sample_rate = float(sample_rate)
            self.normalizer = self.sample_rate * dataset_size
        self.secure = secure
        self.generator = torch.Generator().manual_seed(seed)

    @property
    def steps_per_epoch(self) -> int:
        """Logical batches per pass: ⌈N/b⌉ (b the expected batch size)."""
        return max(1, math.ceil(self.dataset_size / self.normalizer - 1e-9))

    def draw(self) -> torch.Tensor:
        """One logical batch: the (sorted) indices of the examples that were sampled, (B,)."""
        n = self.dataset_size
        u = (secure_uniform(n) if self.secure else
             torch.rand(n, generator=self.generator, dtype=torch.float64))  # (N,)
        q = self.rates if self.rates is not None else self.sample_rate
        return torch.nonzero(u < q).flatten()  # (B,) B ~ Binomial(N, q)

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])


@dataclass
class ShuffleSampler:
    """Facts of a user's fixed-size shuffled loader (recorded as SHUFFLE, never as Poisson)."""

    dataset_size: int
    batch_size: int
    sampling = Sampling.SHUFFLE

    def __post_init__(self) -> None:
        require(1 <= self.batch_size <= self.dataset_size, "batch_size", self.batch_size,
                f"in [1, {self.dataset_size}]")

    @property
    def sample_rate(self) -> float:
        return self.batch_size / self.dataset_size

    @property
    def normalizer(self) -> float:
        return float(self.batch_size)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


@dataclass
class BatchCursor:
    """What the loader last yielded, read by the optimizer at ``step()``."""

    indices: torch.Tensor | None = None   # dataset indices of the physical batch, if known
    last: bool = True                     # this physical batch ends its logical batch
    pending: int = 0                      # batches yielded since the last step()
    logical: int = 0                      # id of the logical batch the last yield belongs to
    _ended: bool = True                   # the previous yield ended its logical batch


def _batch_rows(batch: Any) -> int:
    leaves = [t for t in tree_flatten(batch)[0] if torch.is_tensor(t)]
    require(bool(leaves), "a batch", type(batch).__name__, "a structure of tensors",
            "Collate batches into tensors (batch dimension first)")
    return leaves[0].shape[0]


class _EmptySafeCollate:
    """Collate that turns an empty index list into zero-row tensors of the right shape."""

    def __init__(self, collate_fn: Any, dataset: Any) -> None:
        self.collate_fn, self.dataset = collate_fn, dataset

    def __call__(self, items: list[Any]) -> Any:
        if items:
            return self.collate_fn(items)
        one = self.collate_fn([self.dataset[0]])
        return tree_map(lambda t: t[:0] if torch.is_tensor(t) else t, one)


class _PhysicalBatches:
    """batch_sampler for the inner DataLoader: Poisson logical batches cut into chunks."""

    def __init__(self, sampler: PoissonSampler, physical: int | None) -> None:
        self.sampler, self.physical = sampler, physical
        self.meta: collections.deque[tuple[torch.Tensor, bool]] = collections.deque()

    def __len__(self) -> int:
        return self.sampler.steps_per_epoch

    def __iter__(self) -> Iterator[list[int]]:
        self.meta.clear()
        for _ in range(self.sampler.steps_per_epoch):
            idx = self.sampler.draw()  # (B,)
            chunks = list(idx.split(self.physical)) if self.physical and len(idx) else [idx]
            for k, c in enumerate(chunks):
                self.meta.append((c, k == len(chunks) - 1))
                yield c.tolist()


class DPDataLoader:
    """The loader ``make_private`` returns: yields physical batches, marks logical ends.

    With a :class:`PoissonSampler` it replaces the user's batching by Poisson draws (keeping
    dataset, collate_fn, workers); with a :class:`ShuffleSampler` it iterates the user's loader
    unchanged, cutting each batch into physical chunks if asked.
    """

    def __init__(self, loader: DataLoader, sampler: PoissonSampler | ShuffleSampler, *,
                 max_physical_batch_size: int | None = None) -> None:
        if max_physical_batch_size is not None:
            require(max_physical_batch_size >= 1, "max_physical_batch_size",
                    max_physical_batch_size, ">= 1")
        self.sampler = sampler
        self.cursor = BatchCursor()
        self.max_physical_batch_size = max_physical_batch_size
        self.original = loader
        self.dataset = loader.dataset
        if isinstance(sampler, PoissonSampler):
            self._batches: _PhysicalBatches | None = _PhysicalBatches(
                sampler, max_physical_batch_size)
            self.inner: Any = DataLoader(
                loader.dataset, batch_sampler=self._batches,
                collate_fn=_EmptySafeCollate(loader.collate_fn, loader.dataset),
                num_workers=loader.num_workers, pin_memory=loader.pin_memory,
                timeout=loader.timeout, worker_init_fn=loader.worker_init_fn,
                multiprocessing_context=loader.multiprocessing_context,
                persistent_workers=loader.persistent_workers)
        else:
            self._batches = None
            self.inner = loader

    def __len__(self) -> int:
        """Logical batches (optimizer steps) per epoch."""
        return len(self._batches) if self._batches is not None else len(self.inner)

    def _iter_batches(self) -> Iterator[Any]:
        for batch in self.inner:
            if self._batches is not None:
                idx, last = self._batches.meta.popleft()
                self._set(idx, last)
                yield batch
                continue
            rows = _batch_rows(batch)
            size = self.max_physical_batch_size or max(rows, 1)
            starts = list(range(0, rows, size)) or [0]
            for k, s in enumerate(starts):
                self._set(None, k == len(starts) - 1)
                yield tree_map(lambda t: t[s:s + size] if torch.is_tensor(t) else t, batch)

    def _set(self, indices: torch.Tensor | None, last: bool) -> None:
        c = self.cursor
        if c._ended:  # this physical batch starts a new logical batch
            c.logical += 1
        c.indices, c.last, c._ended = indices, last, last
        c.pending += 1

    def __iter__(self) -> Iterator[Any]:
        self.cursor._ended = True  # a new pass never continues an abandoned logical batch
        yield from self._iter_batches()
