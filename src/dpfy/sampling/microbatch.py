"""Microbatch clipping: each step's Poisson batch is split into microbatches, and each
microbatch's *average* gradient is clipped to C (Ponomareva et al. 2023, "How to DP-fy ML",
§5.6, Algorithm 3; McMahan & Andrew 2018).

This is not the memory-only splitting of a logical batch into physical batches
(``max_physical_batch_size``): that is the same mechanism as one large batch, every example
clipped alone. Here the clipped unit is a microbatch, which changes the mechanism:

- **Sensitivity 2C** under add-or-remove one example: the example can move its microbatch's
  clipped average from one vector of norm ≤ C to another (g to −g), so the sum of clipped
  averages moves by at most 2C (by at most C when the microbatch was the example alone). The
  clipping policy declares Δ = 2C (:class:`dpfy.clipping.MicrobatchClipping`), the step adds
  N(0, (σ·2C)²) to the sum and asserts each microbatch's contribution is ≤ 2C, and the ledger
  records σ relative to that Δ: ε is the per-example run's ε at the same σ, the noise is twice
  as large.
- **The partition is drawn by dpfy**, afresh for every step and independently of the data:
  each sampled row draws its microbatch uniformly among M = round(b/k) microbatches (b the
  expected batch size, k the microbatch size; both from the configuration, never from the
  data). With this partition, removing one example changes its own microbatch only, for every
  value of the partition's randomness, which is what the 2C argument needs; a partition cut
  from a shuffled batch by position would not have it (removing one row shifts every later
  microbatch). Microbatches therefore hold k rows on average, not exactly k, and may be
  empty (an empty microbatch contributes 0).
- The released sum is divided by M, the expected number of microbatches (Algorithm 3's 1/M):
  the noise std on the released average gradient is 2σC/M.

With k = 1 microbatch clipping is per-example clipping (each row its own unit, Δ = C):
``make_private`` builds the ordinary Poisson sampler then, so the two runs are the same run.
The partition gives no k-group privacy: it is fresh every step (the guide's caveat (a)).
"""

from __future__ import annotations

from typing import Any

import torch

from dpfy._require import require, require_resumed
from dpfy.errors import PrivacyRefusal
from dpfy.sampling.admit import check_loader
from dpfy.sampling.draws import uniform
from dpfy.sampling.poisson import PoissonSampler
from dpfy.sampling.units import ExampleUnits, known_indices

__all__ = ["MicrobatchUnits", "MicrobatchSampler", "check_microbatch", "make_microbatch_sampler"]


class MicrobatchUnits(ExampleUnits):
    """The unit clipped is a microbatch: the rows of one step that drew the same microbatch.

    The unit of *privacy* stays one example (adjacency: add or remove one example); the unit
    *clipped* is the microbatch, whose mean gradient is clipped (:meth:`unit_scale`).

    Attributes:
      microbatch_of: (N,) the microbatch each example drew in the current step (−1: not in
        it). Sensitive: it is part of the step's randomness.
    """

    name = "example"
    adjacency_note = "add or remove one example"

    def __init__(self, dataset_size: int) -> None:
        self.microbatch_of = torch.full((dataset_size,), -1, dtype=torch.long)

    def units_of(self, indices: torch.Tensor | None) -> torch.Tensor | None:
        """(B,) each row's microbatch, numbered 0..U'−1 within the physical batch."""
        indices = known_indices(indices)
        bins = self.microbatch_of[indices.cpu()]
        require(
            bool((bins >= 0).all()),
            "the batch's rows",
            "not drawn in this step",
            "rows of the current logical batch",
            "Iterate the loader make_private returned",
        )
        return torch.unique(bins, return_inverse=True)[1]

    def unit_scale(self, unit_of_row: torch.Tensor) -> torch.Tensor:
        """(U',) 1/n_m: what is clipped is a microbatch's mean gradient (Algorithm 3)."""
        return 1.0 / torch.bincount(unit_of_row).to(torch.float64)


