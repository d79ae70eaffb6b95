"""dpfy.privacy: the ledger of noisy releases, accountants, calibration and reports."""

from dpfy.privacy.accountants import delta, epsilon
from dpfy.privacy.calibration import calibrate_noise_multiplier
from dpfy.privacy.ledger import Ledger, Release, Sampling, StepGroup

__all__ = ["Ledger", "Release", "Sampling", "StepGroup", "epsilon", "delta",
           "calibrate_noise_multiplier"]
