"""``make_schedule``: one entry point from a name and a privacy target to a ready schedule.

Used by ``make_private(..., schedule=...)`` callers, ``dpfy train --schedule NAME`` and the
reproductions. Every schedule it returns spends at most ``target_epsilon`` at ``delta`` over
its ``total_steps`` — by construction for the calibrated ones (the accountant solves the
scale), by truncation for explicit ones (early stopping at the target ε), and by the engine's
budget guard for ``plateau`` (which cannot be calibrated; STYLE.md R9).

Names:

- noise decay (``schedules.py``): ``constant``, ``time``, ``exponential``, ``step``,
  ``polynomial``. Options: ``rate`` (k), ``period``, ``final_ratio`` (σ_end/σ_0, polynomial),
  ``per`` (``"epoch"`` default, or ``"step"``), ``initial`` (σ_0: if given, the schedule is
  used as is and stopped early at the first step where ε would exceed the target; if not, σ_0
  is calibrated so the whole run spends exactly the target).
- validation plateau (``plateau.py``): ``plateau``. Options: ``initial`` (required),
  ``factor``, ``threshold``, ``min_noise_multiplier``, ``window``.
- Dynamic DP-SGD presets (``dynamic.py``): ``vanilla``, ``growing_mu``,
  ``sensitivity_decay``, ``dynamic``. Options: ``rho_mu``, ``rho_c``, ``stages``. The clip
  C_0 is ``max_grad_norm``. ``accountant="pld"`` (or ``"rdp"``) solves μ_0 against that
  accountant (rigorous); ``accountant="gdp"`` uses the paper's CLT bracket (Alg. 1).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from dpfy._require import require
from dpfy.adaptive._planned import steps_within_budget
from dpfy.adaptive.base import AdaptiveMethod, Deferred, bind_facts
from dpfy.types import RunFacts
from dpfy.adaptive.dynamic import PRESETS, calibrate_dynamic
from dpfy.adaptive.plateau import PlateauNoiseDecay
from dpfy.adaptive.schedules import KINDS, NoiseDecay
from dpfy.privacy.ledger import Sampling

__all__ = ["make_schedule", "SCHEDULE_NAMES", "deferred_schedule"]

SCHEDULE_NAMES = tuple(KINDS) + ("plateau",) + tuple(PRESETS)


def make_schedule(name: str, *, target_epsilon: float, delta: float, sample_rate: float,
                  total_steps: int, steps_per_epoch: int, max_grad_norm: float,
                  accountant: str = "pld", approximate: bool = False,
                  **options: Any) -> AdaptiveMethod:
    """Build schedule ``name`` for a run of ``total_steps`` updates at Poisson rate ``sample_rate``.

    Args:
      name: one of ``SCHEDULE_NAMES``.
      target_epsilon, delta: the run's budget.
      sample_rate: q, the sampler's Poisson rate.
      total_steps: optimizer updates planned (the budget guard's horizon).
      steps_per_epoch: updates per epoch (per-epoch decay and reporting).
      max_grad_norm: the clip C (C_0 for Dynamic DP-SGD).
      accountant: ``"pld"`` (default, rigorous), ``"rdp"``, or ``"gdp"`` (the paper's CLT; an
        approximation that can under-report ε).
      approximate: must be True with ``accountant="gdp"``: an explicit opt-in to the paper's
        CLT calibration (reproductions only). The run's rigorous ε is still what the ledger
        and the privacy report give.
      **options: schedule-specific, see the module docstring. Unknown options raise.

    The schedule returned records the facts it was calibrated for (``calibrated_for``);
    ``make_private`` refuses it under a run with other facts.
    """
    built = _build(name, target_epsilon=target_epsilon, delta=delta, sample_rate=sample_rate,
                   total_steps=total_steps, steps_per_epoch=steps_per_epoch,
                   max_grad_norm=max_grad_norm, accountant=accountant,
                   approximate=approximate, **options)
    return bind_facts(built, RunFacts(
        sampling=Sampling.POISSON, sample_rate=sample_rate, steps=total_steps,
        steps_per_epoch=steps_per_epoch, delta=delta, target_epsilon=target_epsilon,
        accountant=accountant, max_grad_norm=max_grad_norm))


def _build(name: str, *, target_epsilon: float, delta: float, sample_rate: float,
           total_steps: int, steps_per_epoch: int, max_grad_norm: float, accountant: str,
           approximate: bool, **options: Any) -> AdaptiveMethod:
    require(accountant != "gdp" or approximate, "accountant", accountant,
            "'pld' or 'rdp' unless approximate=True",
            "The GDP CLT can under-report ε; pass approximate=True only to reproduce a "
            "paper's GDP calibration (the report still gives the rigorous ε)")
    require(name in SCHEDULE_NAMES, "schedule", name, f"one of {sorted(SCHEDULE_NAMES)}")
    require(target_epsilon > 0, "target_epsilon", target_epsilon, "> 0")
    require(0 < delta < 1, "delta", delta, "in (0, 1)")
    require(0 < sample_rate <= 1, "sample_rate", sample_rate, "in (0, 1]")
    require(total_steps >= 1, "total_steps", total_steps, ">= 1")
    require(steps_per_epoch >= 1, "steps_per_epoch", steps_per_epoch, ">= 1")
    require(max_grad_norm > 0, "max_grad_norm", max_grad_norm, "> 0")
    budget = dict(target_epsilon=target_epsilon, delta=delta, sample_rate=sample_rate)
    if name in PRESETS:
        _check_options(name, options, {"rho_mu", "rho_c", "stages"})
        return calibrate_dynamic(name, total_steps=total_steps, clip0=max_grad_norm,
                                 calibration=accountant, **budget, **options)
    if name == "plateau":
        _check_options(name, options, {"initial", "factor", "threshold",
                                       "min_noise_multiplier", "window"})
        if "initial" not in options:
            PlateauNoiseDecay.calibrate_to_epsilon()   # raises, naming the budget guard
        options.setdefault("factor", 0.9)
        options.setdefault("threshold", 0.0)
        options.setdefault("min_noise_multiplier", options["initial"] / 4)
        return PlateauNoiseDecay(total_steps=total_steps, **options)
    _check_options(name, options, {"per", "rate", "period", "final_ratio", "initial"})
    return _noise_decay(name, total_steps=total_steps, steps_per_epoch=steps_per_epoch,
                        approximate=approximate,
                        accountant=accountant, budget=budget, **options)


def _noise_decay(kind: str, *, total_steps: int, steps_per_epoch: int, accountant: str,
                 approximate: bool,
                 budget: dict[str, float], per: str = "epoch", rate: float = 0.0,
                 period: int | None = None, final_ratio: float = 0.5,
                 initial: float | None = None) -> NoiseDecay:
    units = total_steps if per == "step" else -(-total_steps // steps_per_epoch)
    if kind == "polynomial":
        require(0 < final_ratio <= 1, "final_ratio", final_ratio, "in (0, 1]",
                "σ_end/σ_0 must not exceed 1 (σ_end > σ_0 is growth, not decay)")
    period = period if period is not None else (max(units - 1, 1) if kind == "polynomial" else 1)
    sigma0 = 1.0 if initial is None else initial
    sched = NoiseDecay(kind=kind, initial=sigma0, total_steps=total_steps, rate=rate,
                       period=period, final=final_ratio * sigma0 if kind == "polynomial" else 0.0,
                       per=per, steps_per_epoch=steps_per_epoch)
    if initial is None:                                    # calibrate σ_0 to spend the target
        from dpfy.privacy.calibration import calibrate_schedule_scale

        scale = calibrate_schedule_scale(shape=sched.shape(), accountant=accountant,
                                         approximate=approximate, **budget)
        return sched.scaled(scale)
    stop = steps_within_budget(sched, accountant=accountant, **budget)   # early stopping
    require(stop >= 1, "initial", initial, "large enough that one step fits the budget",
            "Raise σ_0 or the target ε")
    return replace(sched, total_steps=stop)


def _check_options(name: str, options: dict[str, Any], allowed: set[str]) -> None:
    extra = sorted(set(options) - allowed)
    require(not extra, "options", extra, f"among {sorted(allowed)} for schedule {name!r}")


def deferred_schedule(registry_name: str, name: str, **options: Any) -> Deferred:
    """Schedule ``name`` built by ``make_private`` for the run's facts (``make(...)`` path).

    Needs a target ε and δ (the schedule is calibrated to them) and Poisson sampling (the
    calibration assumes it).
    """
    require(name in SCHEDULE_NAMES, registry_name, name, f"one of {sorted(SCHEDULE_NAMES)}")

    def build(facts: RunFacts) -> AdaptiveMethod:
        require(facts.sampling == Sampling.POISSON, "sampling", facts.sampling.value,
                f"'poisson' for method {registry_name!r}",
                "Its calibration assumes Poisson sampling; use poisson_sampling=True")
        require(facts.target_epsilon is not None and facts.delta is not None,
                "target_epsilon", facts.target_epsilon, f"given for method {registry_name!r}",
                "It is calibrated to the run's budget: pass target_epsilon= and target_delta=")
        require(facts.steps is not None, "steps", None, f"known for method {registry_name!r}",
                "Pass epochs= or max_steps= to make_private")
        require(facts.max_grad_norm is not None, "max_grad_norm", None,
                f"a float for method {registry_name!r}", "Pass one clip norm")
        return make_schedule(name, target_epsilon=facts.target_epsilon, delta=facts.delta,
                             sample_rate=facts.sample_rate, total_steps=facts.steps,
                             steps_per_epoch=facts.steps_per_epoch or 1,
                             max_grad_norm=facts.max_grad_norm, accountant=facts.accountant,
                             **options)

    return Deferred(registry_name, build)
