"""Sampling: dpfy's own samplers, the one object whose facts both the loader and the ledger read.

The rule (CONTRIBUTING.md): "the sampler that produced the batches and the accountant's assumption
must be the
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
- :class:`CyclicPoissonSampler`: b balanced groups visited in turn, Poisson sampling inside the
  group of the step (``Sampling.CYCLIC_POISSON``), for banded matrix factorization.

Randomness: ``seed=None`` draws from the OS CSPRNG (not reproducible, by design); an int seeds a
``torch.Generator`` (reproducible: anyone with the seed can redraw the batches). Generator
states go into ``state_dict`` (checkpoints) only. Every sampler draws through
:mod:`dpfy.sampling.draws`, which writes both sources once.

A logical batch (one optimizer update, one noise draw, one ledger step) is split into physical
batches of at most ``max_physical_batch_size`` rows; the loader tells the optimizer through a
:class:`BatchCursor` which physical batch ends a logical one.
"""

from dpfy.sampling.admit import make_sampler
from dpfy.sampling.cyclic import CyclicPoissonSampler
from dpfy.sampling.loader import BatchCursor, DPDataLoader
from dpfy.sampling.poisson import PoissonSampler
from dpfy.sampling.shuffle import ShuffleSampler
from dpfy.sampling.units import ExampleUnits, UserUnits
from dpfy.sampling.users import (
    USER_SAMPLINGS,
    UserCappedSampler,
    UserPoissonSampler,
    make_user_sampler,
)

__all__ = [
    "make_sampler",
    "PoissonSampler",
    "ShuffleSampler",
    "BatchCursor",
    "DPDataLoader",
    "ExampleUnits",
    "UserUnits",
    "UserPoissonSampler",
    "UserCappedSampler",
    "USER_SAMPLINGS",
    "make_user_sampler",
    "CyclicPoissonSampler",
]
