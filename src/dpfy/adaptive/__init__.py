"""Adaptive methods, one file each (STYLE.md R1)."""

from dpfy.adaptive.base import REGISTRY, AdaptiveMethod, Released, register
from dpfy.adaptive.clip_schedules import ClipSchedule
from dpfy.adaptive.dynamic import DynamicDPSGD, calibrate_dynamic
from dpfy.adaptive.factory import make_schedule
from dpfy.adaptive.plateau import PlateauNoiseDecay
from dpfy.adaptive.schedules import NoiseDecay

# Registry keys whose file has another name (STYLE.md R1 / §7): a visible decision, not drift.
FILE_ALIASES = {"noise_decay": "schedules", "clip_schedule": "clip_schedules"}

__all__ = ["AdaptiveMethod", "Released", "REGISTRY", "FILE_ALIASES", "register", "make_schedule",
           "NoiseDecay", "PlateauNoiseDecay", "DynamicDPSGD", "calibrate_dynamic",
           "ClipSchedule"]
