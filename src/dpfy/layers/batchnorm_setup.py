"""BatchNorm statistics in a private run: public, or privatized and recorded in the ledger.

:func:`setup_batchnorm` is what ``make_private(batchnorm=..., ...)`` calls before it builds the
gradient engine (it converts the model's BatchNorms), and :meth:`BatchNormSetup.finish` what it
calls once the private optimizer exists. Used by hand, the same two steps are
:func:`~dpfy.layers.privatized_batchnorm.privatized_batchnorm` before ``make_private`` and
:func:`attach_privatized_statistics` after it.

Attaching privatized statistics to a run:

- the run's noise mechanism is wrapped (:class:`WithStatisticsReleases`) so that every step's
  record, which the ε guard checks before any noise is drawn and the ledger then records, holds
  the statistics' releases after the gradient's; once recorded, the released statistics are
  folded into the running estimates (:meth:`PrivatizedStatistics.commit`);
- the statistics are drawn from the run's noise generator, divided by the sampler's expected
  batch size, and keyed to the loader's logical batches (one release per layer and batch);
- σ: with ``share=f``, the statistics take the fraction f of each step's Gaussian precision.
  A σ that ``make_private`` calibrated to a target ε is the step's effective σ_eff: the
  gradient then gets σ_g = σ_eff/√(1−f) and each of the k = 2L releases σ_bn = σ_eff·√(k/f),
  so σ_g⁻² + k·σ_bn⁻² = σ_eff⁻² and the run spends exactly its target (the accountants collapse
  a step's releases to σ_eff exactly, ``dpfy.privacy.canonical``). A declared σ_bn with a
  calibrated σ leaves the gradient σ_g = (σ_eff⁻² − k·σ_bn⁻²)^(−1/2). A σ given by the user is
  the gradient's: the statistics add to the run's ε (declared σ_bn, or
  σ_bn = σ_g·√(k(1−f)/f)).

Refused (each names the fix): correlated noise (its accounting covers the gradient alone),
individualized budgets and data-parallel ranks (the statistics would be per group or per rank),
units of privacy other than one example per row, a method that sets σ with ``share`` or a
calibrated σ, a run that already stepped, and logical batches cut into physical ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch
from torch import nn
from torch.utils.data import Dataset

from dpfy._require import require
from dpfy.errors import PrivacyRefusal
from dpfy.layers.privatized_batchnorm import (
    PrivatizedStatistics,
    privatized_batchnorm,
    privatized_statistics_of,
)
from dpfy.layers.public_batchnorm import PublicStatistics, public_batchnorm
from dpfy.noise.mechanism import StepRecord
from dpfy.privacy.ledger import Ledger
from dpfy.types import ReleaseSpec, StepPlan

__all__ = [
    "BATCHNORM_MODES",
    "BatchNormSetup",
    "StatisticsRecord",
    "WithStatisticsReleases",
    "attach_privatized_statistics",
    "check_batchnorm_arguments",
    "setup_batchnorm",
    "split_noise_multiplier",
]

BATCHNORM_MODES = ("public", "privatized")
# The statistics' share of each step's precision when neither σ_bn nor a share is declared:
# the share chosen on the validation split of experiments/batchnorm/privatized.py at ε = 0.5 and
# 3 (from {0.1, 0.3}; 0.1 at ε = 0.1), never on the test set.
DEFAULT_SHARE = 0.3


@dataclass(frozen=True)
class StatisticsRecord(StepRecord):
    """A step's record with the statistics' releases; recording it commits the statistics."""

    commit: Callable[[], None] | None = field(default=None, compare=False, repr=False)

    def record(self, ledger: Ledger, count: int = 1) -> None:
        super().record(ledger, count)
        if self.commit is not None:
            self.commit()  # post-processing of what was just recorded


class WithStatisticsReleases:
    """The run's noise mechanism, with the privatized statistics' releases in every record."""

    def __init__(self, inner: Any, stats: PrivatizedStatistics) -> None:
        self.inner, self.stats = inner, stats

    @property
    def name(self) -> str:
        return str(self.inner.name)

    @property
    def samplings(self) -> Any:
        return self.inner.samplings

    def record_for(self, plan: StepPlan, specs: Mapping[str, ReleaseSpec]) -> StatisticsRecord:
        rec = self.inner.record_for(plan, specs)
        return StatisticsRecord(
            rec.sampling,
            rec.sample_rate,
            tuple(rec.releases) + self.stats.releases(),
            rec.max_examples_per_user,
            commit=self.stats.commit,
        )

    def generator(self) -> Any:
        return self.inner.generator()

    def state_dict(self) -> dict[str, Any]:
        return dict(self.inner.state_dict())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state)

    def __getattr__(self, name: str) -> Any:  # the inner mechanism's other facts
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


def split_noise_multiplier(
    sigma: float,
    releases: int,
    *,
    share: float | None = None,
    bn_noise_multiplier: float | None = None,
    calibrated: bool,
) -> tuple[float, float]:
    """(σ_g, σ_bn): the gradient's and each statistics release's noise multiplier.

    ``calibrated``: ``sigma`` is the step's effective σ_eff (calibrated to a target ε), split
    so that σ_g⁻² + k·σ_bn⁻² = σ_eff⁻² with k = ``releases``; else ``sigma`` is the gradient's
    and σ_bn is the declared one or the one that takes ``share`` of the step's precision.
    """
    require(sigma > 0 and math.isfinite(sigma), "noise_multiplier", sigma, "> 0 and finite")
    k = releases
    if share is not None:
        if calibrated:
            return sigma / math.sqrt(1 - share), sigma * math.sqrt(k / share)
        return sigma, sigma * math.sqrt(k * (1 - share) / share)
    assert bn_noise_multiplier is not None, "PrivatizedStatistics holds one of them"
    if not calibrated:
        return sigma, bn_noise_multiplier
    rest = sigma**-2 - k * bn_noise_multiplier**-2
    require(
        rest > 0,
        "bn_noise_multiplier",
        bn_noise_multiplier,
        f"> {sigma * math.sqrt(k):.6g} (σ_eff·√k: the {k} statistics releases alone would "
        f"spend the whole target at σ_eff = {sigma:.6g})",
        "Raise bn_noise_multiplier, or give the statistics a share= of each step instead",
    )
    return rest**-0.5, bn_noise_multiplier


def attach_privatized_statistics(
    stats: PrivatizedStatistics, optimizer: Any, *, calibrated: bool = False
) -> None:
    """Record ``stats``' releases in ``optimizer``'s run (a ``DPOptimizer`` that has not
    stepped yet) and draw them from its noise, per logical batch of its loader (module
    docstring). ``calibrated``: the run's σ was calibrated to a target ε (it is split)."""
    step = optimizer.private_step
    _refuse_unsupported(step, stats, calibrated)
    if stats.share is not None or calibrated:
        sigma_g, sigma_bn = split_noise_multiplier(
            float(step.noise_multiplier),
            stats.num_releases,
            share=stats.share,
            bn_noise_multiplier=stats.noise_multiplier,
            calibrated=calibrated,
        )
        step.noise_multiplier, stats.noise_multiplier = sigma_g, sigma_bn
    stats.cursor = step.cursor
    stats.expected_batch_size = float(step.sampler.normalizer)
    stats.noise = step.mechanism.generator()
    step.mechanism = WithStatisticsReleases(step.mechanism, stats)


