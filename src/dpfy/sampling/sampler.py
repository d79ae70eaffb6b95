"""``Sampler``: the one name for every sampler dpfy builds (what the loader, the step and the
individual-budget planner accept).

Each exposes the sampling facts the ledger records (``sampling``, ``sample_rate``,
``normalizer``, ``dataset_size``), its unit of privacy (``units``) and the batches it draws.
"""

from __future__ import annotations

from typing import Union

from dpfy.sampling.cyclic import CyclicPoissonSampler
from dpfy.sampling.poisson import PoissonSampler
from dpfy.sampling.shuffle import ShuffleSampler

__all__ = ["Sampler"]

Sampler = Union[PoissonSampler, ShuffleSampler, CyclicPoissonSampler]
