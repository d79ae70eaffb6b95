"""Sampling: dpfy's own samplers, the one object whose facts both the loader and the ledger read.

DESIGN.md: "the sampler that produced the batches and the accountant's assumption must be the
same object's facts". A sampler here exposes ``sampling`` (a :class:`dpfy.privacy.Sampling`),
``sample_rate`` (the q recorded in the ledger), ``normalizer`` (the public b the clipped noisy sum
is divided by) and ``dataset_size``; the private loader draws its batches from it and the private
optimizer records its facts in the ledger.

dpfy never accounts a sampler it did not build. :func:`make_sampler` reads the user's
``DataLoader`` once, keeps its dataset, collate_fn and workers, and refuses any loader whose
sampler or batch sampler would decide which examples are seen (a subset, weighted, with
replacement, distributed, custom, a user ``batch_sampler``, an ``IterableDataset``): dpfy could
not prove what such a loader does, and in Poisson mode it would silently ignore it.

- :class:`PoissonSampler`: example i joins a logical batch independently with probability q
  (or q_i). Batch sizes are random, Binomial(N, q) with mean qN and variance qN(1−q), and may be
  0: an empty batch still makes one (noise-only) step, since the accountant assumes every step
  happens. b = qN (= Σ q_i with per-example rates); the ledger records q = max_i q_i, which bounds
  every example's amplification.
- :class:`ShuffleSampler`: fixed-size batches cut from one random permutation per pass, recorded
  as ``Sampling.SHUFFLE`` (no amplification claimed); b = the batch size. Its position moves only
  when ``optimizer.step()`` takes a batch, so restarts, worker prefetch and checkpoints never
  repeat an example within a pass (the argument is in its docstring).

Randomness: ``seed=None`` draws from the OS CSPRNG (not reproducible, by design); an int seeds a
``torch.Generator`` (reproducible: anyone with the seed can redraw the batches). Generator
states go into ``state_dict`` (checkpoints) only.

A logical batch (one optimizer update, one noise draw, one ledger step) is split into physical
batches of at most ``max_physical_batch_size`` rows; the loader tells the optimizer through a
:class:`BatchCursor` which physical batch ends a logical one.
"""

from __future__ import annotations

import collections
import math
import os
from typing import Any, Callable, Iterator, NamedTuple, NoReturn, Sequence

import numpy as np
import torch
from torch.utils.data import (BatchSampler, DataLoader, IterableDataset, RandomSampler,
                              SequentialSampler, SubsetRandomSampler, WeightedRandomSampler)
from torch.utils.data.distributed import DistributedSampler
from torch.utils._pytree import tree_map

from dpfy._require import require
from dpfy.errors import PrivacyRefusal
from dpfy.noise import secure_uniform
from dpfy.privacy import Sampling

__all__ = ["make_sampler", "PoissonSampler", "ShuffleSampler", "BatchCursor", "DPDataLoader"]


def _refuse(name: str, value: Any, constraint: str, fix: str) -> NoReturn:
    """Raise :class:`PrivacyRefusal` in ``require``'s message format."""
    try:
        require(False, name, value, constraint, fix)
    except ValueError as err:
        raise PrivacyRefusal(str(err)) from None
    raise AssertionError("unreachable")  # pragma: no cover


def _describe(sampler: Any) -> str:
    """The sampler's class, with the arguments that decide whether dpfy can account it."""
    name = type(sampler).__name__
    if type(sampler) is RandomSampler:
        return (f"{name}(replacement={sampler.replacement}, "
                f"num_samples={sampler._num_samples})")
    return name


def _sampler_fix(sampler: Any, dataset: Any, poisson_sampling: bool) -> str:
    """What to do instead of ``sampler`` (the sentence the refusal ends with)."""
    other = ("" if poisson_sampling else
             ", or use Poisson sampling (poisson_sampling=True)")
    other_source = (type(sampler) in (SequentialSampler, RandomSampler)
                    and sampler.data_source is not dataset)
    if isinstance(sampler, SubsetRandomSampler) or other_source:
        return ("Pass a torch.utils.data.Subset(dataset, indices) as the dataset instead of a "
                "subset sampler (with batch_size= and shuffle=True)")
    if isinstance(sampler, WeightedRandomSampler):
        return ("dpfy cannot account weighted sampling: drop the sampler (batch_size= and "
                "shuffle=True)" + (other if not poisson_sampling else
                                   ", or give per-example Poisson rates with sample_rates="))
    if isinstance(sampler, DistributedSampler):
        return ("A DistributedSampler is accepted only inside a process group of 2 or more "
                "ranks, over loader.dataset, with that group's num_replicas and rank, and "
                "with Poisson sampling: call torch.distributed.init_process_group first "
                "(torchrun does it), or drop the DistributedSampler to train in one process")
    if type(sampler) is RandomSampler:
        return ("Build the DataLoader with batch_size= and shuffle=True only (no "
                "replacement=True, no num_samples=): dpfy draws every batch itself" + other)
    return ("Drop the custom sampler: dpfy draws every batch itself (build the DataLoader "
            "with batch_size= and shuffle=True or False)" + other)


