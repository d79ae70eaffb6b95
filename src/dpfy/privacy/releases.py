"""What one step releases: the one statement the step, the ε guard and calibration share.

:func:`step_releases` turns a step's plan and its declared extra releases into the ledger's
:class:`~dpfy.privacy.ledger.Release` records; :func:`group_step_releases` says the same for each
privacy group of an individualized run; :func:`planned_ledger` writes, before training, the
ledger a data-independent method's whole run will write, with the same function.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping, Protocol, Sequence

import torch

from dpfy.privacy.group_ledger import group_noise_multiplier
from dpfy.privacy.ledger import Ledger, Release
from dpfy.types import ReleaseSpec, RunFacts, StepPlan

__all__ = [
    "GRADIENT",
    "step_releases",
    "group_step_releases",
    "base_plan",
    "planned_ledger",
    "method_name",
]

GRADIENT = "gradient"


class PlannedMethod(Protocol):
    """What :func:`planned_ledger` reads of a method (``dpfy.adaptive.Method`` has it)."""

    registry_name: str

    def is_data_independent(self) -> bool: ...
    def init(self) -> Any: ...
    def plan(self, state: Any, plan: StepPlan) -> StepPlan: ...
    def releases(self, state: Any, plan: StepPlan) -> Mapping[str, ReleaseSpec]: ...


def method_name(method: object) -> str:
    """The name a refusal or a report gives ``method``: its registry name (``"+"``-joined for
    a chain), or its class name when it has none (not registered, or not a
    ``dpfy.adaptive.Method``). Here, below ``dpfy.adaptive`` (which exports it), so that the
    privacy layer's refusals name a method the same way."""
    return getattr(method, "registry_name", "") or type(method).__name__


def step_releases(plan: StepPlan, specs: Mapping[str, ReleaseSpec]) -> tuple[Release, ...]:
    """What one step releases: the gradient sum at σ_t, then each declared extra release.

    The optimizer records exactly this in the ledger, the ε guard checks it, and
    calibration writes it for every planned step: there is no second formula.
    """
    out = [Release(GRADIENT, float(plan.noise_multiplier))]
    for name, spec in specs.items():
        if name == GRADIENT:
            raise ValueError(
                f"an extra release name must not be {GRADIENT!r}, got "
                f"{GRADIENT!r}. Name the release after what it holds"
            )
        out.append(Release(name, spec.noise_multiplier))
    return tuple(out)


def group_step_releases(
    plan: StepPlan, specs: Mapping[str, ReleaseSpec], clip_fractions: Sequence[float]
) -> list[tuple[Release, ...]]:
    """What one step releases as seen by each privacy group (individualized privacy).

    Group p's examples are clipped to f_p·Δ (``clip_fractions[p]``), so the gradient sum's noise
    σ_t·Δ is σ_t / f_p relative to their sensitivity (:func:`dpfy.privacy.group_ledger
    .group_noise_multiplier`); extra releases have one sensitivity for everyone and stay as
    they are. This is :func:`step_releases` at the group's σ: the optimizer records it in each
    group's ledger and ``dpfy.privacy.calibrate_individual`` writes it for every planned step.
    """
    return [
        step_releases(
            replace(plan, noise_multiplier=group_noise_multiplier(plan.noise_multiplier, f)), specs
        )
        for f in clip_fractions
    ]


def base_plan(
    facts: RunFacts, step: int, noise_multiplier: float, clip: float | torch.Tensor
) -> StepPlan:
    """The plan before any method changes it: the sampler's q, the run's σ and C."""
    return StepPlan(
        step=step, sample_rate=facts.sample_rate, noise_multiplier=noise_multiplier, clip=clip
    )


def planned_ledger(
    method: PlannedMethod,
    facts: RunFacts,
    *,
    noise_multiplier: float = 0.0,
    clip: float | torch.Tensor = 1.0,
    steps: int | None = None,
) -> Ledger:
    """The ledger a run of ``method`` under ``facts`` will write, built before training.

    Only for data-independent methods (their plans and release specs depend on the step
    alone); others raise, naming the ε guard as the alternative (CONTRIBUTING.md, privacy rule 2).
    """
    if not method.is_data_independent():
        raise ValueError(
            f"method must be data-independent to write its ledger in advance, got method = "
            f"{method_name(method)} (it adapts to released values). "
            f"Give its noise explicitly and let the ε guard (target_epsilon= or "
            f"epsilon_cap=) stop training at the target"
        )
    steps = facts.steps if steps is None else steps
    if steps is None:
        raise ValueError(
            "steps must be known to write a run's ledger, got steps = None. "
            "Pass epochs= or max_steps= to make_private"
        )
    state = method.init()
    ledger = Ledger(dataset_size=facts.dataset_size)
    for t in range(steps):
        plan = method.plan(state, base_plan(facts, t, noise_multiplier, clip))
        ledger.record_step(
            sampling=facts.sampling,
            sample_rate=facts.sample_rate,
            max_examples_per_user=facts.max_examples_per_user,
            releases=step_releases(plan, method.releases(state, plan)),
        )
    return ledger
