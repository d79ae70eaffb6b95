"""Cyclic Poisson sampling (b-min-separation; ``Sampling.CYCLIC_POISSON``), for BandMF.

Choquette-Choo et al. 2023 ("Amplified banded matrix factorization") split the examples once
into b balanced groups; step t draws only from group t mod b, each of its examples
independently with probability q. An example can then take part only in steps exactly a
multiple of b apart, which is what a b-banded strategy needs for its participations to be
independent, and each participation is amplified by Poisson sampling at rate q.
"""

from __future__ import annotations

import math
from typing import Any, Iterator

import torch

from dpfy._require import require
from dpfy.privacy import Sampling
from dpfy.sampling.draws import (
    permutation,
    restore_generator,
    seeded_generator,
    uniform,
)
from dpfy.sampling.units import UnitSampler

__all__ = ["CyclicPoissonSampler", "DEFAULT_BANDS", "default_bands"]

# (step, the step's drawn batch or None, rows of it taken): where the sampler stands
Position = tuple[int, "torch.Tensor | None", int]


# BandMF's band count when none is given (``noise="bandmf"`` / ``--noise bandmf``); see
# default_bands.
DEFAULT_BANDS = 8


def default_bands(dataset_size: int, batch_size: int) -> int:
    """b = min(8, ⌊N/B⌋), BandMF's band count when none is given.

    Choquette-Choo et al. 2023 ("Amplified banded matrix factorization") pick b per setting by
    the error it gives, with no closed form; b = 1 is DP-SGD. ⌊N/B⌋ is the largest b cyclic
    Poisson sampling allows (each of the b groups must hold the expected batch; at b = N/B a
    group is used whole and nothing is amplified), and 8 is the middle of the 4 to 16 bands
    the guide (docs/guide/correlated_noise.md) recommends, keeping the noise buffer at
    b - 1 = 7 copies of the trainable parameters.
    """
    return max(1, min(DEFAULT_BANDS, dataset_size // max(1, batch_size)))


class CyclicPoissonSampler(UnitSampler):
    """Poisson sampling inside b balanced groups, visited in turn (recorded as CYCLIC_POISSON).

    The groups come from one random permutation of the N indices cut into b parts of ⌊N/b⌋ or
    ⌈N/b⌉ (drawn at construction; public in effect, since the accounting holds for any fixed
    split). Step t draws from group t mod b at the per-group rate q = b·B/N, so the expected
    batch is B (the normalizer) and one pass of ⌈N/B⌉ steps sees each example once in
    expectation. The step counter moves only when ``optimizer.step()`` takes a logical batch
    (:meth:`commit`, through the loader's cursor), so prefetched or abandoned draws never shift
    the groups: the batch released at step t is always group t mod b's.

    Args:
      dataset_size: N.
      batch_size: B, the expected batch size (≤ N/b).
      bands: b, the number of groups (BandMF's band count; 1 is plain Poisson sampling).
      seed: None draws from the OS CSPRNG; an int seeds a torch generator.
    """

    sampling = Sampling.CYCLIC_POISSON
    resumed = ("groups", "step", "current", "offset")

    def __init__(
        self, dataset_size: int, batch_size: int, *, bands: int, seed: int | None = None
    ) -> None:
        require(dataset_size >= 1, "dataset_size", dataset_size, ">= 1")
        require(
            isinstance(bands, int) and 1 <= bands <= dataset_size,
            "bands",
            bands,
            f"an integer in [1, {dataset_size}]",
        )
        rate = batch_size * bands / dataset_size
        require(
            1 <= batch_size and rate <= 1,
            "batch_size × bands",
            batch_size * bands,
            f"<= len(dataset) = {dataset_size} (each group of N/b examples must hold the "
            f"expected batch)",
            "Use fewer bands or a smaller batch size",
        )
        self.dataset_size, self.batch_size, self.bands = dataset_size, batch_size, bands
        self.sample_rate = rate
        self.normalizer = float(batch_size)
        self.generator = seeded_generator(seed)
        perm = permutation(dataset_size, self.generator)
        self.groups = [g.sort().values for g in perm.tensor_split(bands)]  # b × (≈N/b,)
        self.current: torch.Tensor | None
        self.step, self.current, self.offset = 0, None, 0  # committed position

    @property
    def steps_per_epoch(self) -> int:
        """Logical batches per loader pass: ⌈N/B⌉."""
        return max(1, math.ceil(self.dataset_size / self.batch_size - 1e-9))

    def group_of(self, step: int) -> int:
        """The group step ``step`` draws from: step mod b."""
        return step % self.bands

    def draw(self, step: int) -> torch.Tensor:
        """Step ``step``'s batch: each example of its group with probability q, (B,) sorted."""
        members = self.groups[self.group_of(step)]
        return members[uniform(members.numel(), self.generator) < self.sample_rate]

    def at_batch_start(self) -> bool:
        return self.current is None

    def chunks(self, physical: int | None) -> Iterator[tuple[torch.Tensor, bool, Position]]:
        """One pass of logical batches from the committed position, without moving it.

        Yields ``(indices, ends_logical_batch, position_after)`` per physical batch;
        :meth:`commit` moves the position when a step takes it.
        """
        step, current, offset = self.step, self.current, self.offset
        for _ in range(self.steps_per_epoch):
            if current is None:
                current, offset = self.draw(step), 0
            rows = current[offset:]
            parts = list(rows.split(physical)) if physical and len(rows) else [rows]
            for k, part in enumerate(parts):
                offset += len(part)
                last = k == len(parts) - 1
                yield part, last, ((step + 1, None, 0) if last else (step, current, offset))
            step, current, offset = step + 1, None, 0

    def commit(self, end: Position) -> None:
        """An optimizer step took the batch that ends at ``end``."""
        require(
            end[0] in (self.step, self.step + 1),
            "the committed step",
            end[0],
            f"{self.step} or {self.step + 1}",
            "Only the private loader commits",
        )
        self.step, self.current, self.offset = end

    def set_epoch(self, epoch: int) -> None:
        """Accepted for DistributedSampler-style loops; the groups cycle by step."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        require(
            "groups" in state and len(state["groups"]) == self.bands,
            "the checkpoint's groups",
            len(state.get("groups", ())),
            f"{self.bands} (this run's bands)",
            "Resume with the same bands",
        )
        restore_generator(self.generator, state["generator"])
        self.groups = list(state["groups"])
        self.step, self.current, self.offset = (
            int(state["step"]),
            state["current"],
            int(state["offset"]),
        )
