"""Sampling kinds as values: each builds the privacy event of a run for a given σ and steps.

A calibration needs "the ledger this run would record if its noise multiplier were σ"
(:func:`dpfy.privacy.search.calibrate`). The sampling kind decides that ledger's shape: how
examples (or users) enter a step, hence amplification, adjacency and the unit of privacy
(:class:`~dpfy.privacy.ledger.Sampling` explains each). A kind is a small frozen value carrying
exactly its own parameters, and :meth:`SamplingKind.ledger` records ``steps`` identical steps
of it; :meth:`SamplingKind.dp_event` is the same run as a nested dp_accounting event
(``PoissonSampledDpEvent(q, GaussianDpEvent(σ))`` composed ``steps`` times for :class:`Poisson`).

    >>> from dpfy.privacy.events import Poisson
    >>> Poisson(0.01).ledger(1.1, steps=1000).num_steps
    1000

The kinds record through :meth:`Ledger.homogeneous`, the constructor the engine's ledger is
compared with, so no kind has its own accounting: the ledger's checks refuse what the
accountants cannot prove (e.g. ELS without its cap, cyclic Poisson without its bands).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from dpfy.privacy._dp_accounting import dp_accounting
from dpfy.privacy.ledger import Ledger, Sampling

__all__ = [
    "SamplingKind",
    "Poisson",
    "UserLevelSampling",
    "ExampleLevelSampling",
    "CyclicPoisson",
    "Shuffled",
    "FixedSize",
    "Unsampled",
    "sampling_kind",
]


@dataclass(frozen=True)
class SamplingKind:
    """How the units of one step are chosen, with the rate q it records.

    Args:
      sample_rate: q recorded per step (the user rate for :class:`UserLevelSampling`).
      dataset_size: N (needed by :class:`FixedSize` and :class:`Shuffled`; recorded otherwise).
      max_examples_per_user: k, the cap on one user's examples (user-level kinds).
    """

    sampling: ClassVar[Sampling]
    sample_rate: float
    dataset_size: int | None = field(default=None, kw_only=True)
    max_examples_per_user: int | None = field(default=None, kw_only=True)

    def release(self, noise: str, period: int | None) -> tuple[str, int | None]:
        """The (noise, period) each step's gradient release records."""
        return noise, period

    def ledger(
        self,
        noise_multiplier: float,
        steps: int,
        *,
        noise: str = "gaussian",
        period: int | None = None,
    ) -> Ledger:
        """The ledger of ``steps`` identical steps at σ = ``noise_multiplier``; ``noise`` and
        ``period`` are the mechanism's correlation (:class:`~dpfy.privacy.ledger.Release`)."""
        noise, period = self.release(noise, period)
        return Ledger.homogeneous(
            sample_rate=self.sample_rate,
            noise_multiplier=noise_multiplier,
            steps=steps,
            sampling=self.sampling,
            dataset_size=self.dataset_size,
            max_examples_per_user=self.max_examples_per_user,
            noise=noise,
            period=period,
        )

    def dp_event(
        self,
        noise_multiplier: float,
        steps: int,
        *,
        noise: str = "gaussian",
        period: int | None = None,
    ) -> dp_accounting.DpEvent:
        """The same run as dp_accounting's nested event, every release with its own σ."""
        return self.ledger(noise_multiplier, steps, noise=noise, period=period).dp_event()


@dataclass(frozen=True)
class Poisson(SamplingKind):
    """Each example joins a step independently with probability q (add-or-remove one)."""

    sampling = Sampling.POISSON


@dataclass(frozen=True)
class UserLevelSampling(SamplingKind):
    """Each user joins a step with probability q (the user rate); the cap on a user's examples
    per step bounds their clipped unit and is not accounted (the ledger records k for ELS only,
    and refuses it here)."""

    sampling = Sampling.ULS


@dataclass(frozen=True)
class ExampleLevelSampling(SamplingKind):
    """Each example joins with probability q; a user holds at most k examples (user-level ε)."""

    sampling = Sampling.ELS


@dataclass(frozen=True)
class CyclicPoisson(SamplingKind):
    """Poisson sampling inside ``bands`` groups visited in turn, for BandMF's ``bands`` bands.

    Its steps record BandMF's band count as the release's period (``bands=1`` with
    ``noise="gaussian"`` asked for is DP-SGD's noise; any other noise is the caller's)."""

    sampling = Sampling.CYCLIC_POISSON
    bands: int | None = None

    def release(self, noise: str, period: int | None) -> tuple[str, int | None]:
        if self.bands is None:
            return noise, period
        return "bandmf", self.bands


@dataclass(frozen=True)
class Shuffled(SamplingKind):
    """Fixed-size batches from shuffled passes: replace-one, no amplification claimed."""

    sampling = Sampling.SHUFFLE


@dataclass(frozen=True)
class FixedSize(SamplingKind):
    """A fresh batch of exactly q·N examples without replacement each step (replace-one)."""

    sampling = Sampling.FIXED_SIZE


@dataclass(frozen=True)
class Unsampled(SamplingKind):
    """Every example in every step: no amplification."""

    sampling = Sampling.NONE


_KINDS: dict[Sampling, type[SamplingKind]] = {
    k.sampling: k
    for k in (
        Poisson,
        UserLevelSampling,
        ExampleLevelSampling,
        CyclicPoisson,
        Shuffled,
        FixedSize,
        Unsampled,
    )
}


def sampling_kind(
    sampling: Sampling,
    sample_rate: float,
    *,
    dataset_size: int | None = None,
    max_examples_per_user: int | None = None,
) -> SamplingKind:
    """The kind a sampler's :class:`~dpfy.privacy.ledger.Sampling` and facts describe."""
    return _KINDS[Sampling(sampling)](
        sample_rate, dataset_size=dataset_size, max_examples_per_user=max_examples_per_user
    )