def _is_rank_shard(sampler: Any, dataset: Any, shard: tuple[int, int] | None) -> bool:
    """``sampler`` is a DistributedSampler saying "shard ``dataset`` over these ranks".

    dpfy then draws the batches itself (:class:`PoissonSampler` with ``shard``); the
    sampler's ``shuffle``, ``seed`` and ``drop_last`` are not used.
    """
    return (shard is not None and isinstance(sampler, DistributedSampler)
            and sampler.dataset is dataset
            and (sampler.rank, sampler.num_replicas) == shard)


def _check_loader(loader: DataLoader, poisson_sampling: bool,
                  shard: tuple[int, int] | None = None) -> None:
    """Refuse a loader whose sampling dpfy cannot account (or would silently ignore)."""
    if isinstance(loader.dataset, IterableDataset):
        _refuse("loader.dataset", type(loader.dataset).__name__, "a map-style dataset",
                "dpfy draws the indices of every batch itself: use a dataset with __getitem__ "
                "and __len__ (e.g. TensorDataset, or a torch.utils.data.Subset)")
    sampler = loader.sampler
    plain = (type(sampler) is SequentialSampler and sampler.data_source is loader.dataset) or (
        type(sampler) is RandomSampler and sampler.data_source is loader.dataset
        and not sampler.replacement and sampler._num_samples is None) or (
        poisson_sampling and _is_rank_shard(sampler, loader.dataset, shard))
    if not plain:
        _refuse("loader.sampler", _describe(sampler),
                "a plain SequentialSampler or RandomSampler over loader.dataset "
                "(DataLoader(dataset, batch_size=b, shuffle=True or False))",
                _sampler_fix(sampler, loader.dataset, poisson_sampling))
    batches = loader.batch_sampler
    require(batches is not None, "loader.batch_size", None, "an int >= 1",
            "Build the DataLoader with batch_size= (dpfy forms every batch itself)")
    if not (type(batches) is BatchSampler and batches.sampler is sampler
            and loader.batch_size is not None):
        _refuse("loader.batch_sampler", type(batches).__name__,
                "the DataLoader's own BatchSampler (built from batch_size=)",
                "Pass batch_size= and shuffle= instead of a batch_sampler: dpfy forms every "
                "batch itself" + ("" if poisson_sampling else
                                  ", or use Poisson sampling (poisson_sampling=True)"))


