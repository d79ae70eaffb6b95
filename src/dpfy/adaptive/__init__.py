"""Adaptive methods, one file each (STYLE.md R1), on one interface (``base.Method``).

Build by name with :func:`make` (``make_private`` then calibrates for the run's facts), compose
with :func:`chain`, list with ``dpfy methods``.
"""

import importlib
import pkgutil

from dpfy.adaptive.base import REGISTRY, AdaptiveMethod, Method, Needs, make, register
from dpfy.types import Clip, Norms, StepOutcome, ReleaseSpec, RunFacts
from dpfy.adaptive.chain import Chain, chain
from dpfy.adaptive.clip_schedules import ClipSchedule
from dpfy.adaptive.dynamic import DynamicDPSGD, calibrate_dynamic
from dpfy.adaptive.factory import make_schedule
from dpfy.adaptive.plateau import PlateauNoiseDecay
from dpfy.adaptive.quantile import LayerQuantileClipping, QuantileClipping
from dpfy.adaptive.schedules import NoiseDecay

# Every module of this package is imported, so a new method file registers itself: adding a
# method is one file here plus its tests, with no list to edit.
for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

# Registry keys whose file has another name (STYLE.md R1 / §7): a visible decision, not drift.
FILE_ALIASES = {"noise_decay": "schedules", "clip_schedule": "clip_schedules",
                "per_layer_quantile": "quantile"}

__all__ = ["Method", "AdaptiveMethod", "Needs", "Norms", "Clip", "ReleaseSpec", "StepOutcome",
           "RunFacts", "REGISTRY", "FILE_ALIASES", "register", "make", "chain", "Chain",
           "make_schedule", "NoiseDecay", "PlateauNoiseDecay", "DynamicDPSGD",
           "calibrate_dynamic", "ClipSchedule", "QuantileClipping", "LayerQuantileClipping"]
