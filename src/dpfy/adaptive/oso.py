"""OSO-DPSGD: the clipping threshold C (and the learning rate) learned online by hypergradient.

References: Galli, Palamidessi & Cucinotta 2024, "Online Sensitivity Optimization in
Differentially Private Learning", Algorithm 1 (derivation: Eqs. 5–21
and the Privacy Analysis section), with the printed algorithm's inconsistencies resolved.

Why: a loss ℓ(θ_t) depends on the previous threshold through θ_t = θ_{t−1} − ρ ∇ℓ(θ_{t−1}),
and the clipped mean gradient's derivative in C is the mean of q_i = 1[‖g_i‖ > C] g_i/‖g_i‖
(a clipped example contributes C·g_i/‖g_i‖; an unclipped one does not depend on C). So
∂ℓ(θ_t)/∂C = −ρ ⟨g_t, q_{t−1}⟩ (Eq. 12): raise C when the current gradient agrees with the
previous step's clipped directions, lower it otherwise.

Each step t releases, on the same Poisson sample:

- the clipped gradient sum Σ_i g_i·min(1, C_t/‖g_i‖) + N(0, (ν_g C_t)² I), sensitivity C_t
  (flat norm over all parameters, §2.8 note 6);
- the threshold gradient Σ_i q_i + N(0, ν_q² I) with q_i = g_i/‖g_i‖ if ‖g_i‖ > C_t else 0
  (strict: a norm exactly C_t is not counted); ‖q_i‖ ∈ {0, 1}, so sensitivity 1.

Stacked and whitened, the pair moves by sqrt(ν_g⁻² + ν_q⁻²) for one example: it is one Gaussian
mechanism with ν⁻² = ν_g⁻² + ν_q⁻² (Proposition 1, §2.4). The 1 % rule takes the run's ν and
sets ν_g = (1 + inflation)·ν, ν_q = ν/√(1 − (1 + inflation)⁻²) = 7.12399·ν at 1 %
(``dpfy.privacy.split.split_noise_multiplier``): the step spends what one release at ν would.

The updates read released values only (post-processing), with b the public expected batch size:
g̃_t = released gradient (already divided by b), q̃_t = noisy Σ q_i / b (Algorithm 1's form:
noise on the sum, then divided by b; §2.5 erratum), and g̃_0 = q̃_0 = 0, sign(0) = 0:

- ``rule="sign"`` (Eqs. 20–21, the paper's choice):
  C_{t+1} = C_t·exp(ρ_c·sign⟨g̃_t, q̃_{t−1}⟩),  ρ_{t+1} = ρ_t·exp(ρ_r·sign⟨g̃_t, g̃_{t−1}⟩)
  (Eq. 21 read with g̃, not q̃: §2.6 erratum); so |log(C_t/C_0)| ≤ ρ_c·t.
- ``rule="rubio"`` (Eq. 19, scale-invariant): C_{t+1} = C_t·(1 + ρ_c·cos(g̃_t, q̃_{t−1})), and
  the same form for ρ with cos(g̃_t, g̃_{t−1}) (the paper gives Eq. 19 for C only; the ρ form
  is its analogue).
- ``rule="additive"`` (Eqs. 13 and 16, the plain hypergradient steps the paper derives
  before replacing them): C_{t+1} = C_t + ρ_c·ρ·⟨g̃_t, q̃_{t−1}⟩ and
  ρ_{t+1} = ρ_t + ρ_r·ρ·⟨g̃_t, g̃_{t−1}⟩, with ρ = ρ_1 the initial (gridded) learning rate, the
  constant ρ of the paper's derivation (§2.9 lists ρ as ρ_1); in the scale s_t = ρ_t/ρ_1 this
  is s_{t+1} = s_t + ρ_r·⟨g̃_t, g̃_{t−1}⟩ (Baydin et al.'s rule with β = ρ_r·ρ_1). The dot
  products are not normalized, so ρ_c, ρ_r must suit the gradients' scale (the paper's
  2.5e-3 is for the sign rule). The paper gives no floor; dpfy keeps C_{t+1} ≥ ``min_clip``
  (the clipping needs a positive sensitivity) and ρ_{t+1} ≥ 0 (a negative learning rate would
  ascend). ρ_1 is the torch optimizer's learning rate, read from the run's facts
  (``RunFacts.inner_hyperparameters["lr"]``, set by ``make_private``).

ρ_t is the learning rate's factor: the plan's ``lr_scale`` = ρ_t/ρ_1 multiplies the torch
optimizer's learning rate ρ_1 (the gridded one). The method is defined for SGD, optionally with
momentum (the sign rule is unchanged by momentum's positive factor); with Adam the threshold
gradient loses its meaning (§2.6) and the paper offers no variant.

Memory: two model-sized buffers (g̃_{t−1} and the released sum b·q̃_{t−1}) in the method state,
besides the step's accumulator of Σ q_i. Cost per step beyond DP-SGD: the step's second
weighted sum and the second parameter-shaped noise draw (both in the step), then two dot
products and one copy of g̃_t here (the norms only for ``rule="rubio"``).

Releases per step: the clipped gradient sum (ν_g = 1.01ν, sensitivity C_t) and the threshold
gradient Σ 1[‖g_i‖ > C_t] g_i/‖g_i‖ (ν_q = 7.124ν, sensitivity 1), composed to ν.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal, Mapping

import torch

from dpfy._require import require
from dpfy.adaptive.base import NOISE_SPLIT, Method, bind_facts, inner_lr, noisy_step, register
from dpfy.privacy.split import split_noise_multiplier
from dpfy.types import Clip, Norms, ReleaseSpec, RunFacts, StepOutcome, StepPlan

__all__ = [
    "OnlineSensitivity",
    "OSOState",
    "THRESHOLD_GRADIENT",
    "hyper_factor",
    "released_dot",
    "threshold_weights",
]

THRESHOLD_GRADIENT = "threshold_gradient"
RULES = ("sign", "rubio", "additive")
Vector = Mapping[str, torch.Tensor]


@dataclass(frozen=True)
class OSOState:
    """C_t, ρ_t/ρ_1 and the previous step's released vectors (None before the first step).

    Everything here is built from released values only (private by post-processing). The
    threshold gradient is kept as released, the noisy sum b·q̃_{t−1}, with its public b: the
    rules need only the sign, the cosine, or the dot divided by b once, so q̃ itself is never
    formed (one pass over the parameters less per step; :attr:`prev_direction` forms it).
    """

    clip: float
    lr_scale: float = 1.0
    prev_gradient: dict[str, torch.Tensor] | None = None  # g̃_{t−1} (the released mean)
    prev_direction_sum: dict[str, torch.Tensor] | None = None  # b·q̃_{t−1} (the released sum)
    prev_batch_size: float = 1.0  # b of that step, public

    @property
    def prev_direction(self) -> dict[str, torch.Tensor] | None:
        """q̃_{t−1} = (Σ q_i + noise)/b (formed on demand; for diagnostics)."""
        if self.prev_direction_sum is None:
            return None
        return {n: t / self.prev_batch_size for n, t in self.prev_direction_sum.items()}


def _dot_and_norms(a: Vector, b: Vector) -> tuple[float, float, float]:
    """⟨a, b⟩, ‖a‖, ‖b‖ over all parameters (per-tensor dots in the tensors' dtype, summed
    in Python floats; no float64 copy of the parameters)."""
    dot = sq_a = sq_b = 0.0
    for n, x in a.items():
        x = x.detach().flatten()
        y = b[n].detach().flatten().to(x.dtype)
        dot += float(torch.dot(x, y))
        sq_a += float(torch.dot(x, x))
        sq_b += float(torch.dot(y, y))
    return dot, math.sqrt(sq_a), math.sqrt(sq_b)


def released_dot(current: Vector, previous: Vector | None) -> float:
    """⟨current, previous⟩ of two released vectors; 0 before the first step (no previous).

    One dot per parameter tensor (the sign and additive rules need no norms)."""
    if previous is None:
        return 0.0
    return sum(
        float(torch.dot(x.detach().flatten(), previous[n].detach().flatten().to(x.dtype)))
        for n, x in current.items()
    )


def hyper_factor(current: Vector, previous: Vector | None, rate: float, rule: str) -> float:
    """The multiplicative step of C (or ρ) from the released ⟨current, previous⟩.

    ``"sign"``: exp(rate·sign⟨·,·⟩) (Eqs. 20–21); ``"rubio"``: 1 + rate·cos(·,·) (Eq. 19).
    Both are unchanged when ``previous`` is scaled by a positive number (a sum instead of a
    mean). No previous vector, or a zero one, gives 1 (sign(0) = 0: the first step changes
    nothing).
    """
    if previous is None:
        return 1.0
    if rule == "sign":
        dot = released_dot(current, previous)
        return math.exp(rate * ((dot > 0) - (dot < 0)))
    dot, norm_c, norm_p = _dot_and_norms(current, previous)
    if norm_c == 0.0 or norm_p == 0.0:
        return 1.0
    return 1.0 + rate * dot / (norm_c * norm_p)


def threshold_weights(clip: float, norms: torch.Tensor) -> torch.Tensor:
    """w_i = 1[‖g_i‖ > C]/‖g_i‖, (B,) float64, so that w_i g_i = q_i with ‖q_i‖ ∈ {0, 1}
    (strict, Eq. 11: a norm exactly C, or 0, is never counted). Sensitive."""
    clipped = norms > clip  # (B,) sensitive
    tiny = torch.finfo(norms.dtype).tiny  # guards the division only, not the mask
    return torch.where(clipped, 1.0 / norms.clamp_min(tiny), torch.zeros_like(norms)).double()


@register("oso")
@dataclass(frozen=True)
class OnlineSensitivity(Method[OSOState]):
    """OSO-DPSGD: C and the learning rate learned online from released hypergradients.

    See the module docstring for the math and the privacy argument.

    Args:
      initial_clip: C_0 > 0 (paper: 0.1).
      clip_rate: ρ_c in (0, 1), the step of log C (paper: 2.5e-3).
      lr_rate: ρ_r in (0, 1), the step of log ρ (paper: 2.5e-3).
      adapt_lr: also adapt the learning rate (Eqs. 14–16, 21); False keeps the optimizer's.
      rule: ``"sign"`` (Eqs. 20–21, the paper's), ``"rubio"`` (Eq. 19) or ``"additive"``
        (Eqs. 13 and 16; needs the optimizer's learning rate ρ_1 from the run's facts).
      inflation: the gradient's share of the noise: ν_g = (1 + inflation)·ν (paper: 0.01).
      min_clip: the floor of C under ``rule="additive"`` (> 0; the other rules stay positive).
      initial_lr: ρ_1 for ``rule="additive"``, filled in from the run's facts by ``calibrate``
        (give it only to use the method outside ``make_private``).

    Releases per step: the clipped gradient sum (ν_g = 1.01ν, sensitivity C_t) and the
    threshold gradient Σ 1[‖g_i‖ > C_t] g_i/‖g_i‖ (ν_q = 7.124ν, sensitivity 1), composed to ν.
    """

    initial_clip: float = 0.1
    clip_rate: float = 2.5e-3
    lr_rate: float = 2.5e-3
    adapt_lr: bool = True
    rule: Literal["sign", "rubio", "additive"] = "sign"
    inflation: float = 0.01
    min_clip: float = 1e-6
    initial_lr: float | None = None

    def __post_init__(self) -> None:
        require(
            self.initial_clip > 0,
            "initial_clip",
            self.initial_clip,
            "> 0",
            "The paper starts at C_0 = 0.1",
        )
        for name in ("clip_rate", "lr_rate"):
            value = getattr(self, name)
            require(0 < value < 1, name, value, "in (0, 1)", "The paper uses 2.5e-3")
        require(isinstance(self.adapt_lr, bool), "adapt_lr", self.adapt_lr, "true or false")
        require(
            self.rule in RULES,
            "rule",
            self.rule,
            f"one of {list(RULES)}",
            "'sign' is the paper's rule (Eqs. 20-21)",
        )
        require(
            self.inflation > 0,
            "inflation",
            self.inflation,
            "> 0",
            "The paper's 1 % rule is inflation = 0.01",
        )
        require(
            self.min_clip > 0,
            "min_clip",
            self.min_clip,
            "> 0",
            "The clipping threshold must stay positive",
        )
        if self.initial_lr is not None:
            require(self.initial_lr > 0, "initial_lr", self.initial_lr, "> 0")

    def calibrate(self, facts: RunFacts) -> "OnlineSensitivity":
        """The additive rule reads ρ_1, the inner optimizer's learning rate, from the facts."""
        if self.rule != "additive" or self.initial_lr is not None:
            return bind_facts(self, facts)
        lr = inner_lr(
            facts,
            "the inner optimizer's lr",
            "a positive number for rule 'additive'",
            "Eqs. 13 and 16 step by ρ_c·ρ_1 and ρ_r·ρ_1; pass initial_lr= explicitly",
        )
        return bind_facts(replace(self, initial_lr=lr), facts)

    @property
    def sets(self) -> frozenset[str]:  # type: ignore[override]
        """C and the noise split always; the learning rate's scale only when it is adapted."""
        return frozenset({"clip", NOISE_SPLIT} | ({"lr_scale"} if self.adapt_lr else set()))

    def init(self) -> OSOState:
        return OSOState(clip=self.initial_clip)

    def _split(self, noise_multiplier: float) -> tuple[float, float]:
        """(ν_g, ν_q) for the run's ν by the 1 % rule; refuses ν = 0."""
        fix = (
            "Its threshold gradient takes a share of the gradient's noise ν; pass "
            "noise_multiplier= > 0 or target_epsilon="
        )
        nu = noisy_step(noise_multiplier, "method 'oso'", fix)
        return split_noise_multiplier(nu, inflation=self.inflation)

    def plan(self, state: OSOState, plan: StepPlan) -> StepPlan:
        nu_g, _ = self._split(plan.noise_multiplier)
        lr_scale = plan.lr_scale * state.lr_scale if self.adapt_lr else plan.lr_scale
        return replace(plan, noise_multiplier=nu_g, clip=state.clip, lr_scale=lr_scale)

    def clipping(self, state: OSOState, norms: Norms, plan: StepPlan) -> Clip:
        c = float(plan.clip)
        return Clip(torch.clamp(c / norms.total, max=1.0), sensitivity=c)  # (B,) sensitive

    def releases(self, state: OSOState, plan: StepPlan) -> dict[str, ReleaseSpec]:
        # The plan holds ν_g = (1 + inflation)·ν (set by ``plan``); recover ν and split it.
        _, nu_q = self._split(plan.noise_multiplier / (1 + self.inflation))
        clip = float(plan.clip)  # public
        return {
            THRESHOLD_GRADIENT: ReleaseSpec(
                sensitivity=1.0,
                noise_std=nu_q,
                kind="gradient",
                values=lambda norms: threshold_weights(clip, norms.total),
                label="the threshold gradient Σ_i 1[‖g_i‖ > C_t] g_i/‖g_i‖",
            )
        }

    def update(self, state: OSOState, outcome: StepOutcome) -> OSOState:
        b = outcome.expected_batch_size  # public
        # g̃_t is the optimizer's gradient buffer: copied, since zero_grad(set_to_none=False)
        # or an in-place optimizer would change it before the next step reads it.
        g = {n: t.detach().clone() for n, t in outcome.gradient.items()}
        # b·q̃_t: the release's own fresh tensors (nothing else holds them), kept as they are.
        q_sum = {n: t.detach() for n, t in outcome.sums[THRESHOLD_GRADIENT].items()}
        if self.rule == "additive":
            clip, lr = self._additive(state, g)
        else:  # both rules are invariant to the positive scale 1/b of the stored sum
            clip = state.clip * hyper_factor(g, state.prev_direction_sum, self.clip_rate, self.rule)
            lr = (
                state.lr_scale * hyper_factor(g, state.prev_gradient, self.lr_rate, self.rule)
                if self.adapt_lr
                else state.lr_scale
            )
        return OSOState(
            clip=clip,
            lr_scale=lr,
            prev_gradient=g,
            prev_direction_sum=q_sum,
            prev_batch_size=float(b),
        )

    def _additive(self, state: OSOState, g: Vector) -> tuple[float, float]:
        """(C_{t+1}, ρ_{t+1}/ρ_1) by Eqs. 13 and 16, floored at ``min_clip`` and 0."""
        require(
            self.initial_lr is not None,
            "initial_lr",
            None,
            "known for rule 'additive'",
            "Pass the method to make_private (it reads the optimizer's lr) or give initial_lr=",
        )
        assert self.initial_lr is not None  # the require above refused None
        # ⟨g̃_t, q̃_{t−1}⟩ from the stored sum b·q̃_{t−1}
        dot_q = released_dot(g, state.prev_direction_sum) / state.prev_batch_size
        clip = state.clip + self.clip_rate * self.initial_lr * dot_q  # Eq. 13
        lr = state.lr_scale
        if self.adapt_lr:  # Eq. 16 divided by ρ_1: s_{t+1} = s_t + ρ_r⟨g̃_t, g̃_{t−1}⟩
            lr = state.lr_scale + self.lr_rate * released_dot(g, state.prev_gradient)
        return max(clip, self.min_clip), max(lr, 0.0)
