"""ADADP: the learning rate adapted by comparing one full step with two half steps.

Reference: Koskela & Honkela, "Learning rate adaptation for differentially private learning"
(AISTATS 2020); Monir, Fauzan & Ghinita 2023, §3.3.

Why: gradient descent is the explicit Euler method on the gradient flow; the gap between one
step of size η and two steps of size η/2 estimates the local error of a step, so η can grow
while steps stay accurate and shrink when they stop being so — with no learning-rate grid.

One ADADP iteration is two DP-SGD steps of the run, on two independent Poisson batches:

- step A (even t): G_1, released at θ_l; the optimizer moves to θ_{l+½} = θ_l − (η/2) G_1;
- step B (odd t): G_2, released at θ_{l+½}. With θ_full = θ_l − η G_1 and
  θ̂ = θ_{l+½} − (η/2) G_2, the error is the l2 norm of the element-wise relative error,
  e = ‖(θ_full − θ̂)/max(1, |θ_full|)‖ = ‖(η/2)(G_2 − G_1)/max(1, |θ_full|)‖.
  If e ≤ τ the optimizer moves to θ̂ (the two-half-step iterate, the more accurate one);
  otherwise the iteration is discarded and it moves back to θ_l. Either way
  η ← clamp(τ/e, α_min, α_max)·η.

Privacy: both gradients are ordinary releases of the run (same q, σ, C), so an iteration is
two DP-SGD steps in the ledger and the run is calibrated like plain DP-SGD for its steps; every
decision above reads released gradients and public parameters only (post-processing). Nothing
else is released. A run with an odd number of steps ends on a step A (at θ_{l+½}).

Needs plain SGD as the wrapped optimizer (no momentum, no weight decay): the method moves θ by
choosing what the optimizer steps on (``postprocess``) and the step size (``lr_scale``), which
is exact only for SGD. Defaults τ = 1.0, α_min = 0.9, α_max = 1.1 as in the authors' and d3p's
public code (the paper leaves τ to the user: it should keep the accumulated noise O(1)).

Releases per step: the clipped gradient sum only (the run's σ and C); an iteration is two steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import ClassVar, Mapping

import torch

from dpfy._require import require
from dpfy.adaptive.base import Method, bind_facts, calibrated, register
from dpfy.types import RunFacts, StepOutcome, StepPlan

__all__ = ["ADADP", "ADADPState", "relative_error"]

Vector = Mapping[str, torch.Tensor]


def relative_error(full: Vector, half_step_gap: Vector) -> float:
    """‖gap/max(1, |full|)‖₂ over all parameters: the element-wise relative error of θ̂
    against θ_full, given θ_full and the gap θ_full − θ̂."""
    total = 0.0
    for n, x in full.items():
        total += float((half_step_gap[n] / x.abs().clamp(min=1.0)).double().square().sum())
    return math.sqrt(total)


@dataclass(frozen=True)
class ADADPState:
    """η_l, and from step A: G_1 and θ_{l+½} (copies; public). ``last_error`` for logs."""

    lr: float
    first_gradient: dict[str, torch.Tensor] | None = None
    half_point: dict[str, torch.Tensor] | None = None
    last_error: float | None = None
    accepted: int = 0
    rejected: int = 0


@register("adadp")
@dataclass(frozen=True)
class ADADP(Method[ADADPState]):
    """ADADP: learning-rate adaptation from one full step vs two half steps.

    See the module docstring for the algorithm and the privacy argument.

    Args:
      tolerance: τ > 0, the accepted local error.
      min_factor: α_min in (0, 1), the largest shrink of η per iteration.
      max_factor: α_max > 1, the largest growth of η per iteration.
      initial_lr: η_0; None takes the wrapped optimizer's learning rate.

    Releases per step: the clipped gradient sum only (the run's σ and C); an iteration is two
    steps.
    """

    # `dpfy train` defaults (see dpfy.train.config.method_default): the plain SGD it needs
    default_optimizer: ClassVar[str] = "sgd"
    default_momentum: ClassVar[float] = 0.0

    tolerance: float = 1.0
    min_factor: float = 0.9
    max_factor: float = 1.1
    initial_lr: float | None = None
    base_lr: float | None = None  # set by calibrate(): the optimizer's learning rate

    sets = frozenset({"lr_scale"})

    def __post_init__(self) -> None:
        require(
            self.tolerance > 0, "tolerance", self.tolerance, "> 0", "The authors' code uses τ = 1.0"
        )
        require(0 < self.min_factor < 1, "min_factor", self.min_factor, "in (0, 1)")
        require(self.max_factor > 1, "max_factor", self.max_factor, "> 1")
        require(
            self.initial_lr is None or self.initial_lr > 0,
            "initial_lr",
            self.initial_lr,
            "> 0 or None (the optimizer's learning rate)",
        )

    def calibrate(self, facts: RunFacts) -> "ADADP":
        """The inner optimizer's learning rate η; the optimizer must be plain SGD (checked
        when the facts name it, as ``make_private``'s always do)."""
        hyper = facts.inner_hyperparameters or {}
        if facts.inner_optimizer is not None:
            plain_sgd = (
                facts.inner_optimizer == "SGD"
                and not hyper.get("momentum")
                and not hyper.get("weight_decay")
                and not hyper.get("nesterov")
            )
            require(
                plain_sgd,
                "optimizer",
                f"{facts.inner_optimizer}({dict(hyper)})",
                "torch.optim.SGD without momentum or weight decay for method 'adadp'",
                "ADADP sets the iterate through the step it hands to SGD; wrap "
                "torch.optim.SGD(params, lr=η0) (dpfy train: drop --momentum and "
                "--weight-decay, or give 0)",
            )
        lr = hyper.get("lr")
        require(isinstance(lr, (int, float)) and lr > 0, "optimizer lr", lr, "a number > 0")
        assert isinstance(lr, (int, float))  # the require above refused others
        return bind_facts(replace(self, base_lr=float(lr)), facts)

    def init(self) -> ADADPState:
        base_lr = calibrated(self.base_lr, "method 'adadp'", "Pass it to make_private(method=...)")
        return ADADPState(lr=self.initial_lr if self.initial_lr is not None else base_lr)

    def plan(self, state: ADADPState, plan: StepPlan) -> StepPlan:
        assert self.base_lr is not None  # init refused an uncalibrated method
        return replace(plan, lr_scale=state.lr / 2 / self.base_lr)  # both half steps: η/2

    def _gap(self, state: ADADPState, second: Vector) -> tuple[dict, dict]:
        """θ_full and θ_full − θ̂ = (η/2)(G_2 − G_1) from step A's record and G_2."""
        half, g1, h = state.half_point, state.first_gradient, state.lr / 2
        assert half is not None and g1 is not None  # step A recorded both
        full = {n: half[n] - h * g1[n] for n in half}
        return full, {n: h * (second[n].to(g1[n]) - g1[n]) for n in g1}

    def postprocess(
        self,
        state: ADADPState,
        gradient: Vector,
        plan: StepPlan,
        probed: Mapping[str, float],
        expected_batch_size: float,
    ) -> Vector:
        """Step B steps on G_2 (to θ̂) if e ≤ τ, else on −G_1 (back to θ_l)."""
        if plan.step % 2 == 0 or state.first_gradient is None:
            return gradient
        e = relative_error(*self._gap(state, gradient))
        if e <= self.tolerance:
            return gradient
        return {n: -g for n, g in state.first_gradient.items()}

    def update(self, state: ADADPState, outcome: StepOutcome) -> ADADPState:
        if outcome.plan.step % 2 == 0:  # step A: keep G_1 and θ_{l+½}
            return replace(
                state,
                first_gradient={n: g.detach().clone() for n, g in outcome.noisy_gradient.items()},
                half_point={n: p.detach().clone() for n, p in outcome.parameters.items()},
            )
        e = relative_error(*self._gap(state, outcome.noisy_gradient))
        factor = (
            self.max_factor
            if e == 0
            else min(max(self.tolerance / e, self.min_factor), self.max_factor)
        )
        ok = e <= self.tolerance
        return ADADPState(
            lr=state.lr * factor,
            last_error=e,
            accepted=state.accepted + ok,
            rejected=state.rejected + (not ok),
        )
