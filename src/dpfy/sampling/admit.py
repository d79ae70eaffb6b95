"""Admitting a user's DataLoader: dpfy builds the sampler itself and refuses any loader whose
sampler would decide which examples are seen (it could not account it)."""

from __future__ import annotations

from typing import Any, NoReturn, Sequence, Sized

import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)
from torch.utils.data.distributed import DistributedSampler

from dpfy._require import require
from dpfy.errors import PrivacyRefusal
from dpfy.sampling.cyclic import CyclicPoissonSampler, default_bands
from dpfy.sampling.poisson import PoissonSampler
from dpfy.sampling.shuffle import ShuffleSampler

__all__ = ["make_sampler"]


def refuse(name: str, value: Any, constraint: str, fix: str) -> NoReturn:
    """Raise :class:`PrivacyRefusal` in ``require``'s message format (the samplers' refusals
    of a loader or a batch whose sampling dpfy cannot account)."""
    try:
        require(False, name, value, constraint, fix)
    except ValueError as err:
        raise PrivacyRefusal(str(err)) from None
    raise AssertionError("unreachable")  # pragma: no cover


def _describe(sampler: Any) -> str:
    """The sampler's class, with the arguments that decide whether dpfy can account it."""
    name = type(sampler).__name__
    if type(sampler) is RandomSampler:
        return f"{name}(replacement={sampler.replacement}, num_samples={sampler._num_samples})"
    return name


def _sampler_fix(sampler: Any, dataset: Any, poisson_sampling: bool) -> str:
    """What to do instead of ``sampler`` (the sentence the refusal ends with)."""
    other = "" if poisson_sampling else ", or use Poisson sampling (poisson_sampling=True)"
    other_source = (
        type(sampler) in (SequentialSampler, RandomSampler) and sampler.data_source is not dataset
    )
    if isinstance(sampler, SubsetRandomSampler) or other_source:
        return (
            "Pass a torch.utils.data.Subset(dataset, indices) as the dataset instead of a "
            "subset sampler (with batch_size= and shuffle=True)"
        )
    if isinstance(sampler, WeightedRandomSampler):
        return (
            "dpfy cannot account weighted sampling: drop the sampler (batch_size= and "
            "shuffle=True)"
            + (
                other
                if not poisson_sampling
                else ", or give per-example Poisson rates with sample_rates="
            )
        )
    if isinstance(sampler, DistributedSampler):
        return (
            "A DistributedSampler is accepted only inside a process group of 2 or more "
            "ranks, over loader.dataset, with that group's num_replicas and rank, and "
            "with Poisson sampling: call torch.distributed.init_process_group first "
            "(torchrun does it), or drop the DistributedSampler to train in one process"
        )
    if type(sampler) is RandomSampler:
        return (
            "Build the DataLoader with batch_size= and shuffle=True only (no "
            "replacement=True, no num_samples=): dpfy draws every batch itself" + other
        )
    return (
        "Drop the custom sampler: dpfy draws every batch itself (build the DataLoader "
        "with batch_size= and shuffle=True or False)" + other
    )


def _is_rank_shard(sampler: Any, dataset: Any, shard: tuple[int, int] | None) -> bool:
    """``sampler`` is a DistributedSampler saying "shard ``dataset`` over these ranks".

    dpfy then draws the batches itself (:class:`PoissonSampler` with ``shard``); the
    sampler's ``shuffle``, ``seed`` and ``drop_last`` are not used.
    """
    return (
        shard is not None
        and isinstance(sampler, DistributedSampler)
        and sampler.dataset is dataset
        and (sampler.rank, sampler.num_replicas) == shard
    )


