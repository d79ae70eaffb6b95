"""AdaClip: coordinate-wise adaptive clipping (centre and scale every coordinate, clip to 1).

References: Pichapati et al. 2019 (AdaCliP), as surveyed by Monir, Fauzan & Ghinita 2023,
§3.2.3 (context: §3.2.1–3.2.2).

What is released (the review's §3.2.3, reconstructing from the noisy w̃_t). With public
per-coordinate
vectors a_t (shift) and b_t > 0 (scale), built only from earlier releases:

    w_i  = (g_i − a_t) / b_t                     per-sample, element-wise (the ``transform``)
    ŵ_i  = w_i / max(1, ‖w_i‖₂)                  clipped at norm 1: sensitivity Δ = 1
    S̃    = Σ_i ŵ_i + N(0, σ_t² I)                the one release of the step (noise std σ_t·1)
    w̃    = S̃ / B                                 B = the public expected batch size
    ĝ_t  = b_t ⊙ w̃ + a_t                         post-processing: the gradient estimate

Adding or removing one example moves S by ‖ŵ_i‖ ≤ 1, so the step is one Gaussian mechanism at
noise multiplier σ_t on a Poisson sample, exactly what plain DP-SGD at σ_t spends; the map back
and the estimates below read only w̃ (post-processing), so AdaClip adds no release.

The map back is ``postprocess``: the step hands it w̃ = S̃/B right after the noise, and the
inner optimizer steps on ĝ_t (Pichapati et al.'s update); ``StepOutcome.gradient``, which
``update`` reads, is then ĝ_t. The shift a_t is added **once per step**, to the mean: for
unclipped examples b_t ⊙ S/B = Σ_i g_i/B − (n/B)·a_t with n the (private) number of examples
in the batch, so ĝ_t = Σ_i g_i/B + (1 − n/B)·a_t. Poisson sampling gives E[n] = B, so ĝ_t is
unbiased for the mean gradient (exactly Σ_i g_i/B when n = B); adding n·a_t/B instead would
read the private n. Noise in ĝ_t: b_{t,j} σ_t / B in coordinate j.

The review gives no rule for a_t and b_t (it refers to Pichapati et al.; in short: running
estimates of the
coordinate-wise mean and spread from already-privatised values). This file uses the following,
derived here (hyperparameters β₁, β₂, h₁, h₂ are this file's, not the review's):

    a_{t+1} = β₁ a_t + (1 − β₁) ĝ_t                                   mean of the gradient
    v_t     = clamp(B (ĝ_t − a_t)² − b_t² σ_t² / B, h₁, h₂)           per-example variance
    s_{t+1} = β₂ s_t + (1 − β₂) v_t
    b_{t+1} = s^{1/4} · (Σ_k √s_k)^{1/2}     (over every coordinate of every parameter)

v_t: ĝ_t − a_t = b_t ⊙ w̃ = Σ_i (g_i − a_t)/B + b_t ⊙ noise/B (unclipped examples). Over a
Poisson sample at rate q its square has mean (ḡ − a_t)² + (1 − q)·E_k(g_kj − a_tj)²/B
+ b_j² σ²/B²; removing the known noise term and multiplying by B gives
(1 − q)·Var(g_kj) + (B + 1 − q)·(ḡ_j − a_tj)²: the per-example variance when a_t tracks the
mean and q is small (a lagging a_t inflates it, so b_t grows and less is clipped).
b_{t+1} minimises the noise the map back adds, σ² Σ_j b_j², subject to
E‖w_i‖² = Σ_j s_j / b_j² = 1 (Lagrange: b_j² ∝ √s_j). Start: a_0 = 0 and s_0 = C_0²/d
(d parameters), so b_0 = C_0 everywhere and the first step is flat clipping at C_0 (ĝ_0 is
then plain DP-SGD's released gradient at clip C_0).

Memory: materialized per-sample gradients only (the method implements ``transform``, so the
step takes the materialized route; the ghost route is refused):
m × P floats for the per-sample gradients plus m × P for their transform (peak ≈ 2·m·P for a
physical batch of m examples and P parameters), 2·P float64 for a_t, s_t, and at release
≈ 2·P float64 transient (b_t and ĝ_t, in ``postprocess`` and again in ``update``).

Releases per step: the clipped sum of the standardized per-sample gradients Σ_i ŵ_i (Δ = 1,
noise multiplier σ_t); a_t, s_t are post-processing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Mapping

import torch

from dpfy._require import require
from dpfy.adaptive.base import Method, bind_facts, register, run_clip, setting
from dpfy.types import Clip, Norms, RunFacts, StepOutcome, StepPlan

__all__ = ["AdaClip", "AdaClipState", "scale_from_variance"]

Tensors = Mapping[str, torch.Tensor]


@dataclass(frozen=True)
class AdaClipState:
    """The public estimates: a_t (``mean``) and s_t (``var``), {name: θ-shaped float64}.

    Both empty before the first release: a_0 = 0 and s_0 = C_0²/d (b_0 = C_0 everywhere).
    """

    mean: Mapping[str, torch.Tensor]
    var: Mapping[str, torch.Tensor]


def scale_from_variance(var: Tensors) -> dict[str, torch.Tensor]:
    """b = s^{1/4} · (Σ_k √s_k)^{1/2}: minimises Σ_j b_j² subject to Σ_j s_j/b_j² = 1."""
    if not var:
        return {}
    # Σ_k √s_k stays a tensor where the estimates live: no host read in the step
    total = torch.stack([s.sqrt().sum() for s in var.values()]).sum()
    return {n: s.pow(0.25) * total.sqrt() for n, s in var.items()}


def _device(tensors: Tensors) -> torch.device | None:
    """The device of the first of ``tensors`` (None: none given)."""
    return next((t.device for t in tensors.values()), None)


@register("adaclip")
@dataclass(frozen=True)
class AdaClip(Method[AdaClipState]):
    """AdaClip's coordinate-wise adaptive clipping (see the module docstring).

    The inner optimizer steps on ĝ_t = b_t ⊙ w̃ + a_t (``postprocess``), the paper's update.

    Args:
      initial_clip: C_0 > 0: the first step is flat clipping at C_0. None: the run's
        ``max_grad_norm``, set by ``make_private``.
      mean_decay: β₁ in [0, 1) of the mean estimate a_t.
      var_decay: β₂ in [0, 1) of the variance estimate s_t.
      min_var, max_var: h₁ < h₂, the clamp of each per-example variance estimate v_t
        (h₁ > 0 keeps b_t > 0).

    Releases per step: the clipped sum of the standardized per-sample gradients (Δ = 1, noise
    multiplier σ_t); the estimates a_t, s_t are post-processing of it.
    """

    initial_clip: float | None = None
    mean_decay: float = 0.9
    var_decay: float = 0.99
    min_var: float = 1e-8
    max_var: float = 1e2

    sets = frozenset({"clip"})

    def __post_init__(self) -> None:
        if self.initial_clip is not None:
            require(self.initial_clip > 0, "initial_clip", self.initial_clip, "> 0")
        require(0 <= self.mean_decay < 1, "mean_decay", self.mean_decay, "in [0, 1)")
        require(0 <= self.var_decay < 1, "var_decay", self.var_decay, "in [0, 1)")
        require(
            0 < self.min_var < self.max_var,
            "min_var",
            self.min_var,
            f"in (0, max_var = {self.max_var})",
            "It keeps every b_t coordinate positive",
        )

    def calibrate(self, facts: RunFacts) -> "AdaClip":
        fix = "Pass initial_clip= (the first step's flat clip)"
        c0 = run_clip(
            self.initial_clip, facts, "initial_clip", fix, "given or the run's max_grad_norm"
        )
        return bind_facts(replace(self, initial_clip=float(c0)), facts)

    def _c0(self) -> float:
        fix = "Pass the method to make_private (it uses max_grad_norm) or give initial_clip="
        return float(setting(self.initial_clip, "initial_clip", fix))

    def init(self) -> AdaClipState:
        return AdaClipState(mean={}, var={})

    def estimates(
        self,
        state: AdaClipState,
        shapes: Mapping[str, torch.Size],
        device: torch.device | None = None,
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """(a_t, s_t) as {name: θ-shaped float64}; before the first release a_0 = 0 and
        s_0 = C_0²/d, d = Σ parameters (so b_0 = C_0), made on ``device`` (the gradients'; the
        later estimates live where the released gradients do). Public."""
        if not state.var:
            s0 = self._c0() ** 2 / sum(math.prod(s) for s in shapes.values())
            f64 = torch.float64
            return (
                {n: torch.zeros(s, dtype=f64, device=device) for n, s in shapes.items()},
                {n: torch.full(s, s0, dtype=f64, device=device) for n, s in shapes.items()},
            )
        require(
            set(state.var) == set(shapes),
            "the parameters",
            sorted(shapes),
            f"those the estimates were built for, {sorted(state.var)}",
            "Resume AdaClip only on the model it was trained with",
        )
        return dict(state.mean), dict(state.var)

    def shift_scale(
        self,
        state: AdaClipState,
        shapes: Mapping[str, torch.Size],
        device: torch.device | None = None,
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """(a_t, b_t) as {name: θ-shaped float64} (public)."""
        mean, var = self.estimates(state, shapes, device)
        return mean, scale_from_variance(var)

    def transform(
        self, state: AdaClipState, per_sample: Tensors, plan: StepPlan
    ) -> dict[str, torch.Tensor]:
        """w_i = (g_i − a_t) / b_t for every per-sample gradient {name: (m, *θ)}; sensitive."""
        a, b = self.shift_scale(
            state, {n: g.shape[1:] for n, g in per_sample.items()}, _device(per_sample)
        )
        return {n: (g - a[n].to(g)) / b[n].to(g) for n, g in per_sample.items()}

    def postprocess(
        self,
        state: AdaClipState,
        gradient: Tensors,
        plan: StepPlan,
        probed: Mapping[str, float],
        expected_batch_size: float,
    ) -> dict[str, torch.Tensor]:
        """ĝ_t = b_t ⊙ w̃ + a_t from the released standardized mean w̃ = S̃/B (post-processing;
        a_t added once per step, module docstring): what the inner optimizer steps on."""
        a, b = self.shift_scale(state, {n: w.shape for n, w in gradient.items()}, _device(gradient))
        return {n: (b[n] * w.double() + a[n]).to(w.dtype) for n, w in gradient.items()}

    def plan(self, state: AdaClipState, plan: StepPlan) -> StepPlan:
        return replace(plan, clip=1.0)

    def clipping(self, state: AdaClipState, norms: Norms, plan: StepPlan) -> Clip:
        # norms are those of the transformed w_i: clip each at norm 1.
        return Clip(torch.clamp(1.0 / norms.total, max=1.0), sensitivity=1.0)  # (m,) sensitive

    def update(self, state: AdaClipState, outcome: StepOutcome) -> AdaClipState:
        """a_{t+1}, s_{t+1} from the released gradient only (module docstring)."""
        g = {n: t.double() for n, t in outcome.gradient.items()}  # ĝ_t (after postprocess)
        a, var = self.estimates(state, {n: t.shape for n, t in g.items()}, _device(g))
        b = scale_from_variance(var)  # b_t: the one ĝ_t was mapped with
        big_b = outcome.expected_batch_size  # public
        sigma = float(outcome.plan.noise_multiplier)
        b1, b2 = self.mean_decay, self.var_decay
        new_mean, new_var = {}, {}
        for n in g:
            v = big_b * (g[n] - a[n]).square() - b[n].square() * sigma**2 / big_b
            new_mean[n] = b1 * a[n] + (1 - b1) * g[n]
            new_var[n] = b2 * var[n] + (1 - b2) * v.clamp(self.min_var, self.max_var)
        return AdaClipState(mean=new_mean, var=new_var)
