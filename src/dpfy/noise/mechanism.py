"""The noise mechanism: what noise a step adds and what event the ledger records for it.

The private step asks its mechanism two things each step (docs/architecture.md):

- :meth:`GaussianMechanism.record_for` — the event to record: which releases at which noise
  multipliers, under which sampling and rate (what the ε guard checks before any noise is
  drawn and the ledger records after);
- :meth:`GaussianMechanism.generator` — the generator that draws this step's noise.

A mechanism has state (its generator's, here) that checkpoints and resumes with the run, and
it states the sampling schemes its accounting assumes; ``make_private`` checks the sampler
against them. :class:`GaussianMechanism` — fresh, independent Gaussian noise at every step,
DP-SGD's mechanism — is the first implementation. Correlated-noise mechanisms (DP-FTRL's tree
aggregation, banded matrix factorization) add noise that depends on earlier steps' draws and
record their own events; they implement the same three methods.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Protocol

import torch

from dpfy._require import require
from dpfy.noise.generator import NoiseSource
from dpfy.privacy.ledger import Ledger, Release
from dpfy.privacy.releases import step_releases
from dpfy.types import ReleaseSpec, Sampling, StepPlan

__all__ = ["StepRecord", "NoiseMechanism", "GaussianMechanism"]


@dataclass(frozen=True)
class StepRecord:
    """What one step releases, as the ledger records it: the sampling and rate the sampler
    reported and the step's releases (the gradient sum first)."""

    sampling: Sampling
    sample_rate: float
    releases: tuple[Release, ...]
    max_examples_per_user: int | None = None  # k of an ELS step (the sampler's fact)

    def __post_init__(self) -> None:
        # the releases as a tuple even where a mechanism passes its own list: the ε guard keys
        # its count of steps under the cap on the record, which must not change afterwards
        object.__setattr__(self, "releases", tuple(self.releases))

    def record(self, ledger: Ledger, count: int = 1) -> None:
        """Record this step (``count`` times: the ε guard's trial steps) in ``ledger``."""
        ledger.record_like(self, count)


class StepNoise(Protocol):
    """What the step draws its noise through: the released mean and the scalar releases."""

    def noisy_mean(self, total: torch.Tensor, std: float, normalizer: float) -> torch.Tensor: ...
    def add_gaussian_(self, t: torch.Tensor, std: float, chunk: int = ...) -> torch.Tensor: ...


class NoiseMechanism(Protocol):
    """What the private step needs of a noise mechanism."""

    name: str
    samplings: tuple[Sampling, ...]

    def record_for(self, plan: StepPlan, specs: Mapping[str, ReleaseSpec]) -> StepRecord: ...
    def generator(self) -> StepNoise: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class GaussianMechanism:
    """Independent Gaussian noise at every step: S̃_t = S_t + N(0, (σ_t Δ)² I).

    Records :func:`dpfy.privacy.releases.step_releases` under the sampler's sampling and rate:
    a Poisson- or fixed-size-subsampled Gaussian (amplified), or a shuffled one (accounted
    without amplification). Its state is the generator's: a seeded one's is secret (it
    continues the noise); a secure one's holds no key and is re-keyed on load.

    Args:
      source: the generator (secure ChaCha20 by default, or seeded).
      sampling, sample_rate: the sampler's facts, recorded with every step.
    """

    name = "gaussian"
    samplings: tuple[Sampling, ...] = (
        Sampling.POISSON,
        Sampling.FIXED_SIZE,
        Sampling.SHUFFLE,
        Sampling.ULS,
        Sampling.ELS,
    )

    def __init__(
        self,
        source: NoiseSource,
        *,
        sampling: Sampling,
        sample_rate: float,
        max_examples_per_user: int | None = None,
    ) -> None:
        require(
            sampling in self.samplings,
            "sampling",
            sampling,
            f"one of {[s.value for s in self.samplings]} for the Gaussian mechanism",
            "Use dpfy's Poisson or shuffled sampler (make_private builds one)",
        )
        self.source, self.sampling, self.sample_rate = source, sampling, sample_rate
        self.max_examples_per_user = max_examples_per_user

    def record_for(self, plan: StepPlan, specs: Mapping[str, ReleaseSpec]) -> StepRecord:
        """The event of a step with ``plan`` and extra releases ``specs``."""
        return StepRecord(
            self.sampling, self.sample_rate, step_releases(plan, specs), self.max_examples_per_user
        )

    def generator(self) -> NoiseSource:
        """The generator of this step's noise (every step: the same stream, continued)."""
        return self.source

    def state_dict(self) -> dict[str, Any]:
        return self.source.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.source.load_state_dict(state)
