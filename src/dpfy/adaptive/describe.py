"""What a method releases, read from its release specs (never from prose).

``dpfy methods`` (for an example run) and the privacy report (for the run itself) both list a
method's releases with :func:`describe_releases`: it calibrates the method for the facts,
initializes it, plans step 0 and lists the gradient sum and each :class:`ReleaseSpec` the
method declares for that step: name, kind, label, sensitivity and noise multiplier. What it
prints is therefore what the step records in the ledger.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dpfy._require import require
from dpfy.adaptive.base import Method, calibrate_for_run, check_plan, method_name
from dpfy.adaptive.chain import Chain
from dpfy.privacy.calibration import calibrate_run_noise_multiplier
from dpfy.privacy.releases import GRADIENT, base_plan
from dpfy.types import RunFacts, Sampling, StepPlan

__all__ = ["ReleaseRow", "EXAMPLE_FACTS", "describe_releases", "releases_text", "facts_text"]

# The example run ``dpfy methods`` describes every method for: Poisson sampling at q = 0.01
# of N = 60 000 (Fashion-MNIST's size, b = 600), 3 epochs of 100 steps, (3, 1e-5)-DP by RDP,
# C = 1, two clipping groups, an inner optimizer at lr 0.1 (left unnamed, so methods that need
# a particular optimizer accept it).
EXAMPLE_FACTS = RunFacts(
    sampling=Sampling.POISSON,
    sample_rate=0.01,
    steps=300,
    dataset_size=60_000,
    steps_per_epoch=100,
    normalizer=600.0,
    delta=1e-5,
    target_epsilon=3.0,
    accountant="rdp",
    max_grad_norm=1.0,
    num_groups=2,
    inner_optimizer=None,
    inner_hyperparameters={"lr": 0.1},
)


@dataclass(frozen=True)
class ReleaseRow:
    """One release of a step: the gradient sum or one :class:`~dpfy.types.ReleaseSpec`.

    ``owner`` is the registry name of the (chain member) method that declared it; "" for the
    gradient sum, which every step releases.
    """

    name: str
    kind: str
    label: str
    sensitivity: float
    noise_multiplier: float
    owner: str = ""


def _norm(clip: float | torch.Tensor) -> float:
    """The gradient sum's sensitivity for a plan's clip: C, or √(Σ_k C_k²) per group."""
    if torch.is_tensor(clip):
        return float(clip.double().square().sum().sqrt())
    return float(clip)


def _members(method: Method) -> tuple[Method, ...]:
    return method.members if isinstance(method, Chain) else (method,)


def describe_releases(
    method: Method,
    facts: RunFacts | None = None,
    *,
    noise_multiplier: float | None = None,
    clip: float | torch.Tensor | None = None,
) -> list[ReleaseRow]:
    """The releases of step 0 of a run of ``method`` with ``facts``, from its specs.

    Args:
      method: a method (or a chain); calibrated for ``facts`` here unless it already is.
      facts: the run's facts; None: those the method was calibrated for.
      noise_multiplier: the run's σ before the method plans; None: calibrated for the facts'
        target ε when the method does not set σ itself (as ``make_private`` does), else 1.
      clip: the run's C before the method plans; None: ``facts.max_grad_norm`` (or 1).

    Returns the gradient sum first, then each extra release in the order the method (or the
    chain's members, in order) declared them.
    """
    facts = facts if facts is not None else method.calibrated_for
    require(
        facts is not None,
        "facts",
        None,
        "given for an uncalibrated method",
        "Pass the run's facts (dpfy.types.RunFacts) or a method make_private calibrated",
    )
    assert facts is not None  # the require above refused None
    method = calibrate_for_run(method, facts)
    if noise_multiplier is None:
        sets_sigma = "noise_multiplier" in method.sets
        noise_multiplier = 1.0
        if (
            facts.target_epsilon is not None
            and facts.delta is not None
            and not sets_sigma
            and facts.steps is not None
        ):
            noise_multiplier = calibrate_run_noise_multiplier(facts)
    if clip is None:
        clip = facts.max_grad_norm if facts.max_grad_norm is not None else 1.0
    base: StepPlan = base_plan(facts, 0, noise_multiplier, clip)
    state = method.init()
    plan = method.plan(state, base)  # a chain checks each member's plan itself
    check_plan(method, base, plan)
    members = _members(method)
    states = [state[method_name(m)] for m in members] if isinstance(method, Chain) else [state]
    extra = [
        ReleaseRow(
            n,
            spec.kind,
            spec.label,
            spec.sensitivity,
            spec.noise_multiplier,
            owner=method_name(member),
        )
        for member, s in zip(members, states)
        for n, spec in member.releases(s, plan).items()
    ]  # as Chain.releases: final plan
    label = (
        "the clipped sum of the transformed per-example gradients"
        if method.implements("transform")
        else "the clipped gradient sum Σ_i w_i g_i"
    )
    gradient = ReleaseRow(
        GRADIENT, "gradient", label, _norm(plan.clip), float(plan.noise_multiplier)
    )
    return [gradient] + extra


def _row_text(row: ReleaseRow) -> str:
    return (
        f"`{row.name}` ({row.kind}): {row.label or 'no label'} (sensitivity "
        f"{row.sensitivity:.3g}, noise multiplier {row.noise_multiplier:.3g})"
    )


def releases_text(rows: list[ReleaseRow], owner: str | None = None) -> str:
    """The rows as one line: the gradient sum, then the extra releases (of ``owner`` only,
    when given)."""
    extra = [r for r in rows[1:] if owner is None or r.owner == owner]
    return "; ".join(_row_text(r) for r in [rows[0]] + extra)


def facts_text(facts: RunFacts) -> str:
    """The facts ``describe_releases`` planned for, in words."""
    target = (
        f"(ε = {facts.target_epsilon:g}, δ = {facts.delta:g}) by {facts.accountant}"
        if facts.target_epsilon is not None
        else "no target ε"
    )
    return (
        f"{facts.sampling.value} sampling at q = {facts.sample_rate:g}"
        + (f" of N = {facts.dataset_size:,}" if facts.dataset_size else "")
        + (f", {facts.steps} steps" if facts.steps is not None else "")
        + f", {target}, C = {facts.max_grad_norm if facts.max_grad_norm else 'per group'}"
    )
