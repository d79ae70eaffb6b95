"""dpfy.privacy: the ledger of noisy releases, accountants, calibration and reports.

Everything that says how much privacy a run spends lives here (docs/architecture.md: "every noisy
release
is a privacy event"). Other packages write to a :class:`Ledger` and read ε from
:func:`epsilon` / :func:`epsilon_curve`; nothing else computes ε.
"""

from dpfy.privacy import gdp
from dpfy.privacy.accountants import ACCOUNTANTS, delta, epsilon, epsilon_curve
from dpfy.privacy.calibration import calibrate_noise_multiplier
from dpfy.privacy.individual import calibrate_individual
from dpfy.privacy.ledger import Ledger, Release, Sampling, StepGroup
from dpfy.privacy.report import PrivacyReport, ReportSection
from dpfy.privacy.running import RunningEpsilon

__all__ = [
    "ACCOUNTANTS",
    "Ledger",
    "Release",
    "Sampling",
    "StepGroup",
    "epsilon",
    "delta",
    "epsilon_curve",
    "calibrate_noise_multiplier",
    "calibrate_individual",
    "gdp",
    "RunningEpsilon",
    "PrivacyReport",
    "ReportSection",
]
