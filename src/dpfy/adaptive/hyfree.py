"""HyFreeDP: automatic clipping and a learning rate fitted from privatized loss probes.

Reference: Bu & Liu, "Towards hyperparameter-free optimization with differential privacy",
ICLR 2025, Algorithms 1 and 2.

The method (Algorithm 1):

- **Gradient**: automatic clipping (R_g → 0⁺, Eq. 1): example i contributes
  g_i/(‖g_i‖ + γ_s), of norm < 1, so the sum's sensitivity is 1 and the clipping scale folds
  into η. The sum gets N(0, σ_g²) noise; any optimizer post-processes it into the update
  direction d (momentum, Adam's preconditioning, weight decay), and θ ← θ − η d.
- **Learning rate**: every K steps, three losses on the step's batch along d,
  L̃_0 = L̃(θ), L̃_+ = L̃(θ − η d), L̃_− = L̃(θ + η d), each privatized by Eq. 7: example losses
  clipped to [−R_l, R_l], summed, N(0, (σ_l R_l)²) added, divided by the public expected batch
  size b. The quadratic L(θ − s d) ≈ L̃_0 − b s + a s²/2 through the three points (Eq. 6,
  exact with three points: :func:`fit_quadratic`) gives b = (L̃_− − L̃_+)/(2η),
  a = (L̃_+ + L̃_− − 2L̃_0)/η², and the new η is its minimizer b/a (line 11).
- **Loss clip R_l**: auto-regressive, from the previous probe round's released losses (§4.1):
  R_l = |L̃_− + L̃_0 + L̃_+|, the rule the paper says it uses in practice ("more conservative",
  ≈ 3× the loss, little clipping bias), or R_l = |L̃_0| (Algorithm 1, line 8). R_l,0 = 1.
- **Initial values**: η₀ = 1e-4 and R_l,0 = 1 (Algorithm 1's input); the paper's optimizer is
  AdamW with (β₁, β₂, weight decay) = (0.9, 0.999, 0.01).

Privacy (Algorithm 2, with the probes' batch accounted rigorously):

- every step releases the gradient sum at σ_g = γσ (γ = 1.01), σ the noise multiplier plain
  DP-SGD needs for the run's (ε, δ, q, T);
- every K-th step (t = 0, K, 2K, ...) also releases the three loss sums at noise multiplier σ_l.
  They are taken on the gradient's Poisson batch (line 7), so the step is recorded as **one**
  subsampled Gaussian with 1/σ_eff² = 1/σ_g² + 3/σ_l² (the probes reuse the gradient's batch), not
  as the 3T/K separately
  subsampled releases of the paper's Theorem 2 (which would need a fresh batch per probe);
- σ_l is solved (``dpfy.privacy.calibration.hyfree_noise_split``) so that this ledger spends
  exactly the target ε by the run's accountant (PLD or RDP). The noise multipliers do not
  depend on R_l (noise std σ_l·R_l over sensitivity R_l), so the ledger is known before
  training. η and R_l are functions of released values only: post-processing.

Decisions the paper leaves open, and what this implementation does:

- **Direction of the probes.** Algorithm 1 probes along step t's own direction d_t. Here the
  probes are declared before step t's gradient exists (fixed offsets), so they use the update
  the optimizer applied at step t − 1, d = (θ_{t−1} − θ_t)/η_{t−1}, read from the released
  parameters (momentum, preconditioning and weight decay included; the optimizer's state is
  never advanced twice). With momentum or Adam, successive updates are close; with plain SGD
  they are independent noisy gradients. The new η applies from step t + 1 (the paper's at
  step t itself).
- **The first round** (t = 0) has no previous update: its three losses are taken at θ and only
  set R_l. The ledger is the same at every round.
- **A fit with no minimizer** (a ≤ 0 or b ≤ 0, or a non-finite loss): the paper's b/a is not
  a step size; η is kept (as GeN's reference code, Bu & Xu 2024, does).
- **How far η moves in one round**: b/a clamped to [η/``max_change``, η·``max_change``], then
  η ← ``smoothing``·η + (1 − ``smoothing``)·target. Algorithm 1 sets η = b/a outright
  (``max_change=inf, smoothing=0``); the defaults 2 and 0.9 are those of GeN's reference code,
  which the paper's η estimator comes from.
- **R_l rule**: ``"sum"`` (the paper's practice, the default) or ``"anchor"`` (Algorithm 1,
  line 8). A released loss can be ≤ 0 (noise), so R_l = max(|rule|, ``loss_clip_floor``): the
  sensitivity must be > 0.
- **K**: 5 (the paper's §4.1, the default) or 10 (Algorithm 1); any integer ≥ 1.
- **γ_s**: the paper normalizes by 1/‖g_i‖; the stability constant of automatic clipping's
  AUTO-S (Bu et al. 2023, 0.01) keeps the weight bounded at ‖g_i‖ = 0.

Cost: three forward passes without gradients every K steps (one more than the paper's two: the
training loss at θ is not visible to a method), one parameter copy kept from the step before a
probe round.

Releases per step: the gradient sum at σ_g = 1.01σ (automatic clipping, sensitivity 1); every
K-th step also three loss sums (θ, θ ∓ η·d), each clipped to R_l at noise multiplier σ_l,
composed with the gradient into one step.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, replace
from typing import ClassVar, Literal, Mapping

import torch

from dpfy._require import require
from dpfy.adaptive.base import Method, bind_facts, calibrated, inner_lr, register
from dpfy.clipping import AutomaticClipping
from dpfy.privacy.calibration import hyfree_noise_split
from dpfy.types import Clip, Norms, ReleaseSpec, RunFacts, Sampling, StepOutcome, StepPlan

__all__ = [
    "HyFreeDP",
    "HyFreeState",
    "fit_quadratic",
    "next_learning_rate",
    "PROBES",
    "DEFAULT_INITIAL_LR",
]

# The three probe releases: where each loss is taken, as the sign of the step along −d.
PROBES = {"loss_probe_at_theta": 0.0, "loss_probe_descent": 1.0, "loss_probe_ascent": -1.0}
WHERE = {0.0: "θ", 1.0: "θ − η·d", -1.0: "θ + η·d"}

DEFAULT_INITIAL_LR = 1e-4  # Algorithm 1's input η (×10 for LoRA, §3.4)
LOSS_CLIP_RULES = ("sum", "anchor")


def fit_quadratic(descent: float, at_theta: float, ascent: float, lr: float) -> tuple[float, float]:
    """(a, b) of L(θ − s d) ≈ L_0 − b s + a s²/2 through the three points s = η, 0, −η.

    ``descent`` = L(θ − η d), ``at_theta`` = L(θ), ``ascent`` = L(θ + η d). Eq. 6's least
    squares anchored at L_0 has two unknowns and two other points, so it interpolates them:
    b estimates ∇Lᵀd, a estimates dᵀHd (the closed-form fit of Eq. 6).
    """
    require(lr > 0, "lr", lr, "> 0")
    b = (ascent - descent) / (2 * lr)
    a = (descent + ascent - 2 * at_theta) / lr**2
    return a, b


def next_learning_rate(
    lr: float, a: float, b: float, *, max_change: float = 2.0, smoothing: float = 0.9
) -> float:
    """η after one probe round with fit (a, b): the line minimizer b/a (Algorithm 1, line 11),
    clamped to [η/max_change, η·max_change] and smoothed, η ← smoothing·η +
    (1 − smoothing)·target. A fit with no minimizer (a ≤ 0, b ≤ 0, or not finite) keeps η.
    ``max_change=math.inf, smoothing=0`` is the paper's η = b/a."""
    if not (math.isfinite(a) and math.isfinite(b)) or a <= 0 or b <= 0:
        return lr
    target = min(max(b / a, lr / max_change), lr * max_change)
    return smoothing * lr + (1 - smoothing) * target


