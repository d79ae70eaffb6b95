"""DP-AdamWOSM: DP Adam "WithOut Second Moment" (Mohapatra et al. 2022), a baseline of OSO-DPSGD.

Reference: Galli, Palamidessi & Cucinotta 2024's AdamWOSM baseline (the update rule is from
Mohapatra et al.'s public ``DPAdamWOSM``, ``cutoff=0``). The released
gradient g̃_t = (Σ_i clip_C(g_i) + N(0, σ²C²I))/b is DP-SGD's, unchanged; Adam's second moment
is replaced by its DP limit √v → σC/b, so the update is post-processing of g̃:

    m_t = β₁ m_{t−1} + (1 − β₁) g̃_t,   m̂_t = m_t / (1 − β₁ᵗ)
    θ_{t+1} = θ_t − α / (σC/b + ε) · m̂_t            (α = ρ₀ = 1e-3, β₁ = 0.9, ε = 1e-8)

How it runs on dpfy's interface (a method can set the step's lr scale, not the update
direction): the inner optimizer must be ``torch.optim.SGD(lr=α, momentum=β₁, dampening=0,
nesterov=False, weight_decay=0)``. Its buffer is u_t = β₁ u_{t−1} + g̃_t = m_t/(1 − β₁) exactly
(u_1 = g̃_1), so the lr scale

    s_t = (1 − β₁) / ((1 − β₁ᵗ) · (σ_t C_t/b + ε))     (t = 1, 2, ...)

makes SGD's step α·s_t·u_t the AdamWOSM step above, bit for bit up to rounding. The first
moment lives in the inner optimizer's momentum buffer (checkpointed with it); this method
keeps no state. ``calibrate`` checks the requirement above against the inner optimizer the
run's facts name (``make_private`` always names it): ``dpfy train --method adamwosm --lr
0.001`` meets it with the default ``--optimizer sgd --momentum 0.9 --weight-decay 0``. σ_t
and C_t are read from the incoming plan: chain this method after any method that sets them.
002 grid-searches C only (ρ₀ fixed).

Releases per step: the clipped gradient sum (σ), nothing else (the update is post-processing).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from dpfy._require import require
from dpfy.adaptive.base import Method, bind_facts, noisy_step, register, setting
from dpfy.types import RunFacts
from dpfy.types.plan import StepPlan

__all__ = ["AdamWOSM"]


@register("adamwosm")
@dataclass(frozen=True)
class AdamWOSM(Method[None]):
    """DP-AdamWOSM's step size on an SGD-with-momentum inner optimizer (module docstring).

    Args:
      beta1: β₁ in (0, 1), Adam's first-moment decay; must equal the inner SGD's momentum
        (paper and ``dpfy train`` default: 0.9).
      eps: ε ≥ 0 added to the second-moment limit σC/b (paper: 1e-8).
      normalizer: b, the public expected batch size; set from the run's facts by
        ``make_private``.
    """

    beta1: float = 0.9
    eps: float = 1e-8
    normalizer: float | None = None

    sets = frozenset({"lr_scale"})

    def __post_init__(self) -> None:
        require(
            0 < self.beta1 < 1,
            "beta1",
            self.beta1,
            "in (0, 1)",
            "Use the inner SGD's momentum (Mohapatra et al.: 0.9)",
        )
        require(self.eps >= 0, "eps", self.eps, ">= 0", "Mohapatra et al. use 1e-8")
        if self.normalizer is not None:
            require(self.normalizer > 0, "normalizer", self.normalizer, "> 0")

    def calibrate(self, facts: RunFacts) -> "AdamWOSM":
        require(
            facts.normalizer is not None,
            "the expected batch size",
            None,
            "known",
            "Pass normalizer= (b) explicitly",
        )
        if facts.inner_optimizer is not None:  # the algorithm is exact only on this optimizer
            hp = dict(facts.inner_hyperparameters or {})
            want = {"momentum": self.beta1, "dampening": 0, "nesterov": False, "weight_decay": 0}
            got = {k: hp.get(k) for k in want}
            require(
                facts.inner_optimizer == "SGD" and got == want,
                "the inner optimizer",
                f"{facts.inner_optimizer}({got})",
                f"SGD({want}) for method 'adamwosm'",
                "Its first moment lives in SGD's momentum buffer: build "
                "torch.optim.SGD(params, lr=ρ₀, momentum=beta1) (dpfy train: --optimizer "
                "sgd --momentum 0.9 --weight-decay 0)",
            )
        assert facts.normalizer is not None  # the require above refused None
        return bind_facts(replace(self, normalizer=float(facts.normalizer)), facts)

    def second_moment_limit(self, plan: StepPlan) -> float:
        """σ_t·C_t/b: the DP limit of √v (C_t: the gradient sum's L2 sensitivity)."""
        fix = "Pass the method to make_private, which sets it from the batch size"
        normalizer = setting(self.normalizer, "normalizer", fix)
        clip = plan.clip
        c = float(clip) if isinstance(clip, (int, float)) else float(clip.square().sum().sqrt())
        return plan.noise_multiplier * c / normalizer

    def plan(self, state: None, plan: StepPlan) -> StepPlan:
        fix = (
            "Its step size α/(σC/b) is the DP limit of Adam's second moment; without noise use "
            "torch.optim.Adam"
        )
        noisy_step(plan.noise_multiplier, "adamwosm", fix)
        t = plan.step + 1  # Adam's 1-based t
        bias = 1.0 - self.beta1**t
        scale = (1.0 - self.beta1) / (bias * (self.second_moment_limit(plan) + self.eps))
        require(math.isfinite(scale), "lr_scale", scale, "finite")
        return replace(plan, lr_scale=scale)
