"""dpfy: differentially private training for PyTorch, with accounting you can report."""

from dpfy.api import make_private
from dpfy.privacy import Ledger, Release, Sampling, calibrate_noise_multiplier, delta, epsilon
from dpfy.validate import validate

__version__ = "0.1.0"

__all__ = [
    "make_private",
    "validate",
    "Ledger",
    "Release",
    "Sampling",
    "epsilon",
    "delta",
    "calibrate_noise_multiplier",
    "__version__",
]
