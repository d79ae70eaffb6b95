"""Poisson sampling: example i joins each logical batch independently with probability q
(or q_i); batch sizes are random and may be 0 (a noise-only step)."""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch

from dpfy._require import require
from dpfy.privacy import Sampling
from dpfy.sampling.draws import restore_generator, seeded_generator, uniform
from dpfy.types.sampling import require_sample_rate
from dpfy.sampling.units import UnitSampler, require_same_unit

__all__ = ["PoissonSampler"]


class PoissonSampler(UnitSampler):
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

    def __init__(
        self,
        dataset_size: int,
        *,
        sample_rate: float | None = None,
        sample_rates: Sequence[float] | torch.Tensor | None = None,
        seed: int | None = None,
        shard: tuple[int, int] | None = None,
        normalizer: float | None = None,
    ) -> None:
        require(dataset_size >= 1, "dataset_size", dataset_size, ">= 1")
        require(
            normalizer is None or (sample_rates is not None and normalizer > 0),
            "normalizer",
            normalizer,
            "None, or > 0 with sample_rates",
        )
        require(
            shard is None or 0 <= shard[0] < shard[1],
            "shard",
            shard,
            "(rank, world_size) with 0 <= rank < world_size",
        )
        self.shard = shard
        require(
            (sample_rate is None) != (sample_rates is None),
            "sample_rate / sample_rates",
            (sample_rate, sample_rates),
            "exactly one given",
        )
        self.dataset_size = dataset_size
        if sample_rates is not None:
            rates = torch.as_tensor(sample_rates, dtype=torch.float64)
            require(
                rates.shape == (dataset_size,) and bool(((rates > 0) & (rates <= 1)).all()),
                "sample_rates",
                f"shape {tuple(rates.shape)}",
                f"{dataset_size} rates in (0, 1]",
                "Give one rate per example",
            )
            self.rates: torch.Tensor | None = rates  # (N,) public
            self.sample_rate = float(rates.max())
            self.normalizer = float(rates.sum()) if normalizer is None else float(normalizer)
        else:
            assert sample_rate is not None, "exactly one of the two, required above"
            require_sample_rate(sample_rate)
            self.rates = None
            self.sample_rate = float(sample_rate)
            self.normalizer = self.sample_rate * dataset_size
        self.generator = seeded_generator(seed)

    @property
    def steps_per_epoch(self) -> int:
        """Logical batches per pass: ⌈N/b⌉ (b the expected batch size)."""
        return max(1, math.ceil(self.dataset_size / self.normalizer - 1e-9))

    def draw(self) -> torch.Tensor:
        """One logical batch: the (sorted) indices of the examples that were sampled, (B,)."""
        u = uniform(self.dataset_size, self.generator)  # (N,)
        q = self.rates if self.rates is not None else self.sample_rate
        idx = torch.nonzero(u < q).flatten()  # (B,) B ~ Binomial(N, q)
        if self.shard is not None:
            rank, world = self.shard
            idx = idx[idx % world == rank]  # this rank's part of the global batch
        return idx

    def set_epoch(self, epoch: int) -> None:
        """Accepted for DistributedSampler-style loops; Poisson draws are fresh every step."""

    def physical_batches(self, idx: torch.Tensor, physical: int | None) -> list[torch.Tensor]:
        """A logical batch cut into physical batches of at most ``physical`` rows."""
        return list(idx.split(physical)) if physical and len(idx) else [idx]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        require_same_unit(self.units, state)
        restore_generator(self.generator, state["generator"])
