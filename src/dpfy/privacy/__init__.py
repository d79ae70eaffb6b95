"""dpfy.privacy: the ledger of noisy releases, accountants, calibration and reports.

Everything that says how much privacy a run spends lives here (docs/architecture.md: "every noisy
release
is a privacy event"). Other packages write to a :class:`Ledger` and read ε from
:func:`epsilon` / :func:`epsilon_curve`; nothing else computes ε.

The names load on first use (PEP 562, :func:`dpfy._lazy.lazy_attributes`): importing one module
of the package (``dpfy.privacy.accountants``) does not import the others (calibration imports
torch), so ``dpfy train --help`` starts without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dpfy._lazy import lazy_attributes

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

_LAZY = {
    "ACCOUNTANTS": "dpfy.privacy.accountants",
    "delta": "dpfy.privacy.accountants",
    "epsilon": "dpfy.privacy.accountants",
    "epsilon_curve": "dpfy.privacy.accountants",
    "calibrate_noise_multiplier": "dpfy.privacy.calibration",
    "calibrate_individual": "dpfy.privacy.individual",
    "Ledger": "dpfy.privacy.ledger",
    "Release": "dpfy.privacy.ledger",
    "Sampling": "dpfy.privacy.ledger",
    "StepGroup": "dpfy.privacy.ledger",
    "PrivacyReport": "dpfy.privacy.report",
    "ReportSection": "dpfy.privacy.report",
    "RunningEpsilon": "dpfy.privacy.running",
}

if TYPE_CHECKING:
    from dpfy.privacy import gdp
    from dpfy.privacy.accountants import ACCOUNTANTS, delta, epsilon, epsilon_curve
    from dpfy.privacy.calibration import calibrate_noise_multiplier
    from dpfy.privacy.individual import calibrate_individual
    from dpfy.privacy.ledger import Ledger, Release, Sampling, StepGroup
    from dpfy.privacy.report import PrivacyReport, ReportSection
    from dpfy.privacy.running import RunningEpsilon

__getattr__, __dir__ = lazy_attributes("dpfy.privacy", _LAZY, globals())
