"""The records a privacy ledger holds: one noisy :class:`Release` and a :class:`StepGroup` of
identical steps.

A :class:`~dpfy.privacy.ledger.Ledger` is a list of step groups; each turns one of its steps into
a ``dp_accounting`` ``DpEvent`` (:meth:`StepGroup.step_event`). The ledger file format
(``dpfy-ledger/1``) is these records' ``to_dict``; :mod:`dpfy.privacy.ledger_json` reads it back
with every field checked.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from dpfy._require import require
from dpfy.privacy._dp_accounting import dp_accounting
from dpfy.privacy.mixture import els_dp_event
from dpfy.types.sampling import Sampling, require_sample_rate

__all__ = ["Release", "StepGroup", "NOISES"]

# How the noise of successive steps is related (see Release.noise).
NOISES = ("gaussian", "tree", "bandmf")


@dataclass(frozen=True)
class Release:
    """One noisy Gaussian release inside a step: Σ_i v_i + N(0, (σ·Δ)²).

    Args:
      mechanism: what was released, e.g. ``"gradient"``, ``"quantile_count"``,
        ``"threshold_gradient"``, ``"loss_probe"``.
      noise_multiplier: σ, the noise std divided by the release's L2 sensitivity Δ
        (add/remove one example). 0 means no noise: the release is not private.
      noise: how the noise of successive steps is related: ``"gaussian"`` (independent each
        step), ``"tree"`` (DP-FTRL's tree aggregation, Kairouz et al. 2021: σ is per tree node,
        the tree restarts every ``period`` steps) or ``"bandmf"`` (banded matrix
        factorization, Choquette-Choo et al. 2023: σ relative to a strategy whose columns have
        norm ≤ 1, ``period`` = the band count b). Accounted by
        :mod:`dpfy.privacy.correlated`.
      period: the tree's restart length or BandMF's band count (None for ``"gaussian"``).
    """

    mechanism: str
    noise_multiplier: float
    noise: str = "gaussian"
    period: int | None = None

    def __post_init__(self) -> None:
        require(
            isinstance(self.mechanism, str) and self.mechanism != "",
            "mechanism",
            self.mechanism,
            "a non-empty name",
            "Name what is released, e.g. 'gradient'",
        )
        require(
            self.noise_multiplier >= 0 and math.isfinite(self.noise_multiplier),
            "noise_multiplier",
            self.noise_multiplier,
            ">= 0 and finite",
            "Pass the noise std divided by the release's sensitivity",
        )
        # Outside [1e-100, 1e100] the accountants' σ² underflows (dp_accounting divides by it)
        # or overflows; ε would be above 1e200, or 0 to every printed digit, anyway.
        require(
            self.noise_multiplier == 0 or 1e-100 <= self.noise_multiplier <= 1e100,
            "noise_multiplier",
            self.noise_multiplier,
            "0 or in [1e-100, 1e100]",
            "Pass 0 for a release without noise",
        )
        require(self.noise in NOISES, "noise", self.noise, f"one of {list(NOISES)}")
        require(
            (self.period is None) == (self.noise == "gaussian")
            and (self.period is None or isinstance(self.period, int) and self.period >= 1),
            "period",
            self.period,
            "an integer >= 1 for correlated noise, None otherwise",
        )

    def to_dict(self) -> dict[str, Any]:
        """The serialized release (``noise`` and ``period`` only when correlated)."""
        d: dict[str, Any] = {"mechanism": self.mechanism, "noise_multiplier": self.noise_multiplier}
        if self.noise != "gaussian":
            d.update(noise=self.noise, period=self.period)
        return d

    @classmethod
    def from_dict(cls, r: dict[str, Any]) -> "Release":
        """The release :meth:`to_dict` wrote."""
        return cls(
            r["mechanism"],
            float(r["noise_multiplier"]),
            r.get("noise", "gaussian"),
            r.get("period"),
        )

    def dp_event(self) -> dp_accounting.DpEvent:
        """The unsampled event of this release."""
        if self.noise_multiplier == 0:
            return dp_accounting.NonPrivateDpEvent()
        if self.noise == "tree":
            return dp_accounting.SingleEpochTreeAggregationDpEvent(
                self.noise_multiplier, self.period
            )
        return dp_accounting.GaussianDpEvent(self.noise_multiplier)


@dataclass(frozen=True)
class StepGroup:
    """``count`` consecutive identical steps starting at ``first_step`` (0-based).

    Args:
      first_step: index of the first step of the run.
      count: number of identical steps (>= 1).
      sampling: how the batch of each step was formed.
      sample_rate: q, the probability an example is in a step's batch (Poisson), or
        batch_size / dataset_size for shuffled batches (informational only: not amplified).
      releases: the noisy releases of one step; composed within the step.
      max_examples_per_user: k, the most examples one user holds in the training set, for
        ``Sampling.ELS`` steps (their user-level accounting needs it); None for every other
        sampling. The sampler reports it; the accountant never guesses it.
    """

    first_step: int
    count: int
    sampling: Sampling
    sample_rate: float
    releases: tuple[Release, ...]
    max_examples_per_user: int | None = None

    def __post_init__(self) -> None:
        require(self.first_step >= 0, "first_step", self.first_step, ">= 0")
        require(self.count >= 1, "count", self.count, ">= 1")
        require(
            isinstance(self.sampling, Sampling),
            "sampling",
            self.sampling,
            f"one of {[s.value for s in Sampling]}",
        )
        require_sample_rate(self.sample_rate)
        require(len(self.releases) >= 1, "releases", self.releases, "at least one Release")
        k = self.max_examples_per_user
        if self.sampling.needs_max_examples_per_user:
            require(
                isinstance(k, int) and not isinstance(k, bool) and k >= 1,
                "max_examples_per_user",
                k,
                f"an integer >= 1 for {self.sampling.value} steps",
                "Record the cap k the sampler applied (dpfy's ELS sampler reports it)",
            )
        else:
            require(
                k is None,
                "max_examples_per_user",
                k,
                f"None for {self.sampling.value} steps (only ELS records k)",
            )

    @property
    def last_step(self) -> int:
        return self.first_step + self.count - 1

    def same_step_as(self, other: "StepGroup") -> bool:
        return (self.sampling, self.sample_rate, self.releases, self.max_examples_per_user) == (
            other.sampling,
            other.sample_rate,
            other.releases,
            other.max_examples_per_user,
        )

    def effective_noise_multiplier(self) -> float:
        """σ_eff of one step's releases taken together (0 if any release has no noise).

        The releases of one step are computed on the same batch, so stacking them, each
        divided by its σ_i·Δ_i, is one Gaussian mechanism whose sensitivity is
        sqrt(Σ σ_i⁻²). Its noise multiplier is σ_eff = (Σ_i σ_i⁻²)^(−1/2): exact, not a bound
        (Galli et al. 2024, Proposition 1; Andrew et al. 2021).
        """
        sigmas = [r.noise_multiplier for r in self.releases]
        if min(sigmas) == 0:
            return 0.0
        # the same value, scaled by the smallest σ so that σ**-2 cannot overflow (σ = 1e-300)
        low = min(sigmas)
        return low / math.sqrt(sum((low / s) ** 2 for s in sigmas))

    def step_event(self, dataset_size: int | None = None) -> dp_accounting.DpEvent:
        """The DpEvent of *one* step of this group, as recorded (before accounting).

        POISSON and ULS: ``PoissonSampledDpEvent(q, releases)``; ELS: the user-level
        ``MixtureOfGaussiansDpEvent`` at the step's combined σ (:mod:`dpfy.privacy.mixture`);
        FIXED_SIZE:
        ``SampledWithoutReplacementDpEvent(N, b, releases)`` (needs ``dataset_size``);
        SHUFFLE and NONE: the unsampled releases. The accountants do not read these events
        directly; they read :func:`dpfy.privacy.canonical.canonical_form`, which applies the
        adjacency and participation rules of :class:`Sampling`.
        """
        inner = (
            self.releases[0].dp_event()
            if len(self.releases) == 1
            else dp_accounting.ComposedDpEvent([r.dp_event() for r in self.releases])
        )
        if self.sampling is Sampling.ELS:  # the user-level event, the step's σ combined
            k = self.max_examples_per_user
            assert k is not None  # an ELS step group always records k (its constructor checks)
            return els_dp_event(self.sample_rate, self.effective_noise_multiplier(), int(k))
        if self.sampling in (Sampling.POISSON, Sampling.ULS) and self.sample_rate < 1:
            return dp_accounting.PoissonSampledDpEvent(self.sample_rate, inner)
        if self.sampling is Sampling.FIXED_SIZE and dataset_size is not None:
            return dp_accounting.SampledWithoutReplacementDpEvent(
                dataset_size, max(1, round(self.sample_rate * dataset_size)), inner
            )
        return inner

    def dp_event(self, dataset_size: int | None = None) -> dp_accounting.DpEvent:
        """The DpEvent of all ``count`` steps of this group, as recorded."""
        step = self.step_event(dataset_size)
        return step if self.count == 1 else dp_accounting.SelfComposedDpEvent(step, self.count)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["sampling"] = self.sampling.value
        d["releases"] = [r.to_dict() for r in self.releases]
        if self.max_examples_per_user is None:
            del d["max_examples_per_user"]  # example-level ledgers keep their old form
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "StepGroup":
        return cls(
            first_step=int(d["first_step"]),
            count=int(d["count"]),
            sampling=Sampling(d["sampling"]),
            sample_rate=float(d["sample_rate"]),
            releases=tuple(Release.from_dict(r) for r in d["releases"]),
            max_examples_per_user=d.get("max_examples_per_user"),
        )
