"""HyFreeDP: the learning rate found by privatized loss probes, no clipping threshold to tune.

Reference: Bu & Liu, "Towards hyperparameter-free optimization with differential privacy"
(Algorithms 1 and 2; digest ``shared/reference/004-hyperparameter-free-dp.md`` §2–§4).

Why: a learning rate tuned on private data leaks privacy unless the search is accounted, and
an untuned one wastes the run. HyFreeDP removes both tuned quantities of DP-SGD:

- the gradient threshold, by **automatic clipping** (R_g → 0⁺): example i contributes
  g_i/(‖g_i‖ + γ_s), norm < 1, so the sensitivity is 1 and the scale folds into η;
- the learning rate η, by **GeN's quadratic fit** along the update direction d, from three
  privatized mean losses on the step's own batch, every K steps:
  L̃_0 = L̃(θ), L̃_+ = L̃(θ − η d) (the step the optimizer would take), L̃_− = L̃(θ + η d);
  L(θ − s d) ≈ L̃_0 − b s + a s²/2 gives b = (L̃_− − L̃_+)/(2η), a = (L̃_+ + L̃_− − 2L̃_0)/η² and
  the minimizing step η* = b/a (§2.5).

Each loss is privatized by Eq. 7: example losses clipped to [−R_l, R_l] (``min(L_i, R_l)`` for
a non-negative loss), summed, N(0, (σ_l R_l)²) added, divided by the public expected batch
size b. R_l is auto-regressive: set from the previous probe round's released losses (§3.5.2).

Privacy (what the ledger records):

- every step releases the gradient sum at σ_g = γσ (γ = 1.01), σ the plain DP-SGD noise for
  the run's (ε, δ, q, T);
- every K-th step (t = 0, K, 2K, ...) also releases the three loss sums, each at noise
  multiplier σ_l. They use the gradient's Poisson batch, so the step is recorded as **one**
  subsampled Gaussian with 1/σ_eff² = 1/σ_g² + 3/σ_l² (digest §4.4), never the paper's
  optimistic separate composition;
- σ_l is solved (Algorithm 2, ``dpfy.privacy.hyfree_noise_split``) so that this very ledger
  spends the target ε by the run's rigorous accountant. The noise multipliers do not depend on
  R_l (noise std = σ_l·R_l, sensitivity R_l), so the ledger is known before training.

Decisions the paper leaves open (each an option; defaults stated):

- **Direction d.** The probes of step t need d before step t's gradient exists, so they use the
  update the optimizer actually applied at step t − 1, d = (θ_{t−1} − θ_t)/η_{t−1}, read from
  the released parameters (momentum, Adam's preconditioning and weight decay included; the
  optimizer's state is never advanced twice). The first round (t = 0) has no direction: its
  three losses are taken at θ and only set R_l. The new η applies from step t + 1.
- **Probe spacing** (the paper: the probes at θ ∓ η d). Here at θ ∓ c·η·d with c =
  ``probe_spacing`` = 4: the fit is exact on a quadratic at any spacing, and its noise stds
  fall as 1/c (b) and 1/c² (a), so at c ≥ 2√3 a round that resolves the descent at η ≥ η*
  also resolves the curvature.
- **η rule** (the paper gives none beyond b/a). The released losses carry noise of known,
  public std σ_l R_l / b, so the fit's a and b have known noise stds; an estimate beyond
  ``significance`` stds is "seen". First a **search**: from η₀ (1e-4) η doubles
  (``search_growth``) every round until a round sees the step reach the line minimizer η* (the
  curvature seen, or the descent turned: on a quadratic b_t = (1 − η/η*)·b_{t−1}, so a seen
  ascent means the last step passed η*) (:func:`overshoot_seen`), or the slope seen in the
  round before has halved (η is a sizable fraction of η*: :func:`slope_halved`; the search
  then keeps its η instead of doubling past η*), or the search rounds' curvature, pooled, is
  seen (:meth:`HyFreeDP.after_fit`). Then the rounds' fits are
  **pooled** (``fit_memory`` λ = 0.9: inverse-variance weights λ^age/std²,
  :class:`~dpfy.adaptive._pooled_fit.PooledFit`) and the rule acts on the pooled (a, b): curvature
  seen → b/a; only the descent seen (``unseen_curvature="grow"``: with wide probes this means η <
  η*) → grow; ascent seen → shrink; nothing seen (``nothing_seen="hold"``) → keep η. Targets are
  clamped to [η/``max_change``, η·``max_change``] and smoothed, η ← ``smoothing``·η + (1 −
  ``smoothing``)·target (GeN's official code, §7); the search's growth is not smoothed.
  Why: at b = 2048 and σ_l ≈ 10 (Fashion-MNIST, ε = 3) one round at spacing η almost never
  resolves the curvature at a useful step; the rules acting on single rounds grew η without
  bound ("grow"), or shrank it on their false positives until it froze ("bound", "hold"), all
  measured in docs/results/hyfree_fmnist.md.
- **η floor** (``lr_keep`` = 1/3): the fit never takes η below a third of its peak (the
  largest η not shown too large: the fit's raises, not the search's overshoot).
  Once the gradient's signal is spent, the fit along the last update sees E[b]/E[a] = −η/2 at
  every η (the previous step's own noise overshot), so a rule that shrinks on the fit drifts to
  0; the floor keeps the "increase, then decrease" within a factor 3 of the peak.
- **Loss-rise guard** (``rise_significance`` = 4, ``rise_window`` = 10): the released loss at θ
  of the latest 10 rounds against the 10 before (4 standard errors), and the latest round
  against the one before (8 stds: a divergence); a rise halves η (in the search: undoes the
  last growth too), ends the search and caps η at that half for the rest of the run
  (:class:`~dpfy.adaptive._loss_trend.LossTrend`). The fit cannot see a too-large η when the
  probes are too noisy (small batches); the loss's trend can, and the cap keeps the rule's
  growth on noise from taking η back to where the loss climbed.
- **Last-iterate decay** (``decay_tail``, off by default): the applied η is the rule's η
  times a linear decay to 0 over the last fraction f of the run's T steps (DP training always
  knows T: the accountant needs it), the schedule that minimizes the last iterate's
  worst-case error for SGD on convex problems (Defazio et al., "When, why and how much?
  Adaptive learning rate scheduling by refinement", 2023). The rule, its probes and its floor
  keep working on the undecayed η; d divides by the η actually applied. Off because on
  Fashion-MNIST at f = 1/2 it did not help: the runs still learn at epoch 40 (run K2, 86.13 %,
  docs/results/hyfree_fmnist.md).
- **R_l rule**: ``"sum"`` (default; the paper's "in practice" rule, R_l = |L̃_− + L̃_0 + L̃_+|,
  ≈ 3× the loss: little clipping bias) or ``"anchor"`` (|L̃_0|, Algorithm 1 line 8); never
  below ``loss_clip_floor`` nor below ``loss_clip_keep`` (1/3) of its largest value so far.
  Why the second floor: the released losses are clipped at R_l, so the sum rule feeds on its
  own clipping and settles near the 2/3-quantile of the example losses, ≈ 0.01 on a confident
  classifier, where the probes see nothing; a third of its early peak (≈ 3× the initial loss)
  is ≈ the initial loss.
- **K** = 5 by default (the paper's §4.1; 10 in its Algorithm 1; both supported).

Cost: three forward passes without gradients every K steps (one more than the paper's two, as
the training loss at θ is not visible to a method), and one parameter copy kept from the step
before a probe round.

Releases per step: the gradient sum at σ_g = 1.01σ (automatic clipping, sensitivity 1); every
K-th step also three loss sums (θ, θ ∓ c·η·d, c = probe_spacing), each clipped to R_l at noise
multiplier σ_l, composed with the gradient into one step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import ClassVar, Literal, Mapping

import torch

from dpfy._require import require
from dpfy.adaptive._loss_trend import LossTrend
from dpfy.adaptive._pooled_fit import PooledFit
from dpfy.types import Clip, Norms, StepOutcome, ReleaseSpec, RunFacts
from dpfy.adaptive.base import Method, Needs, bind_facts, register
from dpfy.clipping import AutomaticClipping
from dpfy.types.plan import StepPlan
from dpfy.privacy.calibration import hyfree_noise_split
from dpfy.privacy.ledger import Sampling

__all__ = ["HyFreeDP", "HyFreeState", "fit_quadratic", "fit_noise_stds", "next_learning_rate",
           "overshoot_seen", "slope_halved",
           "PROBES", "DEFAULT_INITIAL_LR"]

Vector = Mapping[str, torch.Tensor]

# The three probe releases: where each loss is taken, as the sign of the step along −d.
PROBES = {"loss_probe_at_theta": 0.0, "loss_probe_descent": 1.0, "loss_probe_ascent": -1.0}

DEFAULT_INITIAL_LR = 1e-4   # Algorithm 1's input η (×10 for LoRA, §3.4)
LOSS_CLIP_RULES = ("sum", "anchor")
UNSEEN_CURVATURE_RULES = ("grow", "hold", "bound")
NOTHING_SEEN_RULES = ("grow", "hold")


def fit_quadratic(descent: float, at_theta: float, ascent: float, lr: float
                  ) -> tuple[float, float]:
    """(a, b) of L(θ − s d) ≈ L_0 − b s + a s²/2 through the three points s = η, 0, −η.

    ``descent`` = L(θ − η d), ``at_theta`` = L(θ), ``ascent`` = L(θ + η d). The fit anchored at
    L_0 interpolates the other two exactly (digest 004 §2.5): b estimates ∇Lᵀd, a estimates dᵀHd.
    """
    require(lr > 0, "lr", lr, "> 0")
    b = (ascent - descent) / (2 * lr)
    a = (descent + ascent - 2 * at_theta) / lr ** 2
    return a, b


def fit_noise_stds(loss_std: float, spacing: float) -> tuple[float, float]:
    """(std_a, std_b) of :func:`fit_quadratic`'s (a, b) when each of its three losses carries
    independent noise of std ``loss_std`` and the probes sit ``spacing`` apart: from
    a = (L₊ + L₋ − 2L₀)/s² and b = (L₋ − L₊)/(2s), std_a = √6·u/s² and std_b = √2·u/(2s)."""
    return math.sqrt(6) * loss_std / spacing ** 2, math.sqrt(2) * loss_std / (2 * spacing)


def next_learning_rate(lr: float, a: float, b: float, *, max_change: float, smoothing: float,
                       std_a: float = 0.0, std_b: float = 0.0, significance: float = 2.0,
                       unseen_curvature: str = "bound", nothing_seen: str = "hold",
                       hold_inside: bool = False) -> float:
    """η after one probe round, from the fit (a, b) and its public noise stds.

    ``std_a``, ``std_b`` are the stds of a and b that the loss noise alone causes (public: from
    σ_l, R_l and b); an estimate within ``significance`` stds of 0 is "not seen". Target:
    - a seen > 0: b/a (the fitted minimizer; ≤ 0 when d does not descend); with
      ``hold_inside``, η is kept when it lies inside the noise's interval for η*,
      [(b − z·std_b)/(a + z·std_a), (b + z·std_b)/(a − z·std_a)] (z = significance): a
      resolved curvature over an unresolved slope says little about b/a;
    - b seen < 0 (d ascends: the last step passed the line minimizer, since on a quadratic
      b_t = (1 − η/η*)·b_{t−1}): halve, not smoothed (evidence, not a noisy fit);
    - b seen > 0, a not (the descent is resolved, its end is not), by ``unseen_curvature``:
      ``"bound"`` (default): b/(max(a, 0) + significance·std_a), the minimizer under the largest
      curvature the noise leaves possible (a lower confidence bound on b/a: η never passes the
      line minimizer because the probes failed to see the curvature); ``"hold"``: keep η;
      ``"grow"`` (the rule before): grow, which on Fashion-MNIST grew η without bound (the
      curvature is almost never resolved at a useful step, docs/results/hyfree_fmnist.md);
    - nothing seen: ``nothing_seen="hold"`` (default: no evidence, no change; after the
      search η moves only on evidence) or ``"grow"`` (the step may be too small to resolve; on
      Fashion-MNIST this crept η up to 0.05–0.1 and cost 5 points, docs/results/hyfree_fmnist.md);
    The earlier rule is ``"grow"`` with ``nothing_seen="grow"`` (shrinking smoothed too). Before
    any of this runs, HyFreeDP searches (:func:`overshoot_seen`).
    A fitted target is clamped to [η/max_change, η·max_change]; then η ← smoothing·η +
    (1 − smoothing)·target.
    """
    require(unseen_curvature in UNSEEN_CURVATURE_RULES, "unseen_curvature", unseen_curvature,
            f"one of {list(UNSEEN_CURVATURE_RULES)}")
    require(nothing_seen in NOTHING_SEEN_RULES, "nothing_seen", nothing_seen,
            f"one of {list(NOTHING_SEEN_RULES)}")
    seen_a, seen_b = a > significance * std_a, abs(b) > significance * std_b
    if not (math.isfinite(a) and math.isfinite(b)):
        target = lr / max_change
    elif seen_a and a > 0:
        z = significance      # a seen: a − z·std_a > 0
        if hold_inside and (b - z * std_b) / (a + z * std_a) <= lr <= (
                (b + z * std_b) / (a - z * std_a)):
            return lr
        target = b / a
    elif seen_b and b < 0 and unseen_curvature != "grow":
        return lr / max_change
    elif seen_b and b < 0:
        target = lr / max_change
    elif not seen_b and nothing_seen == "hold":
        return lr
    elif not seen_b or unseen_curvature == "grow":
        target = lr * max_change
    elif unseen_curvature == "hold":
        target = lr
    else:
        curvature = max(a, 0.0) + significance * std_a
        target = b / curvature if curvature > 0 else math.inf
    target = min(max(target, lr / max_change), lr * max_change)
    return smoothing * lr + (1 - smoothing) * target


def slope_halved(b: float, std_b: float, before: tuple[float, float] | None, *,
                 significance: float = 3.0) -> bool:
    """True when the previous search round's seen descent b' (``before`` = (b', std_b'),
    b' > significance·std_b') fell to half or less in this round: b'/2 − b > significance ·
    √(std_b² + std_b'²/4). Why: the steps between two rounds remove a share of the slope
    along d that grows with η/η* (on a quadratic, (1 − η/η*) of it remains after a step), so a
    seen slope that halves says the current η is a sizable fraction of η*, and the search's
    next doubling would pass it. On Fashion-MNIST this comes one or two rounds before the
    curvature is seen at three stds: three of thirteen searches (I5, J1, K1) ran on to
    η = 1.6–3.3 and lost 1.5–3.5 points; in each the slope had fallen from 4.6–9.5 stds to
    0.2–2.2 stds at η = 0.2–0.4 (docs/results/hyfree_fmnist.md)."""
    if before is None or not (math.isfinite(b) and math.isfinite(std_b)):
        return False
    b0, std_b0 = before
    return (b0 > significance * std_b0
            and b0 / 2 - b > significance * math.sqrt(std_b ** 2 + std_b0 ** 2 / 4))


def overshoot_seen(a: float, b: float, *, std_a: float, std_b: float,
                   significance: float = 2.0) -> bool:
    """True when a probe round shows the step η reaches the line minimizer η* = b/a or beyond:
    the curvature is seen (a > significance·std_a: the quadratic's minimum is resolved within
    the probes) or the descent has turned (b < −significance·std_b; on a quadratic
    b_t = (1 − η/η*)·b_{t−1}, so the last step passed η*). Until a round shows this, HyFreeDP
    grows η each round (``search``, ×``search_growth``): a bracketing search from the paper's
    small η₀ = 1e-4, which the smoothed rule would take most of a run to leave."""
    return (math.isfinite(a) and math.isfinite(b)
            and (a > significance * std_a or b < -significance * std_b))


@dataclass(frozen=True)
class HyFreeState:
    """η_t, R_l and what the next probe round needs; built from released values only.

    ``anchor`` is θ kept from the step before a probe round's predecessor, ``direction`` the
    update direction d = (θ_{t−1} − θ_t)/η_{t−1} for the coming round (None: not known yet).
    ``last_fit`` is (a, b) of the latest round with a direction, for logs and plots;
    ``searching``: no round has shown an overshoot yet (:func:`overshoot_seen`); ``pool`` the
    rounds' fits since the search, pooled (:class:`~dpfy.adaptive._pooled_fit.PooledFit`);
    ``loss_clip_peak`` the largest R_l so far; ``search_slope`` (b, std_b) of the latest
    search round (:func:`slope_halved`); ``trend`` the released losses at θ of the
    latest rounds (:class:`~dpfy.adaptive._loss_trend.LossTrend`); ``lr_ceiling`` the cap
    the loss-rise guard set (η never returns to where the loss climbed); ``lr_peak`` the
    largest η not shown too large (:meth:`HyFreeDP._lr_peak`; the floor is ``lr_keep``·peak).
    """

    lr: float
    loss_clip: float
    anchor: dict[str, torch.Tensor] | None = None
    direction: dict[str, torch.Tensor] | None = None
    last_fit: tuple[float, float] | None = None
    rounds: int = 0
    searching: bool = True
    pool: PooledFit | None = None
    loss_clip_peak: float = 0.0
    trend: LossTrend | None = None
    lr_ceiling: float = math.inf
    lr_peak: float = 0.0
    search_slope: tuple[float, float] | None = None


@register("hyfree")
@dataclass(frozen=True)
class HyFreeDP(Method[HyFreeState]):
    """HyFreeDP: automatic clipping + the learning rate fitted from privatized loss probes.

    See the module docstring for the algorithm, the accounting and every default decision.
    Needs ``make_private(target_epsilon=..., target_delta=..., loss_fn=...)``: the method splits
    the budget between the gradient and the probes itself (Algorithm 2).

    Args:
      probe_every: K, steps between probe rounds (5 or 10 in the paper).
      initial_lr: η_0; None takes the wrapped optimizer's learning rate.
      initial_loss_clip: R_l before the first round (paper: 1).
      loss_clip_rule: ``"sum"`` (default) or ``"anchor"``.
      loss_clip_floor: the smallest R_l (a noisy released loss can be ≈ 0 or negative).
      max_change: the largest factor η moves by in one round (GeN: 2).
      smoothing: weight of the old η in the update (GeN: 0.9).
      significance: how many noise stds a fitted a or b must exceed to count as seen.
      unseen_curvature: the rule when the descent is seen but the curvature is not:
        ``"grow"`` (default), ``"hold"`` or ``"bound"`` (see :func:`next_learning_rate`).
      search: grow η every round (×``search_growth``) until one shows the step reaching the
        line minimizer (:func:`overshoot_seen`), then fit; False fits (pooled) from the first
        round.
      hold_inside: when the curvature is seen, keep η if it lies inside the noise's interval
        for η* = b/a (default); False moves toward b/a whatever its noise. Why: late in a
        Fashion-MNIST run a is often resolved while b ≈ 0 within noise, and the point b/a
        then only ever shrank η (0.23 → 0.15 over the last 15 epochs) while the hand-tuned
        run kept 0.4 and ended 0.3 points higher.
      search_significance: how many noise stds end the search (default 3). The search
        tests one round at a time over ~10–15 rounds from η₀ = 1e-4, and a false stop leaves
        η where the probes are blind for the rest of the run; at 2 stds a quarter of the
        runs on a noisy quadratic stopped falsely (and one of three Fashion-MNIST runs:
        19.9 %), at 3 stds none of 200 did.
      search_growth: the factor η grows by per search round (default 2). ×4 halves the search
        (Fashion-MNIST, b = 2048: over at step 35 instead of ~60) but at b = 128, where a round
        resolves little, it jumped 0.4 → 1.6 → 6.6 → 26 before a round saw the overshoot and
        the loss went from 1.3 to 13 (docs/results/hyfree_fmnist.md).
      rise_significance: when the mean released loss at θ of the latest ``rise_window``
        rounds exceeds that of the ``rise_window`` rounds before by more than this many
        standard errors, or the latest round's exceeds the round before's by twice this many
        stds (one round against one, the batch noise estimated from a few rounds' spread:
        :class:`~dpfy.adaptive._loss_trend.LossTrend`), η is halved (during the search:
        quartered, undoing the last growth too), the search ends and η is capped at the half
        from then on (default 4; None: off). Why: at small batches the probes resolve nothing,
        the rule holds η, and a too-large η shows only as the loss climbing over many rounds
        (b = 128 on Fashion-MNIST: 0.6 → 1.2 with η held at 1.25).
      rise_window: rounds per window of that comparison (default 10).
      fit_shrinks: after the search, the fit may lower η (default); False: only the loss-rise
        guard lowers it, the fit only raises or holds it.
      lr_keep: the fit never takes η below this fraction (default 1/3) of the largest η not
        shown too large (:meth:`_lr_peak`: not the search's overshoot; 0: no floor); the
        loss-rise guard's cap may, and lowers the peak to the cap (an η that made the loss
        climb is no scale to keep). Why: once the gradient's signal
        is spent, the fit along the last update sees E[b]/E[a] = −η/2 at every η (a
        derivation in the tests), an "ascent" whatever η is, so the rule shrinks η with no
        fixed point above 0; on Fashion-MNIST η fell from 1.17 to 0.10 and the run lost a
        point (85.45 %), while η held at its peak (1.14) or a fixed 1.0 lost more (84.80 %)
        and the hand-tuned 0.4 ≈ a third of the peak won (docs/results/hyfree_fmnist.md).
      nothing_seen: after the search, a round that resolves nothing ``"hold"``s η (default)
        or ``"grow"``s it, smoothed (see :func:`next_learning_rate`).
      probe_spacing: c (default 4), the probes sit at θ ∓ c·η·d (the paper: c = 1). The
        fit's noise stds fall as 1/c (b) and 1/c² (a); at c ≥ 2√3 ≈ 3.5 (significance 2) a
        round that resolves the descent at η ≥ η* also resolves the curvature, so "descent
        seen, curvature not" means η < η*.
      fit_memory: λ (default 0.9) of the pooled fit (:class:`~dpfy.adaptive._pooled_fit.
        PooledFit`): after the search the rule acts on the rounds' (a, b) averaged with
        weights λ^age/std² instead of the latest round alone (0: the latest round alone).
      loss_clip_keep: R_l never falls below this fraction (default 1/3) of its largest value
        (0: the paper's rule, which can collapse: docs/results/hyfree_fmnist.md).
      decay_tail: the fraction f of the run's T steps over which the applied η falls
        linearly to 0, η_applied = η·min(1, (T − t)/(f·T)) (default None, or 0: off, the
        rule's η throughout). The rule's η itself is not changed.
      gamma: σ_g = γσ, the gradient's noise inflation that frees budget for the probes (1.01).
      stability: γ_s of automatic clipping, w_i = 1/(‖g_i‖ + γ_s).

    Releases per step: the gradient sum at σ_g = 1.01σ (automatic clipping, sensitivity 1);
    every K-th step also three loss sums (θ, θ ∓ c·η·d, c = probe_spacing), each clipped to R_l
    at noise multiplier σ_l, composed with the gradient into one step.
    """

    probe_every: int = 5
    initial_lr: float | None = None
    initial_loss_clip: float = 1.0
    loss_clip_rule: Literal["sum", "anchor"] = "sum"
    loss_clip_floor: float = 0.01
    max_change: float = 2.0
    smoothing: float = 0.9
    significance: float = 2.0
    unseen_curvature: Literal["grow", "hold", "bound"] = "grow"
    search: bool = True
    search_significance: float = 3.0
    search_growth: float = 2.0
    rise_significance: float | None = 4.0
    rise_window: int = 10
    fit_shrinks: bool = True
    lr_keep: float = 1 / 3
    nothing_seen: Literal["grow", "hold"] = "hold"
    hold_inside: bool = True
    probe_spacing: float = 4.0
    fit_memory: float = 0.9
    loss_clip_keep: float = 1 / 3
    gamma: float = 1.01
    stability: float = 0.01
    decay_tail: float | None = None
    # Set by calibrate() from the run's facts:
    gradient_noise: float | None = None      # σ_g
    loss_noise: float | None = None          # σ_l
    base_lr: float | None = None             # the inner optimizer's learning rate
    total_steps: int | None = None           # T, the run's horizon

    needs = Needs(probes=True)
    sets = frozenset({"noise_multiplier", "clip", "lr_scale"})
    # `dpfy train --method hyfree` without --lr / --optimizer (dpfy.train.config.default_lr):
    # Algorithm 1's η₀ and SGD with momentum 0.9 (dpfy train's). The paper's AdamW family was
    # the default before the pooled fit; on Fashion-MNIST the fit's greedy η* along Adam's
    # direction fell to 2e-4 (84.45 %), along SGD's it rose to ≈ 1 and came back to the
    # hand-tuned step's range (docs/results/hyfree_fmnist.md).
    default_initial_lr: ClassVar[float] = DEFAULT_INITIAL_LR
    default_optimizer: ClassVar[str] = "sgd"

    def __post_init__(self) -> None:
        require(isinstance(self.probe_every, int) and self.probe_every >= 1, "probe_every",
                self.probe_every, "an integer >= 1", "The paper uses K = 5 or 10")
        require(self.initial_lr is None or self.initial_lr > 0, "initial_lr", self.initial_lr,
                "> 0 or None (the optimizer's learning rate)")
        require(self.initial_loss_clip > 0, "initial_loss_clip", self.initial_loss_clip, "> 0")
        require(self.loss_clip_rule in LOSS_CLIP_RULES, "loss_clip_rule", self.loss_clip_rule,
                f"one of {list(LOSS_CLIP_RULES)}")
        require(self.loss_clip_floor > 0, "loss_clip_floor", self.loss_clip_floor, "> 0")
        require(self.max_change > 1, "max_change", self.max_change, "> 1", "GeN uses 2")
        require(0 <= self.smoothing < 1, "smoothing", self.smoothing, "in [0, 1)",
                "GeN uses 0.9")
        require(self.significance >= 0, "significance", self.significance, ">= 0")
        require(self.search_significance >= 0, "search_significance", self.search_significance,
                ">= 0")
        require(self.search_growth > 1, "search_growth", self.search_growth, "> 1")
        require(self.rise_significance is None or self.rise_significance > 0,
                "rise_significance", self.rise_significance, "> 0 or None (off)")
        require(isinstance(self.rise_window, int) and self.rise_window >= 2, "rise_window",
                self.rise_window, "an integer >= 2")
        require(self.unseen_curvature in UNSEEN_CURVATURE_RULES, "unseen_curvature",
                self.unseen_curvature, f"one of {list(UNSEEN_CURVATURE_RULES)}")
        require(self.nothing_seen in NOTHING_SEEN_RULES, "nothing_seen", self.nothing_seen,
                f"one of {list(NOTHING_SEEN_RULES)}")
        require(self.probe_spacing >= 1, "probe_spacing", self.probe_spacing, ">= 1",
                "The probes sit at θ ∓ c·η·d; c < 1 would resolve less than one step")
        require(0 <= self.fit_memory < 1, "fit_memory", self.fit_memory, "in [0, 1)")
        require(0 <= self.loss_clip_keep <= 1, "loss_clip_keep", self.loss_clip_keep,
                "in [0, 1]")
        require(0 <= self.lr_keep <= 1, "lr_keep", self.lr_keep, "in [0, 1]")
        require(self.gamma > 1, "gamma", self.gamma, "> 1", "The paper uses 1.01")
        require(self.stability > 0, "stability", self.stability, "> 0")
        require(self.decay_tail is None or 0 <= self.decay_tail <= 1, "decay_tail",
                self.decay_tail, "in [0, 1] (0 or None: off)")

    # -- calibration ---------------------------------------------------------------------------
    def calibrate(self, facts: RunFacts) -> "HyFreeDP":
        """σ_g, σ_l for the run's (ε, δ, q, T) by Algorithm 2 on the run's own ledger."""
        require(facts.target_epsilon is not None and facts.delta is not None,
                "target_epsilon", facts.target_epsilon, "given for method 'hyfree'",
                "HyFreeDP splits the budget between gradient and loss probes itself: pass "
                "make_private(target_epsilon=..., target_delta=..., epochs=...) and no "
                "noise_multiplier")
        require(facts.steps is not None, "steps", None, "known for method 'hyfree'",
                "Pass epochs= or max_steps=")
        require(facts.sampling == Sampling.POISSON, "sampling", facts.sampling,
                "Poisson for method 'hyfree'", "Its accounting composes probes with the "
                "gradient's Poisson-sampled step; use poisson_sampling=True")
        base_lr = (facts.inner_hyperparameters or {}).get("lr")
        require(isinstance(base_lr, (int, float)) and base_lr > 0, "optimizer lr", base_lr,
                "a number > 0", "HyFreeDP scales the wrapped optimizer's learning rate")
        sigma_g, sigma_l = hyfree_noise_split(
            target_epsilon=facts.target_epsilon, delta=facts.delta,
            sample_rate=facts.sample_rate, steps=facts.steps, probe_every=self.probe_every,
            probes_per_round=len(PROBES), gamma=self.gamma, accountant=facts.accountant,
            probes_share_batch=True)
        return bind_facts(replace(self, gradient_noise=sigma_g, loss_noise=sigma_l,
                                  base_lr=float(base_lr), total_steps=int(facts.steps)), facts)

    def _calibrated(self) -> None:
        require(self.gradient_noise is not None, "method 'hyfree'", "uncalibrated",
                "calibrated for the run", "Pass it to make_private(method=...), which "
                "calibrates it for the run's facts")

    # -- the step ------------------------------------------------------------------------------
    def init(self) -> HyFreeState:
        self._calibrated()
        lr = self.initial_lr if self.initial_lr is not None else self.base_lr
        return HyFreeState(lr=float(lr), loss_clip=self.initial_loss_clip)

    def plan(self, state: HyFreeState, plan: StepPlan) -> StepPlan:
        return replace(plan, noise_multiplier=self.gradient_noise, clip=1.0,
                       lr_scale=state.lr * self.tail_factor(plan.step) / self.base_lr)

    def tail_factor(self, step: int) -> float:
        """The factor on η at ``step``: 1, then linear to 0 over the last ``decay_tail`` of the
        run's T steps (the last step keeps 1/(tail·T) > 0). The rule's η (``state.lr``) is not
        changed by it: the probes and the fit keep their own scale."""
        if not self.decay_tail:
            return 1.0
        tail = self.decay_tail * self.total_steps
        return min(1.0, max(self.total_steps - step, 1) / tail)

    def clipping(self, state: HyFreeState, norms: Norms, plan: StepPlan) -> Clip:
        auto = AutomaticClipping(clip=1.0, gamma=self.stability)
        return Clip(auto.weights(norms.per_parameter_sq, 1.0, norm=norms.total), 1.0)

    def _spacing(self, state: HyFreeState) -> float:
        """How far along d the probes sit: c·η (``probe_spacing`` c; the paper's c = 1)."""
        return self.probe_spacing * state.lr

    def round_noise(self, state: HyFreeState, expected_batch_size: float
                    ) -> tuple[float, float, float]:
        """(u, std_a, std_b) of the probe round ``state`` is about to be updated by: u, each
        released mean loss's noise std σ_l·R_l/b (public), and the stds it gives the fit's
        (a, b) at this round's spacing (:func:`fit_noise_stds`)."""
        loss_std = self.loss_noise * state.loss_clip / expected_batch_size
        return (loss_std, *fit_noise_stds(loss_std, self._spacing(state)))

    def _probe_round(self, step: int) -> bool:
        return step % self.probe_every == 0

    def releases(self, state: HyFreeState, plan: StepPlan) -> Mapping[str, ReleaseSpec]:
        if not self._probe_round(plan.step):
            return {}
        r_l = state.loss_clip
        out, spacing = {}, self._spacing(state)
        for name, sign in PROBES.items():
            offsets = ({} if state.direction is None or sign == 0.0 else
                       {n: -sign * spacing * d for n, d in state.direction.items()})
            out[name] = ReleaseSpec(sensitivity=r_l, noise_std=self.loss_noise * r_l,
                                    kind="loss", offsets=offsets)
        return out

    def update(self, state: HyFreeState, released: StepOutcome) -> HyFreeState:
        t, k = released.plan.step, self.probe_every
        if self._probe_round(t):
            state = self._after_probes(state, released)
        applied_lr = released.plan.lr_scale * self.base_lr
        params = released.parameters
        direction, anchor = state.direction, state.anchor
        if (t + 1) % k == 0:      # the next step probes: d from this step's applied update
            direction = (None if anchor is None else
                         {n: (anchor[n] - p) / applied_lr for n, p in params.items()})
            anchor = None
        if (t + 2) % k == 0:      # the step after this one is the last before a round
            anchor = {n: p.detach().clone() for n, p in params.items()}
        return replace(state, direction=direction, anchor=anchor)

    def next_lr(self, lr: float, a: float, b: float, *, std_a: float, std_b: float,
                searching: bool, slope_before: tuple[float, float] | None = None,
                search_pool: PooledFit | None = None) -> tuple[float, bool]:
        """(η, still searching) after a round with fit (a, b) of noise stds (std_a, std_b):
        η·search_growth while searching and none of the search's ends is seen, else
        :func:`next_learning_rate` with this method's options. The search ends on an
        overshoot (:func:`overshoot_seen`), a slope halved since the search round before
        (``slope_before`` = its (b, std_b), :func:`slope_halved`), or the search rounds'
        curvature pooled (``search_pool``, this round included) seen at
        ``search_significance`` stds in a round that sees the descent (a curvature "seen"
        where no descent is, at η far below η*, is the pool's noise: 2 of 100 noisy-quadratic
        searches stopped there without this condition)."""
        z = self.search_significance
        pooled_curvature = (search_pool is not None and search_pool.a > z * search_pool.std_a
                            and b > z * std_b)
        searching = (self.search and searching
                     and not overshoot_seen(a, b, std_a=std_a, std_b=std_b, significance=z)
                     and not slope_halved(b, std_b, slope_before, significance=z)
                     and not pooled_curvature)
        if searching:
            return lr * self.search_growth, True
        return next_learning_rate(lr, a, b, max_change=self.max_change, smoothing=self.smoothing,
                                  std_a=std_a, std_b=std_b, significance=self.significance,
                                  unseen_curvature=self.unseen_curvature,
                                  nothing_seen=self.nothing_seen,
                                  hold_inside=self.hold_inside), False

    def after_fit(self, lr: float, a: float, b: float, *, std_a: float, std_b: float,
                  searching: bool, pool: PooledFit | None,
                  slope_before: tuple[float, float] | None = None
                  ) -> tuple[float, bool, PooledFit | None]:
        """(η, still searching, pool) after a round's fit (a, b) of noise stds (std_a, std_b).

        While searching, the round joins the search's pool and :meth:`next_lr` decides; when
        the search ends the pool is emptied (the rule after the search starts from its own
        rounds). After it, the round joins the pool and the rule acts on the pooled (a, b) and
        their stds. A halving (a seen ascent) empties the pool: the evidence it held has been
        acted on.
        Why pool the search: on Fashion-MNIST three of sixteen searches saw the curvature at
        2.4–2.9 stds in three or four successive rounds, never at 3 in one, and doubled on to
        η = 0.8–1.8 (runs J1, S3, B2: 84.96 / 85.66 % and a third); pooled, it is seen at
        3.2–3.3 stds at η = 0.2–0.4 (docs/results/hyfree_fmnist.md).
        """
        if self.search and searching:
            pool = (pool or PooledFit(self.fit_memory)).add(a, b, std_a=std_a, std_b=std_b)
            new, searching = self.next_lr(lr, a, b, searching=True, std_a=std_a, std_b=std_b,
                                          slope_before=slope_before, search_pool=pool)
            return new, searching, (pool if searching else pool.reset())
        pool = (pool or PooledFit(self.fit_memory)).add(a, b, std_a=std_a, std_b=std_b)
        new, _ = self.next_lr(lr, pool.a, pool.b, std_a=pool.std_a, std_b=pool.std_b,
                              searching=False)
        if not self.fit_shrinks:
            new = max(new, lr)
        if new <= lr / self.max_change * (1 + 1e-12):     # only the halving moves η this far
            pool = pool.reset()
        return new, False, pool

    def _lr_peak(self, state: HyFreeState, lr: float, searching: bool) -> float:
        """The largest η the evidence did not show too large, of which ``lr_keep`` is the floor:
        the search's last step before the one that showed the overshoot (η_t/search_growth:
        η_t itself reached η*), and every η the fit raised η to after the search. Why not the
        largest η: a search that saw the overshoot late ended at 3.3 on Fashion-MNIST and the
        floor held η at 1.09 for the rest of the run (83.09 %, run I5)."""
        if state.searching and not searching:
            return max(state.lr_peak, state.lr / self.search_growth)
        if not state.searching and lr > state.lr:
            return max(state.lr_peak, lr)
        return state.lr_peak

    def _loss_trend(self, state: HyFreeState, at_theta: float, loss_std: float
                    ) -> tuple[LossTrend, bool]:
        """(the trend with this round's released loss at θ, whether it rose): the loss-rise
        guard's evidence. The first round (no direction yet) is left out: its R_l is the
        arbitrary R_l,0, so its clipped loss is not comparable; a rise empties the trend."""
        trend = state.trend or LossTrend(self.rise_window)
        if state.direction is not None:
            trend = trend.add(at_theta, loss_std)
        z = self.rise_significance
        if z is not None and (trend.rising(z) or trend.jumped(2 * z)):
            return trend.reset(), True
        return trend, False

    def _after_probes(self, state: HyFreeState, released: StepOutcome) -> HyFreeState:
        b_size = released.expected_batch_size
        loss = {name: float(released.sums[name]) / b_size for name in PROBES}
        descent, at_theta, ascent = (loss["loss_probe_descent"], loss["loss_probe_at_theta"],
                                     loss["loss_probe_ascent"])
        lr, fit, searching, pool = state.lr, state.last_fit, state.searching, state.pool
        loss_std, std_a, std_b = self.round_noise(state, b_size)
        slope = state.search_slope
        if state.direction is not None:
            a, b = fit_quadratic(descent, at_theta, ascent, self._spacing(state))
            fit, slope = (a, b), ((b, std_b) if state.searching else None)
            lr, searching, pool = self.after_fit(state.lr, a, b, std_a=std_a, std_b=std_b,
                                                 searching=searching, pool=pool,
                                                 slope_before=state.search_slope)
        trend, rose = self._loss_trend(state, at_theta, loss_std)
        ceiling, lr_peak = state.lr_ceiling, self._lr_peak(state, lr, searching)
        if rose:
            ceiling = min(ceiling, state.lr / self.max_change)   # η_t made the loss climb
            lr_peak = min(lr_peak, ceiling)    # the floor: a fraction of an η not shown harmful
            lr = min(lr, ceiling / (self.search_growth if state.searching else 1.0))
            searching, pool = False, (pool.reset() if pool is not None else None)
        if not searching:
            lr = max(lr, self.lr_keep * lr_peak)
        lr = min(lr, ceiling)
        raw = abs(descent + at_theta + ascent) if self.loss_clip_rule == "sum" else abs(at_theta)
        peak = max(state.loss_clip_peak, state.loss_clip)
        loss_clip = max(raw, self.loss_clip_floor, self.loss_clip_keep * peak)
        return replace(state, lr=lr, loss_clip=loss_clip, loss_clip_peak=peak, last_fit=fit,
                       direction=None, rounds=state.rounds + 1, searching=searching, pool=pool,
                       trend=trend, lr_ceiling=ceiling, lr_peak=lr_peak, search_slope=slope)
