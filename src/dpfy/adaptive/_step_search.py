"""The common part of NoisyMax and NoisyBTLS: choose this step's size along its released gradient.

Both methods (``noisy_max.py``, ``noisy_btls.py``; Monir, Fauzan & Ghinita
2023, §3.1.2) release, every step, the mean loss of the step's own batch at k candidate points
θ − η_j·g̃ along the step's released gradient g̃ (η_0 = 0: the current point), and pick η from
these noisy losses: a pure post-processing of releases. What differs is only the rule that
picks (:meth:`StepSearch.choose`).

Privacy (what the ledger records, every step, on the gradient's batch):

- the gradient sum at σ_t = σ_0·(1 + γ)^(−r_t/2), r_t the number of noise reductions so far;
- k candidate loss sums Σ_i clip(ℓ_i(θ − η_j g̃), −R, R), each a Gaussian release with
  sensitivity R at noise multiplier σ_l = ``probe_noise_ratio``·σ_0 (post-release probes,
  :class:`dpfy.types.ReleaseSpec` with callable offsets). Stacked they are the vector
  of the k sums with L2 sensitivity √k·R; the ledger composes the step's releases into one
  subsampled Gaussian with 1/σ_eff² = 1/σ_t² + k/σ_l² (same batch, exact). The papers'
  Laplace noisy max / sparse-vector test become Gaussian releases of every candidate followed
  by a post-processing choice: conservative (every candidate is paid for, the SVT saving is not
  claimed) and accounted by dp_accounting exactly.

Adaptive noise reduction (Lee & Kifer): a step whose choice is η = 0 ("no progress": no
candidate beats the current point) is not taken, and the next steps' gradient noise is lowered
by r ← r + 1, i.e. the gradient's zCDP budget ρ ∝ 1/σ² grows by (1 + γ). Lee & Kifer average
a fresh measurement with the old one on the same full batch; on Poisson batches dpfy instead
spends the larger budget on the next step's fresh batch. r is capped at ``max_reductions``.

Budget (dpfy's choice, documented): **worst-case calibration**. With a target ε, σ_0 is set so
that the worst-case ledger — every step at the smallest gradient noise σ_min = σ_0 (1 + γ)^(−L/2)
— spends exactly the target by the run's accountant (closed form: the plain calibration's σ_eff
for (ε, δ, q, T), times sqrt((1 + γ)^L + k/ratio²)). Every real run's σ_t is at least σ_min, so
its ε is at most the target (the first L steps make the bound slightly conservative); the budget
guard (``epsilon_cap`` = target) still watches the real ledger. Without a target the run's own
σ is σ_0 and the guard (if given a cap) stops the run.

The candidate points must be the points the optimizer reaches: the inner optimizer must be
``torch.optim.SGD`` without momentum and weight decay (refused otherwise), η_j = lr·m_j with the
optimizer's lr at make_private (an LR scheduler on it is not supported), and the method hands
SGD the gradient m_i·g̃ for the chosen i, so θ_{t+1} = θ_t − η_i g̃ exactly.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import ClassVar, Mapping, Sequence

import torch

from dpfy._require import require
from dpfy.adaptive.base import Method, bind_facts, calibrated, method_name
from dpfy.privacy.calibration import calibrate_run_noise_multiplier
from dpfy.privacy.ledger import Ledger
from dpfy.privacy.releases import base_plan, step_releases
from dpfy.types import ReleaseSpec, RunFacts, StepOutcome, StepPlan

__all__ = ["StepSearch", "SearchState"]


@dataclass(frozen=True)
class SearchState:
    """Public state: built only from released values.

    reductions: r, the noise reductions so far (σ_t = σ_0 (1 + γ)^(−r/2)).
    chosen: the multiplier m_i chosen at the last step (0: no progress), or None before any.
    losses: the last step's released mean candidate losses L̃_j (public).
    no_progress: steps so far whose choice was η = 0.
    """

    reductions: int = 0
    chosen: float | None = None
    losses: tuple[float, ...] = ()
    no_progress: int = 0


def _along(eta: float, gradient: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Offsets −η·g̃ of a candidate point (a function of the released gradient only)."""
    return {n: -eta * g for n, g in gradient.items()} if eta else {}


def _probe_label(m: float) -> str:
    where = "θ (the current point)" if m == 0 else f"θ − {m:g}·lr·g̃"
    return f"the batch's loss sum at {where}, after the gradient's release, each loss clipped to ±R"


