"""The run's noise mechanism and horizon, built on the sampler's facts from the spec."""

from __future__ import annotations

import math
from typing import Any

from dpfy._require import require
from dpfy.noise import (
    BandMFMechanism,
    GaussianMechanism,
    NoiseMechanism,
    NoiseSource,
    TreeMechanism,
)
from dpfy.noise.toeplitz import optimize_banded
from dpfy.spec.run import Gaussian, Mechanism, Tree

__all__ = ["horizon", "mechanism"]


def mechanism(
    spec: Mechanism, source: NoiseSource, *, sampler: Any, horizon: int
) -> NoiseMechanism:
    """The run's noise mechanism on the sampler's facts (BandMF's strategy optimized for the
    prefix sums of ``horizon`` steps), at the spec's calibrated σ."""
    noise, noise_multiplier = spec.name, spec.noise_multiplier
    if isinstance(spec, Gaussian):
        return GaussianMechanism(
            source,
            sampling=sampler.sampling,
            sample_rate=sampler.sample_rate,
            max_examples_per_user=getattr(sampler, "max_examples_per_user", None),
        )
    require(
        noise_multiplier is not None and noise_multiplier > 0,
        "noise_multiplier",
        noise_multiplier,
        f"> 0 with noise={noise!r}",
        "Pass noise_multiplier=σ or target_epsilon= (correlated noise cannot be turned off)",
    )
    assert noise_multiplier is not None  # the require above refused None
    if isinstance(spec, Tree):
        return TreeMechanism(
            source,
            period=spec.period(sampler),
            noise_multiplier=noise_multiplier,
            sample_rate=sampler.sample_rate,
            sampler_position=lambda: sampler.batch_in_pass,
        )
    return BandMFMechanism(
        source,
        coefficients=optimize_banded(horizon, spec.period(sampler)),
        noise_multiplier=noise_multiplier,
        sample_rate=sampler.sample_rate,
        sampler_position=lambda: sampler.step,
    )


def horizon(
    epochs: float | None,
    max_steps: int | None,
    target_epsilon: float | None,
    target_delta: float | None,
    steps_per_epoch: int,
) -> int | None:
    """T, the ε guard's horizon: ``max_steps``, or the logical batches of ``epochs`` passes."""
    if target_epsilon is not None:
        require(
            target_delta is not None and 0 < target_delta < 1,
            "target_delta",
            target_delta,
            "in (0, 1) with target_epsilon",
            "The usual choice is δ < 1/N",
        )
        require(
            epochs is not None or max_steps is not None,
            "epochs",
            epochs,
            "given with target_epsilon",
            "Say how long the run is: epochs= or max_steps=",
        )
    if max_steps is None and epochs is not None:
        require(
            isinstance(epochs, (int, float))
            and not isinstance(epochs, bool)
            and math.isfinite(epochs)
            and epochs > 0,
            "epochs",
            epochs,
            "a finite number > 0",
            "Say how many passes over the data the run makes",
        )
        max_steps = max(1, math.ceil(epochs * steps_per_epoch - 1e-9))
    return max_steps
