"""Dynamic DP-SGD: a growing per-step GDP parameter μ_t and a decaying clip C_t.

References: Du et al. 2021, "Dynamic Differential-Privacy Preserving SGD", §4.2 (growing μ_t,
Algorithm 1), §4.3 (sensitivity decay), §4.4 (Algorithm 2).

With the paper's 1-based step t = 1..T (``t = step + 1`` for dpfy's 0-based steps):

    C_t = C_0 · ρ_c^(−t/T)                                  (Eq. 14)
    μ_t = μ_0 · ρ_μ^(t/T)                                   (Eq. 11)
    σ_t = C_t / μ_t = (C_0/μ_0) · (ρ_μ ρ_c)^(−t/T)           (Alg. 2 line 4; absolute noise std)
    z_t = σ_t / C_t = ρ_μ^(−t/T) / μ_0                       (noise multiplier on the sum)

Only z_t reaches the ledger, so privacy depends on ρ_μ and μ_0 and *not* on ρ_c or C_0:
sensitivity decay (ρ_μ = 1) is vanilla DP-SGD's accounting with a shrinking clip and noise.
Later steps spend more (μ_t grows): the ε-consumption curve stays below vanilla's until T
and meets it there.

μ_0 is solved in :meth:`DynamicDPSGD.calibrate` so the run meets its target (ε, δ), in one of
two ways (option ``calibration``; None: the run's accountant):

- ``calibration="gdp", approximate=True`` (the paper's Algorithm 1, an explicit opt-in):
  μ_tot from (ε, δ) by Eq. (1), then μ_0 from Eq. (12), p·sqrt(Σ_t expm1(μ_t²)) = μ_tot,
  by bisection on the bracket [μ_0⁽¹⁾/ρ_μ, μ_0⁽¹⁾] with μ_0⁽¹⁾ the constant-μ solution
  (Eq. 15). The CLT is an approximation and can under-report ε (Gopi et al. 2021), so the
  rigorous ε of the run (PLD) can exceed the target.
- ``calibration="pld"`` (the paper's "future work"): the accountant solves the scale s of
  z_t = s·ρ_μ^(−t/T) so the PLD ε of the ledger equals the target; μ_0 = 1/s.
  ``calibration="rdp"`` does the same against RDP (looser, so more noise).

The paper's variants are the option ``preset`` (§4.4): ``vanilla`` (ρ_μ = ρ_c = 1),
``growing_mu`` (ρ_c = 1), ``sensitivity_decay`` (ρ_μ = 1) and ``dynamic`` (both ratios);
``dpfy.adaptive.make("dynamic", preset="growing_mu", rho_mu=3)``, ``dpfy train --method
dynamic --method-options preset=growing_mu rho_mu=3``. C_0 is the run's ``max_grad_norm``.

Releases per step: the clipped-gradient sum (clip C_t), noise multiplier z_t.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from dpfy._require import require
from dpfy.adaptive._planned import PlannedSchedule, check_calibration, require_budget
from dpfy.adaptive.base import bind_facts, calibrated, register, run_clip, run_steps
from dpfy.privacy import gdp
from dpfy.privacy.calibration import calibrate_schedule_scale
from dpfy.types import RunFacts

__all__ = [
    "DynamicDPSGD",
    "PRESETS",
    "CALIBRATIONS",
    "DEFAULT_RHO",
    "solve_mu0",
    "calibrate_dynamic",
]

# preset name -> (uses ρ_μ, uses ρ_c); the other ratio is fixed at 1 (§4.4).
PRESETS = {
    "vanilla": (False, False),  # constant μ and C: DP-SGD with the GDP CLT (Bu et al.)
    "growing_mu": (True, False),  # Alg. 1
    "sensitivity_decay": (False, True),  # §4.3
    "dynamic": (True, True),  # Alg. 2
}
CALIBRATIONS = ("gdp", "pld", "rdp")
# ρ = 2 (1/ρ = 0.5) is the middle of the paper's grid {0.1, ..., 0.8}, chosen a priori; the
# paper does not report its selected values.
DEFAULT_RHO = 2.0


@register("dynamic")
@dataclass(frozen=True)
class DynamicDPSGD(PlannedSchedule):
    """Dynamic DP-SGD's schedule of μ_t and C_t (module docstring).

    Args:
      preset: one of ``PRESETS``; a ratio the preset does not use is 1 (giving it otherwise
        is refused).
      rho_mu: ρ_μ = μ_T/μ_0 ≥ 1; None: ``DEFAULT_RHO`` if the preset uses it, else 1.
      rho_c: ρ_c = C_0/C_T ≥ 1; None: likewise.
      stages: None (the paper: a new value every step) or K ≤ T, holding μ_t and C_t constant
        within K equal stages at the value of each stage's last step. Fewer distinct steps make
        PLD accounting and calibration far cheaper; the schedule trained and the ledger
        accounted are the same either way.
      calibration: the accountant μ_0 is solved against (``CALIBRATIONS``); None: the run's.
      approximate: must be True with ``calibration="gdp"`` (the paper's CLT; reproductions).
      mu0: μ_0 > 0, the GDP parameter before step 1 (never applied itself; μ_1 = μ_0
        ρ_μ^(1/T)); None: solved in ``calibrate`` for the run's target ε.
      total_steps: T, fixed in advance (later steps are refused); None: the run's steps.
      clip0: C_0 > 0, the clip before step 1 (replaces the run's C); None: the run's
        ``max_grad_norm``.
    """

    preset: str = "dynamic"
    rho_mu: float | None = None
    rho_c: float | None = None
    stages: int | None = None
    # keyword-only: they came after the shared options, which are keyword-only now (a
    # positional argument must never land in another field than it did)
    mu0: float | None = field(default=None, kw_only=True)
    clip0: float | None = field(default=None, kw_only=True)

    sets = frozenset({"noise_multiplier", "clip"})
    example_options = {"stages": 2}

    def __post_init__(self) -> None:
        require(self.preset in PRESETS, "preset", self.preset, f"one of {sorted(PRESETS)}")
        for name, used in zip(("rho_mu", "rho_c"), PRESETS[self.preset]):
            value = getattr(self, name)
            if value is None:
                object.__setattr__(self, name, DEFAULT_RHO if used else 1.0)
            elif not used:
                require(
                    value == 1,
                    name,
                    value,
                    f"1 (or unset) for preset {self.preset!r}",
                    f"Preset {self.preset!r} keeps it fixed; use preset 'dynamic' to set "
                    f"both ratios",
                )
        assert self.rho_mu is not None and self.rho_c is not None  # filled in just above
        require(
            self.rho_mu >= 1,
            "rho_mu",
            self.rho_mu,
            ">= 1",
            "ρ_μ = μ_T/μ_0; the paper's grid is 1/ρ in {0.1, ..., 0.8}",
        )
        require(
            self.rho_c >= 1,
            "rho_c",
            self.rho_c,
            ">= 1",
            "ρ_c = C_0/C_T; the paper's grid is 1/ρ in {0.1, ..., 0.8}",
        )
        check_calibration(self.calibration, self.approximate)
        if self.mu0 is not None:
            require(
                self.mu0 > 0,
                "mu0",
                self.mu0,
                "> 0",
                "Leave it unset to solve μ_0 for the run's target ε",
            )
        if self.total_steps is not None:
            require(self.total_steps >= 1, "total_steps", self.total_steps, ">= 1")
        if self.clip0 is not None:
            require(self.clip0 > 0, "clip0", self.clip0, "> 0")
        if self.stages is not None:
            require(
                isinstance(self.stages, int) and self.stages >= 1,
                "stages",
                self.stages,
                "None or an integer >= 1",
            )
            if self.total_steps is not None:
                require(
                    self.stages <= self.total_steps,
                    "stages",
                    self.stages,
                    f"None or in [1, total_steps = {self.total_steps}]",
                )

    def calibrate(self, facts: RunFacts) -> "DynamicDPSGD":
        """T and C_0 from the run; μ_0 solved for its target ε unless given."""
        steps = run_steps(self.total_steps, facts, "dynamic")
        fix = "Pass one clip norm (C_0), or give clip0="
        clip0 = run_clip(self.clip0, facts, "max_grad_norm", fix, "a float for method 'dynamic'")
        out = replace(self, total_steps=steps, clip0=float(clip0))
        if out.mu0 is None:
            require_budget(facts, "dynamic")
            assert facts.target_epsilon is not None and facts.delta is not None  # require_budget
            out = replace(
                out,
                mu0=_solve(
                    out,
                    facts.target_epsilon,
                    facts.delta,
                    facts.sample_rate,
                    self.calibration or facts.accountant,
                ),
            )
        return bind_facts(out, facts)

    def _mu0(self) -> float:
        fix = "Pass it to make_private(method=...), which solves μ_0, or give mu0="
        return float(calibrated(self.mu0, "method 'dynamic'", fix, known="μ_0"))

    def fraction(self, step: int) -> float:
        """t/T for 0-based ``step`` (paper t = step + 1), rounded up to the stage end."""
        self.check_step(step)
        t, big_t = step + 1, self.horizon()
        if self.stages is None:
            return t / big_t
        stage = -(-t * self.stages // big_t)  # ⌈tK/T⌉ in 1..K, exact integers
        return stage / self.stages

    def mu(self, step: int) -> float:
        """μ_t = μ_0 ρ_μ^(t/T) (Eq. 11)."""
        assert self.rho_mu is not None  # __post_init__ fills it
        return self._mu0() * self.rho_mu ** self.fraction(step)

    def clip(self, step: int, base_clip: float | torch.Tensor = 1.0) -> float:
        """C_t = C_0 ρ_c^(−t/T) (Eq. 14); ``base_clip`` is ignored (C_0 is the schedule's)."""
        c0 = self.clip0 if self.clip0 is not None else 1.0
        assert self.rho_c is not None  # __post_init__ fills it
        return c0 * self.rho_c ** (-self.fraction(step))

    def sigma(self, step: int) -> float:
        """σ_t = C_t/μ_t, the absolute noise std on the gradient sum (Alg. 2 line 4)."""
        return self.clip(step) / self.mu(step)

    def noise_multiplier(self, step: int) -> float:
        """z_t = σ_t/C_t = 1/μ_t, what the ledger records."""
        return 1.0 / self.mu(step)

    def fractions(self) -> np.ndarray:
        """t/T for every step, shape (T,); the vectorized :meth:`fraction`."""
        big_t = self.horizon()
        t = np.arange(1, big_t + 1)
        if self.stages is None:
            return t / big_t
        return -(-t * self.stages // big_t) / self.stages

    def mus(self) -> np.ndarray:
        """μ_t for every step, shape (T,)."""
        assert self.rho_mu is not None  # __post_init__ fills it
        return self._mu0() * self.rho_mu ** self.fractions()

    def noise_multipliers(self) -> np.ndarray:
        """z_t = 1/μ_t for every step, shape (T,)."""
        return 1.0 / self.mus()

    def mu_tot(self, sample_rate: float, steps: int | None = None) -> float:
        """The paper's CLT μ_tot (Eq. 9) after ``steps`` steps (default T), via dpfy.privacy.gdp."""
        mus = self.mus()[: self.horizon() if steps is None else steps]
        return float(gdp.mu_total(sample_rate, mus))


def solve_mu0(
    mu_tot: float,
    *,
    sample_rate: float,
    total_steps: int,
    rho_mu: float,
    stages: int | None = None,
    tol: float = 1e-13,
) -> float:
    """μ_0 with Eq. (9) of the schedule equal to ``mu_tot`` (the paper's Algorithm 1, step 2).

    Eq. (9) increases strictly with μ_0, and every μ_t lies in [μ_0, ρ_μ μ_0], so the root
    lies in [μ_0⁽¹⁾/ρ_μ, μ_0⁽¹⁾] where μ_0⁽¹⁾ = sqrt(log(μ_tot²/(p²T) + 1)) solves the
    constant-μ case (Eq. 15). Bisection to relative ``tol``; μ_tot itself is evaluated by
    ``dpfy.privacy.gdp.mu_total`` so there is one Eq. (9) in dpfy.
    """
    require(mu_tot > 0, "mu_tot", mu_tot, "> 0")
    require(0 < sample_rate <= 1, "sample_rate", sample_rate, "in (0, 1]")
    flat = math.sqrt(math.log1p(mu_tot**2 / (sample_rate**2 * total_steps)))  # Eq. (15)
    if rho_mu == 1:
        return flat

    def excess(mu0: float) -> float:
        sched = DynamicDPSGD(mu0=mu0, total_steps=total_steps, rho_mu=rho_mu, stages=stages)
        return sched.mu_tot(sample_rate) - mu_tot

    lo, hi = flat / rho_mu, flat
    while hi - lo > tol * hi:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if excess(mid) < 0 else (lo, mid)
    return 0.5 * (lo + hi)


def _check_calibration(calibration: str) -> None:
    require(
        calibration in CALIBRATIONS,
        "calibration",
        calibration,
        f"one of {list(CALIBRATIONS)}",
        "Use 'pld' for a tight rigorous guarantee; 'gdp' reproduces the paper's CLT calibration",
    )


def _solve(
    shape: DynamicDPSGD, target_epsilon: float, delta: float, sample_rate: float, calibration: str
) -> float:
    """μ_0 of ``shape`` (its T, ρ_μ, stages) whose run spends ``target_epsilon`` at ``delta``."""
    _check_calibration(calibration)
    require(target_epsilon > 0, "target_epsilon", target_epsilon, "> 0")
    if calibration == "gdp":
        assert shape.rho_mu is not None  # __post_init__ fills it
        mu_tot = gdp.mu_for_epsilon(target_epsilon, delta)  # Eq. (1) inverted
        return solve_mu0(
            mu_tot,
            sample_rate=sample_rate,
            total_steps=shape.horizon(),
            rho_mu=shape.rho_mu,
            stages=shape.stages,
        )
    # z_t = s · ρ_μ^(−t/T): the shape is the noise multipliers at μ_0 = 1, and μ_0 = 1/s.
    scale = calibrate_schedule_scale(
        shape=replace(shape, mu0=1.0).noise_multipliers(),
        target_epsilon=target_epsilon,
        delta=delta,
        sample_rate=sample_rate,
        accountant=calibration,
    )
    return 1.0 / scale


def calibrate_dynamic(
    preset: str = "dynamic",
    *,
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    total_steps: int,
    clip0: float = 1.0,
    rho_mu: float | None = None,
    rho_c: float | None = None,
    stages: int | None = None,
    calibration: str = "pld",
) -> DynamicDPSGD:
    """A :class:`DynamicDPSGD` of ``preset`` whose run of ``total_steps`` steps at Poisson rate
    ``sample_rate`` spends ``target_epsilon`` at ``delta`` (without a run's facts: the
    calibration audit of the reproductions).

    Args:
      calibration: ``"gdp"`` (paper's CLT, Alg. 1), ``"pld"`` (rigorous: the run's PLD ε
        equals the target to the accountant's precision) or ``"rdp"``.
      rho_mu, rho_c, stages: as :class:`DynamicDPSGD`.
    """
    _check_calibration(calibration)
    require(total_steps >= 1, "total_steps", total_steps, ">= 1")
    shape = DynamicDPSGD(
        preset=preset,
        rho_mu=rho_mu,
        rho_c=rho_c,
        stages=stages,
        total_steps=total_steps,
        clip0=clip0,
    )
    return replace(shape, mu0=_solve(shape, target_epsilon, delta, sample_rate, calibration))
