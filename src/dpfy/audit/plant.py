"""Planting a noise bug behind the ledger's back, to measure what an audit catches.

:func:`plant_noise_scale` makes an audited run's private optimizer add noise with its std
multiplied by ``scale`` while the ledger keeps recording the configured σ: the run's claimed ε
is then false by construction (its true ε is that of σ·scale, infinite at scale 0). It is the
audit's power test (``dpfy audit --plant-noise-scale F``): an audit that does not flag such a
run cannot see that bug.

It is reachable only from the audit's own run path (:func:`dpfy.audit.run.audit_config`), never
from ``make_private`` or ``dpfy train``, and a run with a planted scale is never published:
``dpfy audit`` writes no privacy report, ledger or model for it, and says so.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from dpfy._require import require
from dpfy.noise.mechanism import GaussianMechanism

__all__ = ["plant_noise_scale", "ScaledNoise"]


class ScaledNoise:
    """A noise source whose every draw has its std multiplied by ``scale`` (a planted bug);
    everything else (state, mode) is the wrapped source's."""

    def __init__(self, source: Any, scale: float) -> None:
        self._source, self.scale = source, float(scale)

    def noisy_mean(
        self, total: torch.Tensor, std: float, normalizer: float, **kwargs: Any
    ) -> torch.Tensor:
        return self._source.noisy_mean(total, std * self.scale, normalizer, **kwargs)

    def add_gaussian_(self, t: torch.Tensor, std: float, **kwargs: Any) -> torch.Tensor:
        return self._source.add_gaussian_(t, std * self.scale, **kwargs)

    def gaussian(self, like: torch.Tensor, std: float) -> torch.Tensor:
        return self._source.gaussian(like, std * self.scale)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._source, name)


def plant_noise_scale(optimizer: Any, scale: float) -> None:
    """Multiply the std of every noise draw of ``optimizer``'s run by ``scale``, without telling
    the ledger (module docstring). For audits of runs that are never published."""
    require(
        isinstance(scale, (int, float)) and math.isfinite(scale) and scale >= 0,
        "plant_noise_scale",
        scale,
        "a finite number >= 0",
    )
    mechanism = optimizer.mechanism
    require(
        isinstance(mechanism, GaussianMechanism),
        "the run's noise mechanism",
        type(mechanism).__name__,
        "GaussianMechanism (independent noise every step)",
    )
    require(
        not isinstance(mechanism.source, ScaledNoise),
        "the run's noise",
        "already planted",
        "planted once",
    )
    mechanism.source = ScaledNoise(mechanism.source, scale)
