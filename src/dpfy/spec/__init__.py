"""A run described as data: the run spec, its performance options and the one checker.

:class:`RunSpec` says what a run's privacy guarantee is made of (sampling, unit of privacy,
noise mechanism, clipping, accounting, the adaptive method, BatchNorm statistics);
:class:`PerformanceOptions` says how it is computed and never changes ε; :func:`check` refuses
what dpfy cannot account together, from each component's declarations (:data:`DECLARATIONS`);
:func:`from_keywords` maps ``make_private``'s keywords onto them (docs/spec.md);
:func:`report_context` is the privacy report's sampling note and unit of privacy, read from it.
"""

from dpfy.spec.check import DECLARATIONS, MethodDeclaration, Refusal, check, declare_method
from dpfy.spec.keywords import from_keywords
from dpfy.spec.performance import PerformanceOptions
from dpfy.spec.report import report_context
from dpfy.spec.run import (
    AccountingSpec,
    BandMF,
    BatchNormStatistics,
    ClippingSpec,
    ExampleUnit,
    Gaussian,
    IndividualBudgets,
    RunSpec,
    SamplingSpec,
    Tree,
    UserUnit,
)

__all__ = [
    "RunSpec",
    "SamplingSpec",
    "ExampleUnit",
    "UserUnit",
    "Gaussian",
    "Tree",
    "BandMF",
    "BatchNormStatistics",
    "ClippingSpec",
    "AccountingSpec",
    "IndividualBudgets",
    "PerformanceOptions",
    "check",
    "declare_method",
    "MethodDeclaration",
    "Refusal",
    "DECLARATIONS",
    "from_keywords",
    "report_context",
]