def make_sampler(loader: DataLoader, *, poisson_sampling: bool,
                 sample_rates: Sequence[float] | torch.Tensor | None = None,
                 seed: int | None, shard: tuple[int, int] | None = None,
                 ) -> PoissonSampler | ShuffleSampler:
    """The sampler dpfy builds for ``loader``: the one place that reads a user's DataLoader.

    Accepted: ``DataLoader(dataset, batch_size=b, shuffle=True or False, drop_last=...)`` over
    a map-style dataset, i.e. a plain ``SequentialSampler`` or ``RandomSampler`` (no
    replacement, no ``num_samples``) in the default ``BatchSampler``. dpfy replaces that
    sampler by its own, in both modes: batches are always drawn by dpfy (``shuffle=False``
    does not give a fixed order; the loader's ``generator`` is not used). Everything else is
    refused with :class:`~dpfy.errors.PrivacyRefusal` naming the sampler and the fix: a subset,
    weighted, with-replacement, distributed or custom sampler, a user ``batch_sampler``, an
    ``IterableDataset``. To train on part of a dataset, pass ``torch.utils.data.Subset``.

    Args:
      loader: the user's DataLoader; q = batch_size / len(dataset).
      poisson_sampling: True: :class:`PoissonSampler` at q (``drop_last`` is ignored: Poisson
        batches have random sizes). False: :class:`ShuffleSampler` with the loader's
        batch size and ``drop_last``.
      sample_rates: per-example Poisson rates q_i instead of batch_size / N (Poisson only).
      seed: None draws from the OS CSPRNG; an int makes the batches reproducible.
      shard: ``(rank, world_size)`` for data-parallel training (:mod:`dpfy.step.distributed`):
        ``loader.batch_size`` is then the batch size *per rank* (as with DDP), the global
        rate is q = batch_size·world_size / N, and this rank yields the examples i ≡ rank
        (mod world_size) of each global Poisson batch. The loader may carry a
        ``DistributedSampler`` for that group (it only says "shard over these ranks").
        Poisson sampling only; no per-example rates.

    Raises:
      PrivacyRefusal: a sampler, batch sampler or dataset dpfy cannot account.
      ValueError: a batch size or rates that are not valid for the dataset.
    """
    _check_loader(loader, poisson_sampling, shard)
    n, batch_size = len(loader.dataset), loader.batch_size
    if shard is not None:
        require(poisson_sampling and sample_rates is None, "poisson_sampling / sample_rates",
                (poisson_sampling, "given" if sample_rates is not None else None),
                "True / None in data-parallel training",
                "dpfy shards Poisson batches over the ranks; shuffled batches and per-example "
                "rates are single-process only")
        world = shard[1]
        require(batch_size * world <= n, "loader.batch_size × world_size", batch_size * world,
                f"<= len(dataset) = {n}", "batch_size is per rank: divide it by world_size")
        return PoissonSampler(n, sample_rate=batch_size * world / n, seed=seed, shard=shard)
    if not poisson_sampling:
        require(sample_rates is None, "sample_rates", "given", "None with poisson_sampling=False",
                "Per-example rates need Poisson sampling")
        return ShuffleSampler(n, batch_size, seed=seed, drop_last=loader.drop_last)
    if sample_rates is not None:
        return PoissonSampler(n, sample_rates=sample_rates, seed=seed)
    require(batch_size <= n, "loader.batch_size", batch_size, f"<= len(dataset) = {n}")
    return PoissonSampler(n, sample_rate=batch_size / n, seed=seed)


def _generator(seed: int | None) -> torch.Generator | None:
    """A seeded torch generator, or None for the OS CSPRNG."""
    return None if seed is None else torch.Generator().manual_seed(seed)