class MicrobatchSampler(PoissonSampler):
    """Poisson sampling at rate q, each sampled row assigned to one of M microbatches.

    Args:
      dataset_size: N. sample_rate: q = b/N.
      microbatch_size: k >= 2, the average number of rows of a microbatch.
      seed: None draws from the OS CSPRNG; an int seeds a torch generator (the batches and
        the partition come from the same generator).

    ``normalizer`` is M = max(1, round(b/k)), the expected number of microbatches, which the
    noisy sum of clipped microbatch means is divided by; ``steps_per_epoch`` stays ⌈N/b⌉.
    """

    def __init__(
        self,
        dataset_size: int,
        *,
        sample_rate: float,
        microbatch_size: int,
        seed: int | None = None,
    ) -> None:
        require(
            isinstance(microbatch_size, int)
            and not isinstance(microbatch_size, bool)
            and microbatch_size >= 2,
            "microbatch_size",
            microbatch_size,
            "an integer >= 2 here (k = 1 is per-example clipping)",
        )
        super().__init__(dataset_size, sample_rate=sample_rate, seed=seed)
        self.microbatch_size = microbatch_size
        self.expected_batch = self.sample_rate * dataset_size  # b, public
        self.num_microbatches = max(1, round(self.expected_batch / microbatch_size))  # M
        self.normalizer = float(self.num_microbatches)
        self.partition = MicrobatchUnits(dataset_size)  # which microbatch each row drew
        self.units = self.partition  # the unit of privacy's seam

    @property
    def steps_per_epoch(self) -> int:
        """Logical batches per pass: ⌈N/b⌉, b the expected batch size in rows."""
        return max(1, -(-self.dataset_size // max(1, round(self.expected_batch))))

    def draw(self) -> torch.Tensor:
        """One logical batch: the sampled rows, grouped by the microbatch each one drew."""
        idx = super().draw()  # (B,) sorted
        m = self.num_microbatches
        u = uniform(len(idx), self.generator)
        bins = torch.clamp((u * m).long(), max=m - 1)  # (B,) uniform on 0..M−1
        order = torch.argsort(bins, stable=True)
        self.partition.microbatch_of.fill_(-1)
        self.partition.microbatch_of[idx] = bins
        return idx[order]

    def physical_batches(self, idx: torch.Tensor, physical: int | None) -> list[torch.Tensor]:
        """Physical batches of at most ``physical`` rows, cut between microbatches only (a
        microbatch's rows are averaged and clipped together, in one physical batch)."""
        if not physical or len(idx) <= physical:
            return [idx]
        counts = torch.unique_consecutive(self.partition.microbatch_of[idx], return_counts=True)[
            1
        ].tolist()
        parts, begin, end = [], 0, 0
        for c in counts:
            if c > physical:
                raise PrivacyRefusal(
                    f"max_physical_batch_size must hold a whole microbatch, got a microbatch "
                    f"of {c} rows and max_physical_batch_size = {physical}. Raise it (to a few "
                    f"times microbatch_size), or use a smaller microbatch_size"
                )
            if end + c - begin > physical:
                parts.append(idx[begin:end])
                begin = end
            end += c
        parts.append(idx[begin:end])
        return parts

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "microbatch_size": self.microbatch_size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        require_resumed(
            "microbatch_size",
            state.get("microbatch_size"),
            self.microbatch_size,
            "Resume with the same clipping='microbatch' and microbatch_size",
        )
        super().load_state_dict(state)


def check_microbatch(clipping: str, microbatch_size: int | None, *, poisson_sampling: bool) -> str:
    """The clipping policy to build: ``"flat"`` for ``"microbatch"`` at k = 1 (per-example
    clipping, Δ = C), else ``clipping``; refuses what microbatch clipping cannot account.

    The features it cannot be combined with (user ids, per-example rates, methods,
    individualized budgets, data-parallel ranks) are declared in :mod:`dpfy.spec.check`.
    """
    if clipping != "microbatch":
        require(
            microbatch_size is None,
            "microbatch_size",
            microbatch_size,
            "None unless clipping='microbatch'",
            "Pass clipping='microbatch' with it",
        )
        return clipping
    require(
        isinstance(microbatch_size, int)
        and not isinstance(microbatch_size, bool)
        and microbatch_size >= 1,
        "microbatch_size",
        microbatch_size,
        "an integer >= 1 with clipping='microbatch'",
        "Pass microbatch_size=k, the number of rows whose mean gradient is clipped",
    )
    require(
        poisson_sampling,
        "poisson_sampling",
        False,
        "True with clipping='microbatch'",
        "Microbatch clipping's 2C bound is proven for Poisson sampling with dpfy's "
        "partition; drop poisson_sampling=False",
    )
    return "flat" if microbatch_size == 1 else clipping


def make_microbatch_sampler(
    loader: Any, microbatch_size: int, *, seed: int | None
) -> MicrobatchSampler:
    """The sampler for ``clipping="microbatch"`` at k >= 2: Poisson at q = batch_size / N."""
    check_loader(loader, True)
    n = len(loader.dataset)
    b = loader.batch_size
    require(1 <= b <= n, "loader.batch_size", b, f"in [1, {n}]")
    return MicrobatchSampler(n, sample_rate=b / n, microbatch_size=microbatch_size, seed=seed)