def _refuse_unsupported(step: Any, stats: PrivatizedStatistics, calibrated: bool) -> None:
    """What the statistics' accounting does not cover (module docstring)."""
    require(
        not isinstance(step.mechanism, WithStatisticsReleases),
        "the optimizer",
        "one with privatized statistics attached",
        "a run without them",
        "Attach the statistics once",
    )
    require(
        len(step.ledger) == 0,
        "the run's ledger",
        f"{len(step.ledger)} steps",
        "empty when privatized statistics are attached",
        "Attach them right after make_private, before training",
    )
    name = step.mechanism.name
    require(
        name == "gaussian",
        "noise",
        name,
        "'gaussian' with privatized BatchNorm statistics",
        "Their releases are independent Gaussians; correlated-noise accounting covers the "
        "gradient alone",
    )
    refused = {
        "individualized budgets": step.individual is not None,
        "data-parallel ranks": step.collective is not None,
    }
    given = [k for k, v in refused.items() if v]
    require(
        not given,
        "the run",
        given,
        "none of these with privatized BatchNorm statistics",
        "Each group or rank would need its own statistics release; use GroupNorm "
        "(dpfy.validate(model, fix=True)) or public statistics",
    )
    units = step.sampler.units
    require(
        getattr(units, "name", None) == "example" and type(units).__name__ == "ExampleUnits",
        "the unit of privacy",
        getattr(units, "name", type(units).__name__),
        "one example per row with privatized BatchNorm statistics",
        "Each row's statistics are clipped as one example's; drop user_ids=, augmult= "
        "and microbatch clipping, or use GroupNorm",
    )
    method = step.method
    if method is not None and "noise_multiplier" in method.sets:
        require(
            stats.share is None and not calibrated,
            "bn share / calibration",
            "with a method that sets σ",
            "a declared bn_noise_multiplier",
            "The method's σ_t changes every step; declare σ_bn (noise_multiplier=)",
        )
    if step.noise_multiplier is None or step.noise_multiplier == 0:
        require(
            stats.share is None and not calibrated,
            "noise_multiplier",
            step.noise_multiplier,
            "> 0 to derive σ_bn from the run's σ",
            "Declare σ_bn (noise_multiplier=)",
        )


