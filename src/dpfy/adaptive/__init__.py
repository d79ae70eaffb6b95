"""Adaptive methods, one file each (STYLE.md R1)."""

from dpfy.adaptive.base import REGISTRY, AdaptiveMethod, Released, register
from dpfy.adaptive.clip_schedules import ClipSchedule
from dpfy.adaptive.dynamic import DynamicDPSGD, calibrate_dynamic
from dpfy.adaptive.factory import make_schedule
from dpfy.adaptive.plateau import PlateauNoiseDecay
from dpfy.adaptive.schedules import NoiseDecay

__all__ = ["AdaptiveMethod", "Released", "REGISTRY", "register", "make_schedule",
           "NoiseDecay", "PlateauNoiseDecay", "DynamicDPSGD", "calibrate_dynamic",
           "ClipSchedule"]
