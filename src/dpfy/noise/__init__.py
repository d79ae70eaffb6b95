"""Noise: the Gaussian generator (secure or seeded) and the noise mechanisms built on it:
independent (DP-SGD), DP-FTRL's tree aggregation and banded matrix factorization."""

from dpfy.noise.generator import NoiseSource, secure_uniform
from dpfy.noise.mechanism import GaussianMechanism, NoiseMechanism, StepRecord
from dpfy.noise.bandmf import BandMFMechanism
from dpfy.noise.tree import TreeMechanism

__all__ = [
    "NoiseSource",
    "secure_uniform",
    "GaussianMechanism",
    "NoiseMechanism",
    "StepRecord",
    "BandMFMechanism",
    "TreeMechanism",
]