def check_loader(
    loader: DataLoader, poisson_sampling: bool, shard: tuple[int, int] | None = None
) -> None:
    """Refuse a loader whose sampling dpfy cannot account (or would silently ignore); every
    sampler's constructor (Poisson, shuffled, user-level, microbatch) asks it first."""
    if type(loader).__module__.startswith("accelerate"):
        refuse(
            "loader",
            f"{type(loader).__name__} (prepared by Hugging Face Accelerate)",
            "the plain torch DataLoader",
            "Call dpfy.make_private(model, optimizer, loader) first, with the DataLoader "
            "you built, then accelerator.prepare(model, optimizer) on what it returns: "
            "Accelerate's loader re-batches the data, and dpfy must draw every batch itself",
        )
    if isinstance(loader.dataset, IterableDataset):
        refuse(
            "loader.dataset",
            type(loader.dataset).__name__,
            "a map-style dataset",
            "dpfy draws the indices of every batch itself: use a dataset with __getitem__ "
            "and __len__ (e.g. TensorDataset, or a torch.utils.data.Subset)",
        )
    sampler = loader.sampler
    plain = (
        (type(sampler) is SequentialSampler and sampler.data_source is loader.dataset)
        or (
            type(sampler) is RandomSampler
            and sampler.data_source is loader.dataset
            and not sampler.replacement
            and sampler._num_samples is None
        )
        or (poisson_sampling and _is_rank_shard(sampler, loader.dataset, shard))
    )
    if not plain:
        refuse(
            "loader.sampler",
            _describe(sampler),
            "a plain SequentialSampler or RandomSampler over loader.dataset "
            "(DataLoader(dataset, batch_size=b, shuffle=True or False))",
            _sampler_fix(sampler, loader.dataset, poisson_sampling),
        )
    batches = loader.batch_sampler
    require(
        batches is not None,
        "loader.batch_size",
        None,
        "an int >= 1",
        "Build the DataLoader with batch_size= (dpfy forms every batch itself)",
    )
    if not (
        type(batches) is BatchSampler
        and batches.sampler is sampler
        and loader.batch_size is not None
    ):
        refuse(
            "loader.batch_sampler",
            type(batches).__name__,
            "the DataLoader's own BatchSampler (built from batch_size=)",
            "Pass batch_size= and shuffle= instead of a batch_sampler: dpfy forms every "
            "batch itself"
            + ("" if poisson_sampling else ", or use Poisson sampling (poisson_sampling=True)"),
        )


def make_sampler(
    loader: DataLoader,
    *,
    poisson_sampling: bool,
    sample_rates: Sequence[float] | torch.Tensor | None = None,
    seed: int | None,
    shard: tuple[int, int] | None = None,
    bands: int | str | None = None,
) -> "PoissonSampler | ShuffleSampler | CyclicPoissonSampler":
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
      bands: b for cyclic Poisson sampling (:class:`CyclicPoissonSampler`, BandMF): the
        expected batch is the loader's batch size; single-process, no per-example rates.

    Raises:
      PrivacyRefusal: a sampler, batch sampler or dataset dpfy cannot account.
      ValueError: a batch size or rates that are not valid for the dataset.
    """
    check_loader(loader, poisson_sampling, shard)
    dataset, batch_size = loader.dataset, loader.batch_size
    assert isinstance(dataset, Sized), "a map-style dataset has __len__ (check_loader)"
    assert batch_size is not None, "check_loader refused a loader without batch_size"
    n = len(dataset)

    def require_plain_poisson(where: str, fix: str) -> None:
        """Refuse shuffled batches or per-example rates ``where`` only Poisson at one rate runs."""
        given = (poisson_sampling, "given" if sample_rates is not None else None)
        ok = poisson_sampling and sample_rates is None
        require(ok, "poisson_sampling / sample_rates", given, f"True / None {where}", fix)

    if shard is not None:
        require_plain_poisson(
            "in data-parallel training",
            "dpfy shards Poisson batches over the ranks; shuffled batches and per-example "
            "rates are single-process only",
        )
        world = shard[1]
        require(
            batch_size * world <= n,
            "loader.batch_size × world_size",
            batch_size * world,
            f"<= len(dataset) = {n}",
            "batch_size is per rank: divide it by world_size",
        )
        return PoissonSampler(n, sample_rate=batch_size * world / n, seed=seed, shard=shard)
    if bands == "default":  # BandMF without bands=: min(8, ⌊N/B⌋)
        bands = default_bands(n, batch_size)
    if bands is not None:
        require_plain_poisson(
            "with cyclic Poisson sampling (bands=)",
            "BandMF samples Poisson batches inside its groups; drop those arguments",
        )
        assert not isinstance(bands, str), "'default' was resolved above"
        return CyclicPoissonSampler(n, batch_size, bands=bands, seed=seed)
    if not poisson_sampling:
        require(
            sample_rates is None,
            "sample_rates",
            "given",
            "None with poisson_sampling=False",
            "Per-example rates need Poisson sampling",
        )
        return ShuffleSampler(n, batch_size, seed=seed, drop_last=loader.drop_last)
    if sample_rates is not None:
        return PoissonSampler(n, sample_rates=sample_rates, seed=seed)
    require(batch_size <= n, "loader.batch_size", batch_size, f"<= len(dataset) = {n}")
    return PoissonSampler(n, sample_rate=batch_size / n, seed=seed)