@dataclass
class BatchNormSetup:
    """What :func:`setup_batchnorm` did to the model; :meth:`finish` completes it."""

    mode: str | None
    model: nn.Module
    stats: PrivatizedStatistics | PublicStatistics | None = None

    def finish(self, optimizer: Any, *, calibrated: bool) -> None:
        """After the private optimizer is built: attach privatized statistics to its run, the
        ones made here or by a :func:`privatized_batchnorm` call before ``make_private`` (public
        statistics are attached by ``make_private``'s own refresh hook)."""
        stats = self.stats if self.mode == "privatized" else privatized_statistics_of(self.model)
        if isinstance(stats, PrivatizedStatistics):
            attach_privatized_statistics(stats, optimizer, calibrated=calibrated)


def check_batchnorm_arguments(
    batchnorm: str | None,
    *,
    public_data: bool,
    bn_bound: float | None,
    bn_noise_multiplier: float | None,
    bn_share: float | None,
    extra: tuple[str, ...] = (),
) -> None:
    """Refuse a ``batchnorm`` mode outside :data:`BATCHNORM_MODES`, an argument given without
    the mode it belongs to (``extra``: the names of other public-data arguments given), and a
    mode without what it needs (public data, the bound A)."""
    require(
        batchnorm is None or batchnorm in BATCHNORM_MODES,
        "batchnorm",
        batchnorm,
        f"None or one of {list(BATCHNORM_MODES)}",
    )
    given = {
        "public_data": public_data,
        **{name: True for name in extra},
        "bn_bound": bn_bound is not None,
        "bn_noise_multiplier": bn_noise_multiplier is not None,
        "bn_share": bn_share is not None,
    }
    privatized = ("bn_bound", "bn_noise_multiplier", "bn_share")
    allowed = {None: (), "public": ("public_data", *extra), "privatized": privatized}[batchnorm]
    stray = sorted(k for k, v in given.items() if v and k not in allowed)
    require(
        not stray,
        "arguments",
        stray,
        f"none of them with batchnorm={batchnorm!r}",
        "Pass batchnorm='public' with public_data=, or batchnorm='privatized' with bn_bound=",
    )
    require(
        batchnorm != "public" or public_data,
        "public_data",
        None,
        "a tensor or Dataset of public inputs with batchnorm='public'",
        "Pass the declared public data the statistics come from",
    )
    require(
        batchnorm != "privatized" or bn_bound is not None,
        "bn_bound",
        None,
        "a number > 0 with batchnorm='privatized'",
        "Declare the activation bound each example's statistics are clipped to",
    )


def setup_batchnorm(
    model: nn.Module,
    batchnorm: str | None,
    *,
    public_data: torch.Tensor | Dataset | None = None,
    public_batch_size: int = 256,
    public_description: str = "public data",
    bn_bound: float | None = None,
    bn_noise_multiplier: float | None = None,
    bn_share: float | None = None,
    max_physical_batch_size: int | None = None,
) -> BatchNormSetup:
    """Convert ``model``'s BatchNorms for a private run, before the gradient engine is built.

    ``batchnorm``: None (nothing: a BatchNorm is then refused by the engine, naming the
    fixes), ``"public"`` (statistics from ``public_data``, :func:`public_batchnorm`) or
    ``"privatized"`` (noisy released statistics, clipped to ``bn_bound``, at
    ``bn_noise_multiplier`` or taking ``bn_share`` of each step's privacy).
    """
    check_batchnorm_arguments(
        batchnorm,
        public_data=public_data is not None,
        bn_bound=bn_bound,
        bn_noise_multiplier=bn_noise_multiplier,
        bn_share=bn_share,
    )
    if batchnorm is None:
        return BatchNormSetup(None, model)
    if batchnorm == "public":
        assert public_data is not None  # required above
        public = public_batchnorm(
            model, public_data, batch_size=public_batch_size, description=public_description
        )
        return BatchNormSetup("public", model, public)
    if max_physical_batch_size is not None:  # also declared in dpfy.spec.check
        raise PrivacyRefusal(
            f"max_physical_batch_size must be None with batchnorm='privatized', got "
            f"max_physical_batch_size = {max_physical_batch_size}: the statistics are released "
            f"once per logical batch, from all of it. Drop max_physical_batch_size= (lower the "
            f"batch size if memory is short)"
        )
    assert bn_bound is not None
    if bn_noise_multiplier is None and bn_share is None:
        bn_share = DEFAULT_SHARE
    stats = privatized_batchnorm(
        model, bound=bn_bound, noise_multiplier=bn_noise_multiplier, share=bn_share
    )
    return BatchNormSetup("privatized", model, stats)