@dataclass(frozen=True)
class HyFreeState:
    """η, R_l and what the next probe round needs.

    ``anchor`` holds θ_{t−1} (the parameters after the step before the one that precedes a
    round) until ``direction`` d = (θ_{t−1} − θ_t)/η_{t−1} is formed from it; ``last_fit`` is
    the latest round's (a, b); ``rounds`` counts probe rounds.
    """

    lr: float
    loss_clip: float
    anchor: dict[str, torch.Tensor] | None = None
    direction: dict[str, torch.Tensor] | None = None
    last_fit: tuple[float, float] | None = None
    rounds: int = 0


# The largest noise std of one loss probe, as a fraction of the loss clip R_l (≈ the loss
# itself under the default rule), below which the probes still see the loss change along d: a
# rule of thumb from the probe's noise σ_l·R_l/b, not tuned on any data.
PROBE_NOISE_WARNING = 0.1


def _warn_small_batch(loss_noise: float, facts: RunFacts) -> None:
    """Warn when each probe's noise (std σ_l·R_l/b on the batch's mean loss) exceeds
    :data:`PROBE_NOISE_WARNING`·R_l: the fitted learning rate is then mostly noise."""
    if facts.dataset_size is None:
        return
    b = facts.sample_rate * facts.dataset_size
    if b > 0 and loss_noise / b > PROBE_NOISE_WARNING:
        need = math.ceil(loss_noise / PROBE_NOISE_WARNING)
        warnings.warn(
            f"method 'hyfree': the expected batch b = {b:.0f} is too small for its loss probes: "
            f"each probe's noise has std σ_l·R_l/b = {loss_noise / b:.2f}·R_l (σ_l = "
            f"{loss_noise:.3g}), so the loss change along the step is lost in it and the "
            f"fitted learning rate is mostly noise. Use an expected batch of at least {need} "
            f"(dpfy train: --batch-size {need}), or a method with a fixed learning rate",
            stacklevel=3,
        )