@dataclass(frozen=True)
class StepSearch(Method[SearchState]):
    """A step-size search over post-release loss probes (base of NoisyMax and NoisyBTLS).

    Args (shared):
      loss_clip: R, per-example losses clipped to [−R, R] (sensitivity R per candidate).
      probe_noise_ratio: σ_l/σ_0, each candidate loss's noise multiplier relative to the
        gradient's initial one.
      reduction: γ, the gradient budget grows by (1 + γ) at a no-progress step.
      max_reductions: L, the cap on reductions (σ_t ≥ σ_0 (1 + γ)^(−L/2)).
    """

    # `dpfy train` defaults (see dpfy.train.config.method_default): the plain SGD it needs
    default_optimizer: ClassVar[str] = "sgd"
    default_momentum: ClassVar[float] = 0.0

    loss_clip: float = 3.0
    probe_noise_ratio: float = 4.0
    reduction: float = 0.1
    max_reductions: int = 10
    # Set by calibrate() from the run's facts:
    base_noise: float | None = None  # σ_0 (None: the run's own σ)
    base_lr: float | None = None  # the inner SGD's learning rate

    sets = frozenset({"noise_multiplier"})
    ledger_depends_on_data = True  # σ_t reacts to released losses (bounded: see calibrate)

    def __post_init__(self) -> None:
        require(self.loss_clip > 0, "loss_clip", self.loss_clip, "> 0")
        require(
            self.probe_noise_ratio > 0,
            "probe_noise_ratio",
            self.probe_noise_ratio,
            "> 0",
            "Loss probes without noise are not private",
        )
        require(self.reduction > 0, "reduction", self.reduction, "> 0")
        require(
            isinstance(self.max_reductions, int) and self.max_reductions >= 0,
            "max_reductions",
            self.max_reductions,
            "an integer >= 0",
        )
        m = self.multipliers()
        require(
            m[0] == 0 and all(x > 0 for x in m[1:]) and len(m) >= 2,
            "candidate multipliers",
            m,
            "0 first, then at least one > 0",
        )

    # -- what differs between the two methods -------------------------------------------------
    def multipliers(self) -> tuple[float, ...]:
        """(0, m_1, ..., m_{k−1}): candidate step sizes η_j = lr·m_j along −g̃."""
        raise NotImplementedError

    def choose(self, losses: Sequence[float], gradient_sq: float) -> int:
        """Index of the chosen candidate from the released mean losses L̃_j and ‖g̃‖²."""
        raise NotImplementedError

    # -- calibration ---------------------------------------------------------------------------
    def calibrate(self, facts: RunFacts) -> "StepSearch":
        """Check the inner optimizer; with a target ε, σ_0 from the worst-case ledger."""
        name = method_name(self)
        hyper = dict(facts.inner_hyperparameters or {})
        if facts.inner_optimizer is not None:  # make_private's facts always name it
            require(
                facts.inner_optimizer == "SGD"
                and not hyper.get("momentum")
                and not hyper.get("weight_decay"),
                "the optimizer",
                f"{facts.inner_optimizer}(momentum={hyper.get('momentum')}, weight_decay="
                f"{hyper.get('weight_decay')})",
                f"torch.optim.SGD without momentum or weight decay for method {name!r}",
                "The chosen candidate θ − η g̃ must be the step taken: use "
                "torch.optim.SGD(params, lr=...) (dpfy train: --momentum 0)",
            )
        lr = hyper.get("lr")
        require(isinstance(lr, (int, float)) and lr > 0, "optimizer lr", lr, "a number > 0")
        assert isinstance(lr, (int, float))  # the require above refused others
        out = replace(self, base_lr=float(lr))
        if facts.target_epsilon is not None:
            require(
                facts.delta is not None and facts.steps is not None,
                "target_delta and steps",
                (facts.delta, facts.steps),
                f"known for method {name!r} with a target ε",
                "Pass target_delta= and epochs= or max_steps= to make_private",
            )
            out = replace(out, base_noise=out._solve_base_noise(facts))
        return bind_facts(out, facts)

    def worst_case_ledger(self, facts: RunFacts, base_noise: float) -> Ledger:
        """The ledger of a run whose every step is at the smallest gradient noise σ_min =
        σ_0 (1 + γ)^(−L/2): every real run's per-step σ_eff is at least this one's, step by
        step (r_t ≤ L), so its ε is at most this ledger's."""
        method = replace(
            self, base_noise=base_noise, base_lr=self.base_lr or 1.0
        )  # the ledger does not depend on lr
        state = SearchState(reductions=self.max_reductions)
        ledger = Ledger(dataset_size=facts.dataset_size)
        assert facts.steps is not None  # a worst case needs the run's horizon
        for t in range(facts.steps):
            plan = method.plan(state, base_plan(facts, t, base_noise, 1.0))
            ledger.record_step(
                sampling=facts.sampling,
                sample_rate=facts.sample_rate,
                releases=step_releases(plan, method.releases(state, plan)),
                max_examples_per_user=facts.max_examples_per_user,
            )
        return ledger

    def _solve_base_noise(self, facts: RunFacts) -> float:
        """σ_0 whose worst-case ledger spends the target: each of its steps is one Gaussian at
        σ_eff with 1/σ_eff² = 1/σ_min² + k/σ_l² = ((1 + γ)^L + k/ratio²)/σ_0², so σ_0 is the
        plain calibration's σ_eff times sqrt((1 + γ)^L + k/ratio²)."""
        sigma_eff = calibrate_run_noise_multiplier(facts)  # calibrate checked the budget
        k = len(self.multipliers())
        return sigma_eff * math.sqrt(
            (1 + self.reduction) ** self.max_reductions + k / self.probe_noise_ratio**2
        )

    # -- the step ------------------------------------------------------------------------------
    def init(self) -> SearchState:
        calibrated(self.base_lr, f"method {method_name(self)!r}")
        return SearchState()

    def _factor(self, state: SearchState) -> float:
        return (1 + self.reduction) ** (-state.reductions / 2)

    def plan(self, state: SearchState, plan: StepPlan) -> StepPlan:
        sigma0 = self.base_noise if self.base_noise is not None else plan.noise_multiplier
        return replace(plan, noise_multiplier=sigma0 * self._factor(state))

    def _names(self) -> list[str]:
        return [f"{self.registry_name}_loss_{j}" for j in range(len(self.multipliers()))]

    def releases(self, state: SearchState, plan: StepPlan) -> Mapping[str, ReleaseSpec]:
        sigma_l = self.probe_noise_ratio * plan.noise_multiplier / self._factor(state)
        assert self.base_lr is not None  # init refused an uncalibrated method
        return {
            name: ReleaseSpec(
                sensitivity=self.loss_clip,
                noise_std=sigma_l * self.loss_clip,
                kind="loss",
                offsets=functools.partial(_along, self.base_lr * m),
                label=_probe_label(m),
            )
            for name, m in zip(self._names(), self.multipliers())
        }

    def _chosen(
        self,
        probed: Mapping[str, float],
        expected_batch_size: float,
        gradient: Mapping[str, torch.Tensor],
    ) -> tuple[int, tuple[float, ...]]:
        losses = tuple(float(probed[n]) / expected_batch_size for n in self._names())
        sq = float(sum(g.double().square().sum() for g in gradient.values()))
        return self.choose(losses, sq), losses

    def postprocess(
        self,
        state: SearchState,
        gradient: Mapping[str, torch.Tensor],
        plan: StepPlan,
        probed: Mapping[str, float],
        expected_batch_size: float,
    ) -> Mapping[str, torch.Tensor]:
        """m_i·g̃ for the chosen i: SGD(lr) then moves θ to the candidate θ − lr·m_i·g̃."""
        i, _ = self._chosen(probed, expected_batch_size, gradient)
        m = self.multipliers()[i]
        return {n: g * m for n, g in gradient.items()}

    def update(self, state: SearchState, outcome: StepOutcome) -> SearchState:
        i, losses = self._chosen(outcome.sums, outcome.expected_batch_size, outcome.noisy_gradient)
        stalled = i == 0
        return SearchState(
            reductions=min(state.reductions + stalled, self.max_reductions),
            chosen=self.multipliers()[i],
            losses=losses,
            no_progress=state.no_progress + stalled,
        )

    def min_noise_multiplier(self) -> float | None:
        """σ_0 (1 + γ)^(−L/2): the smallest gradient noise any step can use."""
        return (
            None
            if self.base_noise is None
            else self.base_noise * (1 + self.reduction) ** (-self.max_reductions / 2)
        )