class PoissonSampler:
    """Draws Poisson logical batches of dataset indices.

    Args:
      dataset_size: N.
      sample_rate: q in (0, 1], or ``sample_rates``: one q_i per example.
      normalizer: with ``sample_rates``, the public b the noisy sum is divided by (default
        Σ q_i); individualized budgets pass the uniform qN, so the update scale and the number
        of steps per epoch are the uniform run's.
      seed: None (default) draws the masks from the OS CSPRNG (``secure_uniform``: not
        reproducible); an int seeds a torch generator whose state goes into the checkpoint.
      shard: ``(rank, world_size)``: draw the global mask, keep the indices i ≡ rank
        (mod world_size). Facts (q, b, N, steps per epoch) stay the global run's.
    """

    sampling = Sampling.POISSON

    def __init__(self, dataset_size: int, *, sample_rate: float | None = None,
                 sample_rates: Sequence[float] | torch.Tensor | None = None,
                 seed: int | None = None, shard: tuple[int, int] | None = None,
                 normalizer: float | None = None) -> None:
        require(dataset_size >= 1, "dataset_size", dataset_size, ">= 1")
        require(normalizer is None or (sample_rates is not None and normalizer > 0),
                "normalizer", normalizer, "None, or > 0 with sample_rates")
        require(shard is None or 0 <= shard[0] < shard[1], "shard", shard,
                "(rank, world_size) with 0 <= rank < world_size")
        self.shard = shard
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
            self.normalizer = float(rates.sum()) if normalizer is None else float(normalizer)
        else:
            require(0 < sample_rate <= 1, "sample_rate", sample_rate, "in (0, 1]",
                    "Use batch_size / dataset_size")
            self.rates = None
            self.sample_rate = float(sample_rate)
            self.normalizer = self.sample_rate * dataset_size
        self.generator = _generator(seed)

    @property
    def secure(self) -> bool:
        """True when the masks come from the OS CSPRNG."""
        return self.generator is None

    @property
    def steps_per_epoch(self) -> int:
        """Logical batches per pass: ⌈N/b⌉ (b the expected batch size)."""
        return max(1, math.ceil(self.dataset_size / self.normalizer - 1e-9))

    def draw(self) -> torch.Tensor:
        """One logical batch: the (sorted) indices of the examples that were sampled, (B,)."""
        n = self.dataset_size
        u = (secure_uniform(n) if self.generator is None else
             torch.rand(n, generator=self.generator, dtype=torch.float64))  # (N,)
        q = self.rates if self.rates is not None else self.sample_rate
        idx = torch.nonzero(u < q).flatten()  # (B,) B ~ Binomial(N, q)
        if self.shard is not None:
            rank, world = self.shard
            idx = idx[idx % world == rank]     # this rank's part of the global batch
        return idx

    def set_epoch(self, epoch: int) -> None:
        """Accepted for DistributedSampler-style loops; Poisson draws are fresh every step."""

    def state_dict(self) -> dict[str, Any]:
        return {"generator": None if self.generator is None else self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.generator is not None and state["generator"] is not None:
            self.generator.set_state(state["generator"])


def _secure_permutation(n: int) -> torch.Tensor:
    """A uniformly random permutation of 0..n-1 from the OS CSPRNG, (n,) int64.

    Sorts n independent 64-bit keys from ``os.urandom``; two equal keys (probability below
    n²/2⁶⁵) only make their relative order deterministic, and any order is still a permutation.
    """
    keys = np.frombuffer(os.urandom(8 * n), dtype=np.int64)  # (n,)
    return torch.from_numpy(np.argsort(keys, kind="stable"))  # numpy's radix sort: ~10x torch's


class ShuffleSampler:
    """dpfy's permutation sampler for shuffled fixed-size batches (recorded as SHUFFLE).

    Each pass draws a permutation π of the N indices and cuts it into batches of b:
    π[0:b], π[b:2b], ...; the last batch has N mod b examples when b does not divide N, or is
    dropped with ``drop_last=True`` (its examples sit that pass out). A pass therefore has
    P = ⌈N/b⌉ (or ⌊N/b⌋) logical batches, and ``len(loader)`` = P.

    The position in the pass (``offset``, examples of π already taken) moves only when
    ``optimizer.step()`` takes a yielded batch (:meth:`commit`, called through the loader's
    :class:`BatchCursor`). Iterating the loader again mid-pass continues at that position: a
    batch that was yielded but never stepped is yielded again, a batch that was stepped never
    is, and batches that DataLoader workers prefetched but did not hand out are simply drawn
    from the same π again. ``state_dict`` holds π, the position and the generator, so a resumed
    run continues the same pass exactly.

    Why the ledger's SHUFFLE charge bounds this sampler (``privacy.canonical
    .shuffle_participations``): the ledger charges an example ⌈c/L⌉ participations over c
    steps, L = ⌊N/b⌋ (its ⌊1/q⌋ with q = b/N). The batches the optimizer takes are, in order,
    the batches of pass 1, then of pass 2, ..., each pass P ≥ L batches long, whatever the
    restarts, and an example is in at most one batch of a pass. c steps starting at step 0 (a
    pass boundary) lie in at most ⌈c/P⌉ ≤ ⌈c/L⌉ passes, so no example takes part more often
    than charged. A partial last batch only lengthens a pass (P = ⌈N/b⌉ ≥ L); ``drop_last``
    gives P = ⌊N/b⌋ = L. Normalizer: b, also for the partial batch (public; its update is just
    smaller). One caveat: a batch that ``optimizer.step()`` took but refused to release (it
    raised) is consumed without a ledger step; after such an error, start a new run.

    Args:
      dataset_size: N.
      batch_size: b in [1, N].
      seed: None draws each permutation from the OS CSPRNG; an int seeds a torch generator.
      drop_last: drop the partial last batch of each pass.
    """

    sampling = Sampling.SHUFFLE

    def __init__(self, dataset_size: int, batch_size: int, *, seed: int | None = None,
                 drop_last: bool = False) -> None:
        require(dataset_size >= 1, "dataset_size", dataset_size, ">= 1")
        require(1 <= batch_size <= dataset_size, "batch_size", batch_size,
                f"in [1, {dataset_size}]", "Use a batch size no larger than the dataset")
        self.dataset_size, self.batch_size, self.drop_last = dataset_size, batch_size, drop_last
        self.generator = _generator(seed)
        self.permutation: torch.Tensor | None = None  # (N,) π of the current pass; secret
        self.offset = 0                               # examples of π taken by optimizer steps
        self.passes = 0                               # permutations drawn so far

    @property
    def secure(self) -> bool:
        """True when the permutations come from the OS CSPRNG."""
        return self.generator is None

    @property
    def sample_rate(self) -> float:
        return self.batch_size / self.dataset_size

    @property
    def normalizer(self) -> float:
        return float(self.batch_size)

    @property
    def pass_length(self) -> int:
        """Examples of π used per pass: N, or ⌊N/b⌋·b with ``drop_last``."""
        n, b = self.dataset_size, self.batch_size
        return n - n % b if self.drop_last else n

    @property
    def steps_per_epoch(self) -> int:
        """Logical batches per pass: ⌈N/b⌉, or ⌊N/b⌋ with ``drop_last``."""
        return -(-self.pass_length // self.batch_size)

    def at_batch_start(self) -> bool:
        """The next example taken starts a logical batch (not mid-way through one)."""
        return self.offset % self.batch_size == 0 or self.offset >= self.pass_length

    def _start_pass_if_done(self) -> None:
        if self.permutation is not None and self.offset < self.pass_length:
            return
        n = self.dataset_size
        self.permutation = (_secure_permutation(n) if self.generator is None else
                            torch.randperm(n, generator=self.generator))
        self.offset = 0
        self.passes += 1

    def chunks(self, physical: int | None) -> Iterator[tuple[torch.Tensor, bool, int]]:
        """The rest of the pass from the current position, without moving it.

        Yields ``(indices, ends_logical_batch, end_offset)`` per physical batch of at most
        ``physical`` rows (a whole logical batch if None); :meth:`commit` moves the position.
        """
        self._start_pass_if_done()
        perm, b, m = self.permutation, self.batch_size, self.pass_length
        pos, size = self.offset, physical or self.batch_size
        while pos < m:
            batch_end = min((pos // b + 1) * b, m)
            end = min(pos + size, batch_end)
            yield perm[pos:end], end == batch_end, end
            pos = end

    def commit(self, end_offset: int) -> None:
        """An optimizer step took the examples of π up to ``end_offset``."""
        require(self.offset <= end_offset <= self.pass_length, "end_offset", end_offset,
                f"in [{self.offset}, {self.pass_length}]",
                "Only the private loader commits the positions it yielded")
        self.offset = end_offset

    def state_dict(self) -> dict[str, Any]:
        return {"generator": None if self.generator is None else self.generator.get_state(),
                "permutation": self.permutation, "offset": self.offset, "passes": self.passes}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        require("offset" in state, "the sampler checkpoint", sorted(state),
                "from dpfy's own ShuffleSampler (permutation, offset)",
                "Checkpoints written before dpfy owned the shuffled sampler cannot resume a "
                "pass; start a new run")
        perm, offset = state["permutation"], int(state["offset"])
        require(perm is None or tuple(perm.shape) == (self.dataset_size,),
                "the checkpoint's permutation", None if perm is None else tuple(perm.shape),
                f"of this dataset's size ({self.dataset_size},)",
                "Resume with the dataset the checkpoint was written for")
        require(0 <= offset <= self.pass_length, "the checkpoint's offset", offset,
                f"in [0, {self.pass_length}]", "Resume with the same batch size and drop_last")
        if self.generator is not None and state["generator"] is not None:
            self.generator.set_state(state["generator"])
        self.permutation, self.offset = perm, offset
        self.passes = int(state["passes"])


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
        self.batch: Any = None                 # sensitive: the last yielded physical batch
        self.last = True
        self.logical = 0
        self.ended = True  # the previous yield ended its logical batch
        self._pending = 0
        self._on_taken = on_taken

    @property
    def pending(self) -> int:
        return self._pending

    @pending.setter
    def pending(self, value: int) -> None:
        taken = self._pending > 0 and value == 0
        self._pending = value
        if taken:
            self.batch = None
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


class _Chunk(NamedTuple):
    """One physical batch as the batch sampler produced it."""

    indices: torch.Tensor  # (B,) dataset indices
    last: bool             # ends its logical batch
    end: int | None        # ShuffleSampler position after it (None: Poisson)


class _EmptySafeCollate:
    """Collate that turns an empty index list into zero-row tensors of the right shape."""

    def __init__(self, collate_fn: Any, dataset: Any) -> None:
        self.collate_fn, self.dataset = collate_fn, dataset

    def __call__(self, items: list[Any]) -> Any:
        if items:
            return self.collate_fn(items)
        one = self.collate_fn([self.dataset[0]])
        return tree_map(lambda t: t[:0] if torch.is_tensor(t) else t, one)


class _Batches:
    """batch_sampler for the inner DataLoader: the sampler's physical batches, in order.

    Each iteration writes what it yields to a fresh ``meta`` queue, so a superseded iteration
    (still prefetching in workers) cannot mix its batches into the current one's.
    """

    def __init__(self, sampler: PoissonSampler | ShuffleSampler, physical: int | None) -> None:
        self.sampler, self.physical = sampler, physical
        self.meta: collections.deque[_Chunk] = collections.deque()

    def __len__(self) -> int:
        return self.sampler.steps_per_epoch

    def __iter__(self) -> Iterator[list[int]]:
        self.meta = meta = collections.deque()
        for chunk in self._chunks():
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
            parts = list(idx.split(self.physical)) if self.physical and len(idx) else [idx]
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
    """

    def __init__(self, loader: DataLoader, sampler: PoissonSampler | ShuffleSampler, *,
                 max_physical_batch_size: int | None = None) -> None:
        if max_physical_batch_size is not None:
            require(isinstance(max_physical_batch_size, int)
                    and not isinstance(max_physical_batch_size, bool)
                    and max_physical_batch_size >= 1, "max_physical_batch_size",
                    max_physical_batch_size, "an integer >= 1 (or 'auto', or None)")
        self.sampler = sampler
        self.cursor = BatchCursor(on_taken=self._taken)
        self.max_physical_batch_size = max_physical_batch_size
        self.original = loader
        self.dataset = loader.dataset
        kind = _PoissonBatches if isinstance(sampler, PoissonSampler) else _ShuffleBatches
        self._batches = kind(sampler, max_physical_batch_size)
        self._yielded: _Chunk | None = None   # last physical batch handed out
        self._current: object | None = None   # token of the newest iteration
        workers = {"prefetch_factor": loader.prefetch_factor} if loader.num_workers else {}
        self.inner = DataLoader(
            loader.dataset, batch_sampler=self._batches,
            collate_fn=_EmptySafeCollate(loader.collate_fn, loader.dataset),
            num_workers=loader.num_workers, pin_memory=loader.pin_memory,
            timeout=loader.timeout, worker_init_fn=loader.worker_init_fn,
            multiprocessing_context=loader.multiprocessing_context,
            persistent_workers=loader.persistent_workers, **workers)

    def __len__(self) -> int:
        """Logical batches (optimizer steps) per pass."""
        return len(self._batches)

    @property
    def _shuffled(self) -> bool:
        return isinstance(self.sampler, ShuffleSampler)

    def _taken(self) -> None:
        """``optimizer.step()`` took the last yielded batch: a shuffled pass moves past it."""
        chunk, self._yielded = self._yielded, None
        if chunk is not None and chunk.end is not None:
            self.sampler.commit(chunk.end)

    def _restart(self) -> None:
        if not self._shuffled:
            self.cursor.ended = True  # a Poisson pass never continues an abandoned batch
            return
        self.cursor.discard_pending()  # an abandoned, unstepped batch comes again
        self._yielded = None
        self.cursor.ended = self.sampler.at_batch_start()

    def _check_stepped(self) -> None:
        if self._shuffled and self.cursor.pending:
            _refuse("optimizer.step()", "not called on the previous batch",
                    "called once after every batch of the shuffled private loader",
                    "Each batch of a shuffled pass may be used by one optimizer.step() only, "
                    "so that no example takes part twice in a pass; to stop early, break out "
                    "of the loop (the next iteration continues the pass), and iterate the "
                    "original DataLoader to look at data")

    def __iter__(self) -> Iterator[Any]:
        token = self._current = object()
        self._restart()
        it = iter(self.inner)
        while True:
            require(self._current is token, "the loader iterator", "superseded",
                    "the newest iter(loader)",
                    "A new iteration continues the pass; use only the newest iterator")
            self._check_stepped()
            try:
                batch = next(it)
            except StopIteration:
                return
            chunk = self._batches.meta.popleft()
            self._yielded = chunk
            self.cursor.advance(chunk.indices, chunk.last)
            self.cursor.batch = batch
            yield batch
