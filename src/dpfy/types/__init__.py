"""The plain types at the bottom of dpfy: what a step plans, the run's facts, a clipping, a
release spec and a step's outcome. They import nothing above ``dpfy.privacy.ledger``.

The names load on first use (PEP 562, :func:`dpfy._lazy.lazy_attributes`), so that
``dpfy.types.sampling`` (an enum, read by the ledger) does not import torch with the others:
``dpfy train --help`` builds its parser without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dpfy._lazy import lazy_attributes

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

_LAZY = {
    "Clip": "dpfy.types.clip",
    "Norms": "dpfy.types.clip",
    "RunFacts": "dpfy.types.facts",
    "PLAN_FIELDS": "dpfy.types.plan",
    "StepPlan": "dpfy.types.plan",
    "Sampling": "dpfy.types.sampling",
    "RELEASE_KINDS": "dpfy.types.release",
    "Offsets": "dpfy.types.release",
    "ReleaseSpec": "dpfy.types.release",
    "StepOutcome": "dpfy.types.release",
}

if TYPE_CHECKING:
    from dpfy.types.clip import Clip, Norms
    from dpfy.types.facts import RunFacts
    from dpfy.types.plan import PLAN_FIELDS, StepPlan
    from dpfy.types.release import RELEASE_KINDS, Offsets, ReleaseSpec, StepOutcome
    from dpfy.types.sampling import Sampling

__getattr__, __dir__ = lazy_attributes("dpfy.types", _LAZY, globals())
