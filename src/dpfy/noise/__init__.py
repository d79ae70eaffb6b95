"""Noise: the Gaussian generator (secure or seeded) and the noise mechanisms built on it."""

from dpfy.noise.generator import NoiseSource, secure_uniform
from dpfy.noise.mechanism import GaussianMechanism, NoiseMechanism, StepRecord

__all__ = ["NoiseSource", "secure_uniform", "GaussianMechanism", "NoiseMechanism", "StepRecord"]
