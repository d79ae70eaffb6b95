"""Adaptive methods, one file each (STYLE.md R1)."""

from dpfy.adaptive.base import REGISTRY, AdaptiveMethod, Released, register

__all__ = ["AdaptiveMethod", "Released", "REGISTRY", "register"]
