"""Quantile adaptive clipping: track the γ-quantile of per-example gradient norms privately.

References: Andrew et al. 2021 (``quantile``) and He et al. (``per_layer_quantile``), as
surveyed by Monir, Fauzan & Ghinita 2023, §3.2.2; Galli et al. 2024's FixedQuantile baseline.

``quantile`` (Andrew et al.): one threshold C_t. Each step releases, beside the clipped
gradient sum, the centred count of unclipped examples Σ_i (1[‖g_i‖ ≤ C_t] − ½) with noise
N(0, σ_b²) (sensitivity ½, so noise multiplier 2σ_b), and moves C geometrically:

    b̃ = (count̃ + b/2) / b                  (b = the public expected batch size)
    C_{t+1} = C_t · exp(−η (b̃ − γ))

The pair spends what the plain gradient at σ would: the gradient's σ becomes
σ_Δ = (σ⁻² − (2σ_b)⁻²)^(−1/2) (needs σ < 2σ_b), and the ledger records both releases of the step.

``per_layer_quantile`` (He et al.): one threshold C_k per layer (the clipping groups), each
tracked by its own unclipped count; the K counts are released as one vector of K centred
indicators (L2 sensitivity √K/2, noise std σ_b per count). The counts take a fraction r of the
budget: K(2σ_b)⁻² = r σ⁻², so σ_b = √K σ / (2√r) and σ_Δ = σ/√(1−r). The gradient is clipped
per group, w_ik = min(1, C_k/‖g_ik‖), with the global noise strategy (the same noise on every
group; sensitivity √(Σ_k C_k²)).

Releases per step: the clipped gradient sum (σ_Δ) and the unclipped count(s) (σ_b).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from dpfy._require import require
from dpfy.adaptive.base import NOISE_SPLIT, Method, bind_facts, register, setting
from dpfy.clipping import group_weights
from dpfy.privacy.split import quantile_noise_split
from dpfy.types import Clip, Norms, ReleaseSpec, RunFacts, StepOutcome, StepPlan

__all__ = ["QuantileClipping", "LayerQuantileClipping", "QuantileState"]


@dataclass(frozen=True)
class QuantileState:
    """The current threshold(s): one float, or one per group."""

    clip: tuple[float, ...]


def _centred_unclipped(clip: float | torch.Tensor, norms: torch.Tensor) -> torch.Tensor:
    """1[‖g_ik‖ ≤ C_k] − ½ for each example (and group): (B,) or (B, K), each entry ±½.
    Sensitive."""
    return (norms <= torch.as_tensor(clip, dtype=norms.dtype, device=norms.device)).double() - 0.5


def _geometric(clip: float, frac_unclipped: float, target: float, step_size: float) -> float:
    """C · exp(−η (b̃ − γ)) (Andrew et al. 2021, geometric update)."""
    return clip * math.exp(-step_size * (frac_unclipped - target))


@dataclass(frozen=True)
class _QuantileTracking(Method[QuantileState]):
    """The settings both quantile-tracking clippings share: C_0, γ and η_C, and their checks."""

    initial_clip: float = 0.1
    target_quantile: float = 0.5
    step_size: float = 0.2

    sets = frozenset({"clip", NOISE_SPLIT})

    def __post_init__(self) -> None:
        c0, gamma, eta = self.initial_clip, self.target_quantile, self.step_size
        require(c0 > 0, "initial_clip", c0, "> 0", "Andrew et al. start at 0.1")
        fix = "γ = 0.5 tracks the median norm"
        require(0 < gamma < 1, "target_quantile", gamma, "in (0, 1)", fix)
        require(eta > 0, "step_size", eta, "> 0", "η_C = 0.2 is the paper's default")


@register("quantile")
@dataclass(frozen=True)
class QuantileClipping(_QuantileTracking):
    """Andrew et al.'s quantile-tracking clip norm (see the module docstring).

    Args:
      initial_clip: C_0 > 0 (paper: 0.1).
      target_quantile: γ in (0, 1) (paper: 0.5).
      step_size: η_C > 0 of the geometric update (paper: 0.2).
      count_noise_std: σ_b in examples; None: the paper's expected batch size / 20, set from
        the run's facts by ``make_private``.
    """

    count_noise_std: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.count_noise_std is not None:
            require(
                self.count_noise_std > 0,
                "count_noise_std",
                self.count_noise_std,
                "> 0",
                "Andrew et al. use the expected batch size / 20",
            )

    def calibrate(self, facts: RunFacts) -> "QuantileClipping":
        std = self.count_noise_std
        if std is None:
            require(
                facts.normalizer is not None,
                "the expected batch size",
                None,
                "known",
                "Pass count_noise_std= explicitly",
            )
            assert facts.normalizer is not None  # the require above refused None
            std = facts.normalizer / 20
        return bind_facts(replace(self, count_noise_std=std), facts)

    def _std(self) -> float:
        fix = "Pass the method to make_private (it sets σ_b from the batch size) or give it"
        return float(setting(self.count_noise_std, "count_noise_std", fix))

    def init(self) -> QuantileState:
        return QuantileState(clip=(self.initial_clip,))

    def plan(self, state: QuantileState, plan: StepPlan) -> StepPlan:
        sigma = plan.noise_multiplier
        if sigma > 0:
            sigma = quantile_noise_split(sigma, self._std())
        return replace(plan, clip=state.clip[0], noise_multiplier=sigma)

    def clipping(self, state: QuantileState, norms: Norms, plan: StepPlan) -> Clip:
        c = float(plan.clip)
        return Clip(torch.clamp(c / norms.total, max=1.0), sensitivity=c)  # (B,) sensitive

    def releases(self, state: QuantileState, plan: StepPlan) -> dict[str, ReleaseSpec]:
        clip = float(plan.clip)  # public
        return {
            "unclipped_count": ReleaseSpec(
                sensitivity=0.5,
                noise_std=self._std(),
                values=lambda norms: _centred_unclipped(clip, norms.total),  # (B,) ±½
                label="the centred count of unclipped examples Σ_i (1[‖g_i‖ ≤ C_t] − ½)",
            )
        }

    def update(self, state: QuantileState, outcome: StepOutcome) -> QuantileState:
        b = outcome.expected_batch_size  # public
        frac = (outcome.sums["unclipped_count"] + b / 2) / b  # privatized
        return QuantileState(
            clip=(_geometric(state.clip[0], frac, self.target_quantile, self.step_size),)
        )


@register("per_layer_quantile")
@dataclass(frozen=True)
class LayerQuantileClipping(_QuantileTracking):
    """He et al.'s per-layer quantile clipping (see the module docstring).

    Args:
      initial_clip: the total C_0 > 0, split equally: C_k = C_0/√K.
      target_quantile: γ in (0, 1).
      step_size: η_C > 0 of each threshold's geometric update.
      budget_fraction: r in (0, 1), the share of the budget the K counts take (paper: 1–10 %).
    """

    budget_fraction: float = 0.05
    num_groups: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            0 < self.budget_fraction < 1,
            "budget_fraction",
            self.budget_fraction,
            "in (0, 1)",
            "He et al. give 1 % to 10 % of the budget to the counts",
        )

    def calibrate(self, facts: RunFacts) -> "LayerQuantileClipping":
        require(
            facts.num_groups is not None and facts.num_groups >= 1,
            "the number of clipping groups",
            facts.num_groups,
            ">= 1 (known to make_private)",
        )
        return bind_facts(replace(self, num_groups=facts.num_groups), facts)

    def init(self) -> QuantileState:
        fix = "Pass the method to make_private, which counts the model's layers"
        k = setting(self.num_groups, "num_groups", fix)
        return QuantileState(clip=(self.initial_clip / math.sqrt(k),) * k)

    def _count_std(self, sigma: float, k: int) -> float:
        """σ_b with K(2σ_b)⁻² = r σ⁻²."""
        return math.sqrt(k) * sigma / (2 * math.sqrt(self.budget_fraction))

    def plan(self, state: QuantileState, plan: StepPlan) -> StepPlan:
        sigma = plan.noise_multiplier / math.sqrt(1 - self.budget_fraction)  # σ_Δ
        return replace(
            plan, noise_multiplier=sigma, clip=torch.tensor(state.clip, dtype=torch.float64)
        )

    def clipping(self, state, norms: Norms, plan: StepPlan) -> Clip:
        clip = plan.clip  # (K,) public
        assert isinstance(clip, torch.Tensor)  # plan() sets one clip per group
        per_group = norms.per_group()  # (B, K) sensitive
        w = group_weights(clip, per_group)  # (B, K) sensitive
        weights = {n: w[:, k] for k, g in enumerate(norms.clip_groups) for n in g}
        return Clip(weights, sensitivity=float(clip.square().sum().sqrt()))

    def releases(self, state, plan: StepPlan) -> dict[str, ReleaseSpec]:
        assert isinstance(plan.clip, torch.Tensor)  # plan() sets one clip per group
        k = plan.clip.numel()
        sigma_total = plan.noise_multiplier * math.sqrt(1 - self.budget_fraction)
        if sigma_total <= 0:
            raise ValueError(
                "noise_multiplier must be > 0 for per_layer_quantile, got 0. "
                "Its counts take a share of the gradient's noise"
            )
        clip = plan.clip  # (K,) public
        return {
            "unclipped_counts": ReleaseSpec(
                sensitivity=math.sqrt(k) / 2,
                noise_std=self._count_std(sigma_total, k),
                values=lambda norms: _centred_unclipped(clip, norms.per_group()),  # (B, K) ±½
                label="the K per-layer centred counts of unclipped examples "
                "Σ_i (1[‖g_ik‖ ≤ C_k] − ½)",
            )
        }

    def update(self, state, outcome: StepOutcome) -> QuantileState:
        b = outcome.expected_batch_size
        counts = torch.as_tensor(outcome.sums["unclipped_counts"], dtype=torch.float64)
        frac = (counts + b / 2) / b  # (K,) privatized
        assert isinstance(outcome.plan.clip, torch.Tensor)  # plan() sets one clip per group
        clips = outcome.plan.clip.tolist()
        return QuantileState(
            clip=tuple(
                _geometric(c, float(f), self.target_quantile, self.step_size)
                for c, f in zip(clips, frac)
            )
        )
