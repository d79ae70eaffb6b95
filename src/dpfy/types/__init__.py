"""The plain types at the bottom of dpfy: what a step plans, the run's facts, a clipping, a
release spec and a step's outcome. They import nothing above ``dpfy.privacy.ledger``."""

from dpfy.types.clip import Clip, Norms
from dpfy.types.facts import RunFacts
from dpfy.types.plan import PLAN_FIELDS, StepPlan
from dpfy.types.sampling import Sampling
from dpfy.types.release import RELEASE_KINDS, Offsets, ReleaseSpec, StepOutcome

__all__ = [
    "Clip",
    "Norms",
    "RunFacts",
    "StepPlan",
    "RELEASE_KINDS",
    "Offsets",
    "ReleaseSpec",
    "StepOutcome",
    "Sampling",
    "PLAN_FIELDS",
]
