"""Fay et al.'s privacy–utility-ratio (PUR) rule, data-dependent variant: noise ∝ a released
gradient-norm estimate.

References: Fay et al. 2023 (TMLR), as surveyed by Monir, Fauzan & Ghinita 2023, §3.1.3: for an
M-smooth loss the PUR-minimising choice is η = 1/(2M) and a noise std proportional to the
gradient norm ‖∇F(θ_t)‖. The norm is private: here it is estimated from a noisy release that the
ledger records beside the gradient (the data-independent variant is ``pur``, ``pur.py``).

Each step t releases, on the same Poisson batch:

- the sum of clipped per-example norms Σ_i min(‖g_i‖, Δ) + N(0, (σ_n Δ)²), Δ the
  gradient's sensitivity (C). Its mean over the expected batch size b is an upper bound on the
  norm of the mean clipped gradient (triangle inequality), as Fay et al.'s data-independent
  variant uses an upper bound G_t;
- the clipped gradient sum at σ_g.

The two share the run's σ (calibrated by ``make_private`` for the target ε, like every
``noise_split`` method): with a share f of the budget for the norm, σ_n = σ/√f and
σ_g = σ/√(1 − f), so σ_g⁻² + σ_n⁻² = σ⁻² and each step spends exactly what plain DP-SGD at σ
would. Neither σ_g nor σ_n depends on data: the ledger is known in advance and the run's ε is
the target, exactly.

The data-dependent noise. Let Ĝ_t be an exponential moving average (weight β) of the released
mean norms up to step t − 1 and Ĝ_max the largest Ĝ so far; r = Ĝ_t/Ĝ_max ∈ [0, 1] is the
estimated norm relative to its largest value. The gradient the optimizer steps on carries noise
multiplier

    σ_t = σ_g · max(1, r / r_min)

(r_min ∈ (0, 1], ``min_ratio``): σ_t ∝ the norm estimate while the norm is above r_min of its
largest value, and the budget's σ_g below. The part above σ_g is Gaussian noise added to the
*released* gradient (``postprocess``): post-processing, which costs no privacy. It is drawn from a
generator seeded by (``noise_seed``, step), so every data-parallel rank adds the same draw; this
seed needs no secrecy, since subtracting the added noise gives back only the DP release.

Why the noise can only rise above σ_g (dpfy's choice, documented): lowering σ_t below the
budget's σ when the norm estimate falls would make each step's privacy cost depend on earlier
releases (fully adaptive composition), which needs a privacy filter that dpfy does not have; a
ledger composed from such realized σ_t would not be a guarantee. Fay et al.'s claim is therefore
tested here in the form a fixed-budget accountant can prove: σ proportional to the estimated
norm, floored at the budget's σ. ``min_ratio = 1`` is plain DP-SGD at σ_g (plus the norm
release).

Releases per step: the clipped-gradient sum (σ_g) and the clipped-norm sum (σ_n).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Mapping

import torch

from dpfy._require import require
from dpfy.adaptive.base import NOISE_SPLIT, Method, bind_facts, noisy_step, register
from dpfy.adaptive.pur import check_step_size, optimizer_lr, with_pur_step
from dpfy.types import ReleaseSpec, RunFacts, StepOutcome, StepPlan

__all__ = ["DataPURSchedule", "DataPURState", "NORM_RELEASE"]

NORM_RELEASE = "clipped_norm_sum"


@dataclass(frozen=True)
class DataPURState:
    """Public: built from the released norm sums only.

    estimate: Ĝ, the moving average of the released mean clipped norms (None before any).
    largest: Ĝ_max, the largest estimate so far (None before any).
    """

    estimate: float | None = None
    largest: float | None = None


def _sensitivity(clip: float | torch.Tensor) -> float:
    """Δ of the gradient sum: C, or √(Σ_k C_k²) with one threshold per group."""
    if torch.is_tensor(clip):
        return float(clip.double().square().sum().sqrt())
    return float(clip)


@register("pur_data")
@dataclass(frozen=True)
class DataPURSchedule(Method[DataPURState]):
    """Fay et al.'s data-dependent PUR rule: σ_t ∝ a released norm estimate, η = 1/(2M).

    Args:
      smoothness: M, the declared smoothness constant (as for ``pur``).
      step_size: ``"pur"`` (lr scaled to give η = 1/(2M)) or ``"optimizer"``.
      min_ratio: r_min in (0, 1]; below r_min of its largest value the estimated norm no longer
        lowers σ_t (the budget's σ_g is the floor). 1: constant σ_g.
      norm_budget_fraction: f in (0, 1), the share of each step's budget the norm release takes.
      smoothing: β in [0, 1), the moving-average weight of the norm estimate (0: the last
        release alone).
      noise_seed: seeds the post-processing noise (not a secret: see the module docstring).
      lr: the inner optimizer's lr, read from the run by ``make_private``.
    """

    smoothness: float = 1.0
    step_size: str = "pur"
    min_ratio: float = 0.5
    norm_budget_fraction: float = 0.05
    smoothing: float = 0.9
    noise_seed: int = 0
    lr: float | None = None

    example_options = {"smoothness": 10.0}
    sets = frozenset({NOISE_SPLIT, "lr_scale"})

    def __post_init__(self) -> None:
        check_step_size(self.smoothness, self.step_size)
        require(
            0 < self.min_ratio <= 1,
            "min_ratio",
            self.min_ratio,
            "in (0, 1]",
            "0.5 lets σ_t fall to the budget's σ once the norm halves; 1 is constant σ",
        )
        require(
            0 < self.norm_budget_fraction < 1,
            "norm_budget_fraction",
            self.norm_budget_fraction,
            "in (0, 1)",
            "Give the norm release a small share of the budget, e.g. 0.05",
        )
        require(
            0 <= self.smoothing < 1,
            "smoothing",
            self.smoothing,
            "in [0, 1)",
            "0.9 averages the norm releases over about ten steps",
        )

    def calibrate(self, facts: RunFacts) -> "DataPURSchedule":
        """The inner optimizer's lr for the η = 1/(2M) scale (σ is the run's, split here)."""
        return bind_facts(replace(self, lr=optimizer_lr(facts, self.step_size)), facts)

    def init(self) -> DataPURState:
        return DataPURState()

    def plan(self, state: DataPURState, plan: StepPlan) -> StepPlan:
        fix = "Its norm release takes a share of the step's noise: give the run a target ε or σ"
        sigma = noisy_step(plan.noise_multiplier, "pur_data", fix)
        split = replace(plan, noise_multiplier=sigma / math.sqrt(1 - self.norm_budget_fraction))
        return with_pur_step(split, self.smoothness, self.lr, self.step_size)

    def _step_sigma(self, plan: StepPlan) -> float:
        """The step's whole σ from the gradient's share σ_g = σ/√(1 − f)."""
        return plan.noise_multiplier * math.sqrt(1 - self.norm_budget_fraction)

    def releases(self, state: DataPURState, plan: StepPlan) -> dict[str, ReleaseSpec]:
        delta = _sensitivity(plan.clip)  # public
        sigma_n = self._step_sigma(plan) / math.sqrt(self.norm_budget_fraction)
        return {
            NORM_RELEASE: ReleaseSpec(
                sensitivity=delta,
                noise_std=sigma_n * delta,
                values=lambda norms: torch.clamp(norms.total.double(), max=delta),  # (B,)
                label="the sum of per-example gradient norms clipped at the sensitivity, "
                "Σ_i min(‖g_i‖, Δ)",
            )
        }

    def ratio(self, state: DataPURState) -> float:
        """r = Ĝ/Ĝ_max in [0, 1] (1 before any release or while Ĝ_max ≤ 0)."""
        if state.estimate is None or state.largest is None or state.largest <= 0:
            return 1.0
        return min(1.0, max(0.0, state.estimate / state.largest))

    def pur_noise_multiplier(self, state: DataPURState, plan: StepPlan) -> float:
        """σ_t = σ_g · max(1, r / r_min): the noise the optimizer's gradient carries."""
        return plan.noise_multiplier * max(1.0, self.ratio(state) / self.min_ratio)

    def postprocess(
        self,
        state: DataPURState,
        gradient: Mapping[str, torch.Tensor],
        plan: StepPlan,
        probed: Mapping[str, float],
        expected_batch_size: float,
    ) -> Mapping[str, torch.Tensor]:
        """The released S̃/b plus N(0, (Δ·√(σ_t² − σ_g²)/b)²) per coordinate."""
        sigma_g, sigma_t = plan.noise_multiplier, self.pur_noise_multiplier(state, plan)
        if sigma_t <= sigma_g:
            return gradient
        std = _sensitivity(plan.clip) * math.sqrt(sigma_t**2 - sigma_g**2) / expected_batch_size
        gen = torch.Generator().manual_seed(self.noise_seed * 1_000_003 + plan.step)
        return {
            n: g + std * torch.randn(g.shape, generator=gen, dtype=torch.float64).to(g)
            for n, g in gradient.items()
        }

    def update(self, state: DataPURState, outcome: StepOutcome) -> DataPURState:
        mean = float(outcome.sums[NORM_RELEASE]) / outcome.expected_batch_size  # privatized
        est = (
            mean
            if state.estimate is None
            else self.smoothing * state.estimate + (1 - self.smoothing) * mean
        )
        largest = est if state.largest is None else max(state.largest, est)
        return DataPURState(estimate=est, largest=largest)
