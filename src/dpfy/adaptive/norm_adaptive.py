"""Norm-based adaptive clipping: the next threshold is α times a noisy mean of clipped norms.

Reference: van der Veen et al. 2018, "Three tools for practical differential privacy"; Monir,
Fauzan & Ghinita 2023, §3.2.1 (the paper gives no default values).

For each threshold k (one for the whole model, or one per layer with ``per_layer=True`` as in
the paper), step t clips the gradient at C_t,k and releases, beside the gradient sum, the
batch's per-example norms clipped at B_t,k = β·C_t,k, normalized by B_t,k:

    v_ik = min(‖g_ik‖, B_t,k) / B_t,k ∈ [0, 1]          (one value per threshold k)
    R̃_t  = Σ_i v_i + N(0, σ_n² I_K)                     (L2 sensitivity √K, noise std σ_n)
    C_{t+1},k = α · B_t,k · clamp(R̃_t,k / b, f_min, 1)

with b the public expected batch size. In the paper's units B·R̃_k is Σ_i clip(‖g_ik‖) plus
N(0, σ_n² B²): its per-layer Gaussian with σ_l2 = σ_n; the K of them are one release of
noise multiplier σ_n/√K. The paper sets C_{t+1} from "the previous batch's" norms; here that
batch is step t's own (already sampled) batch, so nothing is computed twice. The clamp is
post-processing and dpfy's choice (the paper has none): a noisy mean can leave [0, 1], and a
threshold must stay > 0, so one step moves C_k by a factor in [α β f_min, α β].

Budget split (the review's §3.2.1; ``dpfy.privacy.split``): the norms take a fraction r of the
step's budget, K·σ_n⁻² = r·σ⁻², and the gradient keeps σ_g = (σ⁻² − K·σ_n⁻²)^(−1/2) = σ/√(1−r),
so the pair spends exactly what the plain gradient at σ would. The noise multipliers depend on σ
alone (not on the data), so ``target_epsilon`` calibration writes the run's ledger in advance.

Per-layer thresholds clip each group (the clipping policy's groups) to its C_k with the global
noise strategy: the gradient sum's sensitivity is √(Σ_k C_k²).

Releases per step: the clipped gradient sum (σ_g) and the noisy sum of clipped norms (σ_n per
threshold).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from dpfy._require import require
from dpfy.adaptive.base import (
    NOISE_SPLIT,
    Method,
    bind_facts,
    noisy_step,
    register,
    run_clip,
    setting,
)
from dpfy.clipping import group_weights
from dpfy.privacy.split import gaussian_remainder
from dpfy.types import Clip, Norms, ReleaseSpec, RunFacts, StepOutcome, StepPlan

__all__ = ["NormAdaptiveClipping", "NormAdaptiveState"]

RELEASE = "clipped_norm_sum"


@dataclass(frozen=True)
class NormAdaptiveState:
    """The thresholds of the next step: one, or one per clipping group."""

    clip: tuple[float, ...]


@register("norm_adaptive")
@dataclass(frozen=True)
class NormAdaptiveClipping(Method[NormAdaptiveState]):
    """van der Veen et al.'s norm-based clipping (see the module docstring).

    Args:
      initial_clip: C_0 > 0 (split as C_0/√K over K layers); None: the run's max_grad_norm.
      alpha: α > 0, C_{t+1} = α · (noisy mean clipped norm). α = 1 puts C at the mean norm.
      beta: β > 0, the norms are clipped at β·C_t before they are summed (β > 1 lets C grow).
      budget_fraction: r in (0, 1), the share of each step's budget the norm sums take.
      per_layer: one threshold per clipping group, as in the paper (needs per-group norms).
      min_fraction: f_min in (0, 1], the floor of the noisy mean (normalized): each step
        keeps C_{t+1} ≥ α·β·f_min·C_t (a noisy mean can be ≤ 0; C must stay > 0).
      num_groups: K when ``per_layer``; set from the run's facts by ``make_private``.
    """

    initial_clip: float | None = None
    alpha: float = 1.0
    beta: float = 2.0
    budget_fraction: float = 0.05
    per_layer: bool = False
    min_fraction: float = 0.1
    num_groups: int | None = None

    sets = frozenset({"clip", NOISE_SPLIT})

    def __post_init__(self) -> None:
        if self.initial_clip is not None:
            require(
                self.initial_clip > 0,
                "initial_clip",
                self.initial_clip,
                "> 0",
                "Give C_0, or leave it unset to start at the run's max_grad_norm",
            )
        require(
            self.alpha > 0,
            "alpha",
            self.alpha,
            "> 0",
            "alpha = 1 sets C to the noisy mean clipped norm",
        )
        require(
            self.beta > 0,
            "beta",
            self.beta,
            "> 0",
            "beta = 2 clips the norms at twice the current threshold",
        )
        require(
            0 < self.budget_fraction < 1,
            "budget_fraction",
            self.budget_fraction,
            "in (0, 1)",
            "Give the norm sums a small share of the budget, e.g. 0.05",
        )
        require(
            0 < self.min_fraction <= 1,
            "min_fraction",
            self.min_fraction,
            "in (0, 1]",
            "0.1 lets one step shrink C by at most α·β·0.1",
        )
        require(isinstance(self.per_layer, bool), "per_layer", self.per_layer, "a bool")

    def calibrate(self, facts: RunFacts) -> "NormAdaptiveClipping":
        constraint = "given when the run has no single max_grad_norm"
        initial = run_clip(
            self.initial_clip, facts, "initial_clip", "Pass initial_clip=C_0", constraint
        )
        groups = 1
        if self.per_layer:
            require(
                facts.num_groups is not None and facts.num_groups >= 1,
                "the number of clipping groups",
                facts.num_groups,
                ">= 1 (known to make_private)",
            )
            assert facts.num_groups is not None  # the require above refused None
            groups = facts.num_groups
        return bind_facts(replace(self, initial_clip=float(initial), num_groups=groups), facts)

    def _k(self) -> int:
        both = self.num_groups if self.initial_clip is not None else None  # both or neither
        fix = "Pass the method to make_private, which calibrates it"
        return int(setting(both, "num_groups", fix))

    def init(self) -> NormAdaptiveState:
        k = self._k()
        assert self.initial_clip is not None  # _k refused None
        return NormAdaptiveState(clip=(self.initial_clip / math.sqrt(k),) * k)

    def norm_noise_multiplier(self, sigma: float) -> float:
        """σ_n of each threshold's norm sum: K·σ_n⁻² = r·σ⁻² for the step's total σ."""
        return sigma * math.sqrt(self._k() / self.budget_fraction)

    def plan(self, state: NormAdaptiveState, plan: StepPlan) -> StepPlan:
        fix = "Its norm release takes a share of the gradient's noise"
        sigma = noisy_step(plan.noise_multiplier, "norm_adaptive", fix)
        sigma_g = gaussian_remainder(sigma, self.norm_noise_multiplier(sigma), count=self._k())
        clip = torch.tensor(state.clip, dtype=torch.float64) if self.per_layer else state.clip[0]
        return replace(plan, noise_multiplier=sigma_g, clip=clip)

    def _norms(self, norms: Norms) -> torch.Tensor:
        """Per-example norms, (B, K): the total norm, or one column per group. Sensitive."""
        return norms.per_group() if self.per_layer else norms.total.unsqueeze(1)

    def _clips(self, plan: StepPlan) -> torch.Tensor:
        return torch.as_tensor(plan.clip, dtype=torch.float64).reshape(-1)  # (K,) public

    def clipping(self, state: NormAdaptiveState, norms: Norms, plan: StepPlan) -> Clip:
        clips = self._clips(plan)
        n = self._norms(norms)  # (B, K) sensitive
        w = group_weights(clips, n)  # (B, K) sensitive
        sensitivity = float(clips.square().sum().sqrt())
        if not self.per_layer:
            return Clip(w[:, 0], sensitivity=sensitivity)
        return Clip(
            {p: w[:, k] for k, g in enumerate(norms.clip_groups) for p in g},
            sensitivity=sensitivity,
        )

    def releases(self, state: NormAdaptiveState, plan: StepPlan) -> dict[str, ReleaseSpec]:
        k = self._k()
        sigma = plan.noise_multiplier * math.sqrt(1 - self.budget_fraction)  # the step's σ
        bound = self.beta * self._clips(plan)  # (K,) public

        def values(norms: Norms) -> torch.Tensor:
            n = self._norms(norms).double()  # (B, K) sensitive
            v = torch.clamp(n / bound.to(n), max=1.0)  # (B, K) in [0, 1]
            return v if self.per_layer else v[:, 0]

        # Normalized units: std σ_n on each of K sums of values in [0, 1] (multiplier σ_n/√K).
        return {
            RELEASE: ReleaseSpec(
                sensitivity=math.sqrt(k),
                noise_std=self.norm_noise_multiplier(sigma),
                values=values,
                label="the sum of per-example norms clipped at β·C_t and divided by it, "
                "Σ_i min(‖g_ik‖, β C_k)/(β C_k), one per threshold",
            )
        }

    def update(self, state: NormAdaptiveState, outcome: StepOutcome) -> NormAdaptiveState:
        b = outcome.expected_batch_size  # public
        sums = torch.as_tensor(outcome.sums[RELEASE], dtype=torch.float64).reshape(-1)
        bound = self.beta * self._clips(outcome.plan)  # (K,) public
        mean = torch.clamp(sums / b, self.min_fraction, 1.0)  # privatized
        nxt = self.alpha * bound * mean
        return NormAdaptiveState(clip=tuple(float(c) for c in nxt))