@register("hyfree")
@dataclass(frozen=True)
class HyFreeDP(Method[HyFreeState]):
    """HyFreeDP: automatic clipping + the learning rate fitted from privatized loss probes.

    The module docstring states the algorithm, its accounting and each decision the paper
    leaves open. Needs ``make_private(target_epsilon=..., target_delta=..., loss_fn=...)`` and
    Poisson sampling: the method splits the budget between gradient and probes itself
    (Algorithm 2).

    Args:
      probe_every: K, steps between probe rounds (the paper: 5 in §4.1, 10 in Algorithm 1).
      initial_lr: η₀; None takes the wrapped optimizer's learning rate (``dpfy train``
        passes the paper's 1e-4 when no ``--lr`` is given).
      initial_loss_clip: R_l before the first round (the paper: 1).
      loss_clip_rule: ``"sum"`` (the paper's practice) or ``"anchor"`` (Algorithm 1, line 8).
      loss_clip_floor: the smallest R_l (a released loss can be ≈ 0 or negative).
      max_change: the largest factor η moves by in one round (GeN's code: 2; ``math.inf``:
        none, as Algorithm 1).
      smoothing: weight of the old η in its update (GeN's code: 0.9; 0: none, as Algorithm 1).
      gamma: σ_g = γσ, the gradient's noise inflation that frees budget for the probes (1.01).
      stability: γ_s of automatic clipping, w_i = 1/(‖g_i‖ + γ_s).
    """

    probe_every: int = 5
    initial_lr: float | None = None
    initial_loss_clip: float = 1.0
    loss_clip_rule: Literal["sum", "anchor"] = "sum"
    loss_clip_floor: float = 0.01
    max_change: float = 2.0
    smoothing: float = 0.9
    gamma: float = 1.01
    stability: float = 0.01
    # Set by calibrate() from the run's facts:
    gradient_noise: float | None = None  # σ_g
    loss_noise: float | None = None  # σ_l
    base_lr: float | None = None  # the inner optimizer's learning rate

    sets = frozenset({"noise_multiplier", "clip", "lr_scale"})
    # `dpfy train --method hyfree` without --lr / --optimizer (dpfy.train.config): Algorithm
    # 1's η₀ and the paper's optimizer family (Adam; dpfy train offers no AdamW).
    default_initial_lr: ClassVar[float] = DEFAULT_INITIAL_LR
    default_optimizer: ClassVar[str] = "adam"

    def __post_init__(self) -> None:
        require(
            isinstance(self.probe_every, int) and self.probe_every >= 1,
            "probe_every",
            self.probe_every,
            "an integer >= 1",
            "The paper uses K = 5 or 10",
        )
        require(
            self.initial_lr is None or self.initial_lr > 0,
            "initial_lr",
            self.initial_lr,
            "> 0 or None (the optimizer's learning rate)",
        )
        require(self.initial_loss_clip > 0, "initial_loss_clip", self.initial_loss_clip, "> 0")
        require(
            self.loss_clip_rule in LOSS_CLIP_RULES,
            "loss_clip_rule",
            self.loss_clip_rule,
            f"one of {list(LOSS_CLIP_RULES)}",
        )
        require(self.loss_clip_floor > 0, "loss_clip_floor", self.loss_clip_floor, "> 0")
        require(
            self.max_change > 1,
            "max_change",
            self.max_change,
            "> 1",
            "GeN's code uses 2; math.inf for none",
        )
        require(
            0 <= self.smoothing < 1,
            "smoothing",
            self.smoothing,
            "in [0, 1)",
            "GeN's code uses 0.9; 0 for none",
        )
        require(self.gamma > 1, "gamma", self.gamma, "> 1", "The paper uses 1.01")
        require(self.stability > 0, "stability", self.stability, "> 0")

    # -- calibration ---------------------------------------------------------------------------
    def calibrate(self, facts: RunFacts) -> "HyFreeDP":
        """σ_g, σ_l for the run's (ε, δ, q, T) by Algorithm 2 on the run's own ledger."""
        require(
            facts.target_epsilon is not None and facts.delta is not None,
            "target_epsilon",
            facts.target_epsilon,
            "given for method 'hyfree'",
            "HyFreeDP splits the budget between gradient and loss probes itself: pass "
            "make_private(target_epsilon=..., target_delta=..., epochs=...) and no "
            "noise_multiplier",
        )
        require(
            facts.steps is not None,
            "steps",
            None,
            "known for method 'hyfree'",
            "Pass epochs= or max_steps=",
        )
        require(
            facts.sampling == Sampling.POISSON,
            "sampling",
            facts.sampling,
            "Poisson for method 'hyfree'",
            "Its accounting composes probes with the "
            "gradient's Poisson-sampled step; use poisson_sampling=True",
        )
        assert facts.target_epsilon is not None and facts.delta is not None  # required above
        assert facts.steps is not None  # the require above refused None
        fix = "HyFreeDP scales the wrapped optimizer's learning rate"
        base_lr = inner_lr(facts, "optimizer lr", "a number > 0", fix)
        sigma_g, sigma_l = hyfree_noise_split(
            target_epsilon=facts.target_epsilon,
            delta=facts.delta,
            sample_rate=facts.sample_rate,
            steps=facts.steps,
            probe_every=self.probe_every,
            probes_per_round=len(PROBES),
            gamma=self.gamma,
            accountant=facts.accountant,
            probes_share_batch=True,
        )
        _warn_small_batch(sigma_l, facts)
        return bind_facts(
            replace(self, gradient_noise=sigma_g, loss_noise=sigma_l, base_lr=base_lr), facts
        )

    def _calibrated(self) -> None:
        calibrated(self.gradient_noise, "method 'hyfree'")

    # -- the step ------------------------------------------------------------------------------
    def init(self) -> HyFreeState:
        self._calibrated()
        lr = self.initial_lr if self.initial_lr is not None else self.base_lr
        assert lr is not None  # calibrate sets base_lr with gradient_noise
        return HyFreeState(lr=float(lr), loss_clip=self.initial_loss_clip)

    def plan(self, state: HyFreeState, plan: StepPlan) -> StepPlan:
        assert self.gradient_noise is not None and self.base_lr is not None  # init checked
        return replace(
            plan, noise_multiplier=self.gradient_noise, clip=1.0, lr_scale=state.lr / self.base_lr
        )

    def clipping(self, state: HyFreeState, norms: Norms, plan: StepPlan) -> Clip:
        auto = AutomaticClipping(clip=1.0, gamma=self.stability)
        return Clip(auto.weights(norms.per_parameter_sq, 1.0, norm=norms.total), 1.0)

    def _probe_round(self, step: int) -> bool:
        return step % self.probe_every == 0

    def releases(self, state: HyFreeState, plan: StepPlan) -> Mapping[str, ReleaseSpec]:
        if not self._probe_round(plan.step):
            return {}
        assert self.loss_noise is not None  # calibrate sets it with gradient_noise
        r_l, out = state.loss_clip, {}
        for name, sign in PROBES.items():
            offsets = (
                {}
                if state.direction is None or sign == 0.0
                else {n: -sign * state.lr * d for n, d in state.direction.items()}
            )
            out[name] = ReleaseSpec(
                sensitivity=r_l,
                noise_std=self.loss_noise * r_l,
                kind="loss",
                offsets=offsets,
                label=f"the batch's loss sum at {WHERE[sign]} (d: the previous step's update), "
                f"each loss clipped to ±R_l; every K-th step",
            )
        return out

    def update(self, state: HyFreeState, released: StepOutcome) -> HyFreeState:
        t, k = released.plan.step, self.probe_every
        if self._probe_round(t):
            state = self._after_probes(state, released)
        assert self.base_lr is not None  # calibrate sets it with gradient_noise
        applied_lr = released.plan.lr_scale * self.base_lr
        params = released.parameters
        direction, anchor = state.direction, state.anchor
        if (t + 1) % k == 0:  # the next step probes: d from this step's applied update
            direction = (
                None
                if anchor is None
                else {n: (anchor[n] - p) / applied_lr for n, p in params.items()}
            )
            anchor = None
        if (t + 2) % k == 0:  # the step after this one is the last before a round
            anchor = {n: p.detach().clone() for n, p in params.items()}
        return replace(state, direction=direction, anchor=anchor)

    def loss_clip_after(self, descent: float, at_theta: float, ascent: float) -> float:
        """R_l for the next round from this round's released mean losses (``loss_clip_rule``),
        never below ``loss_clip_floor``."""
        raw = abs(descent + at_theta + ascent) if self.loss_clip_rule == "sum" else abs(at_theta)
        return max(raw, self.loss_clip_floor) if math.isfinite(raw) else self.loss_clip_floor

    def _after_probes(self, state: HyFreeState, released: StepOutcome) -> HyFreeState:
        b_size = released.expected_batch_size
        loss = {name: float(released.sums[name]) / b_size for name in PROBES}
        descent, at_theta, ascent = (
            loss["loss_probe_descent"],
            loss["loss_probe_at_theta"],
            loss["loss_probe_ascent"],
        )
        lr, fit = state.lr, state.last_fit
        if state.direction is not None:
            fit = fit_quadratic(descent, at_theta, ascent, state.lr)
            lr = next_learning_rate(
                state.lr, *fit, max_change=self.max_change, smoothing=self.smoothing
            )
        return replace(
            state,
            lr=lr,
            loss_clip=self.loss_clip_after(descent, at_theta, ascent),
            last_fit=fit,
            direction=None,
            rounds=state.rounds + 1,
        )
