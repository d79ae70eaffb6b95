"""Adaptive methods, one file each (CONTRIBUTING.md), on one interface (``base.Method``).

Build any registered method by name with :func:`make` (``make_private`` then calibrates it for
the run's facts: schedules solve their noise there), compose with :func:`chain`, list with
``dpfy methods``; :func:`describe_releases` says what a method releases, from its specs.

Adding a method is one file here (a :class:`Method` with ``@register("name")``) plus
``tests/adaptive/test_name.py``: the package imports every module, so the method registers
itself, and the registry's contract test checks it.
"""

import importlib
import pkgutil

from dpfy.adaptive.base import (
    HOOKS,
    NOISE_SPLIT,
    PLAN_FIELDS,
    REGISTRY,
    Method,
    check_plan,
    make,
    method_name,
    register,
)
from dpfy.adaptive.chain import Chain, chain
from dpfy.adaptive.clip_schedules import ClipSchedule
from dpfy.adaptive.describe import ReleaseRow, describe_releases
from dpfy.adaptive.dynamic import DynamicDPSGD, calibrate_dynamic
from dpfy.adaptive.plateau import PlateauNoiseDecay
from dpfy.adaptive.quantile import LayerQuantileClipping, QuantileClipping
from dpfy.adaptive.schedules import NoiseDecay

# Every module of this package is imported, so a new method file registers itself: adding a
# method is one file here plus its tests, with no list to edit.
for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

# Registry keys whose file has another name (CONTRIBUTING.md): a visible decision, not drift.
FILE_ALIASES = {
    "noise_decay": "schedules",
    "clip_schedule": "clip_schedules",
    "per_layer_quantile": "quantile",
}

__all__ = [
    "Method",
    "method_name",
    "REGISTRY",
    "FILE_ALIASES",
    "PLAN_FIELDS",
    "NOISE_SPLIT",
    "HOOKS",
    "register",
    "make",
    "chain",
    "Chain",
    "check_plan",
    "describe_releases",
    "ReleaseRow",
    "NoiseDecay",
    "PlateauNoiseDecay",
    "DynamicDPSGD",
    "calibrate_dynamic",
    "ClipSchedule",
    "QuantileClipping",
    "LayerQuantileClipping",
]
