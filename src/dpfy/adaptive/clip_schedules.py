"""Clip-norm schedules: C_t as a pure function of the step, for other methods to reuse.

References: sensitivity decay, Du et al. 2021, Eq. (14), §4.3; step decay by analogy with the
noise step schedule (Monir, Fauzan & Ghinita 2023, §3.1.1).

- ``exponential``: C_t = C_0 · r^(t/period)        r in (0, 1]   (Eq. 14 with r = 1/ρ_c,
                                                                  period = T, t = step + 1)
- ``step``:        C_t = C_0 · r^⌊t/period⌋        r in (0, 1]
- ``function``:    C_t = fn(step), any pure function of the step (R5: no hidden state)

Changing C_t alone does not change privacy: the noise multiplier σ_t (noise std / C_t) is what
the ledger records. The absolute noise std σ_t·C_t therefore shrinks with C_t.

Releases per step: the clipped-gradient sum (clip C_t), noise multiplier unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from dpfy._require import require
from dpfy.adaptive.base import Method, register
from dpfy.types import StepPlan

__all__ = ["ClipSchedule", "CLIP_KINDS"]

CLIP_KINDS = ("exponential", "step", "function")


@register("clip_schedule")
@dataclass(frozen=True)
class ClipSchedule(Method[None]):
    """Sets ``plan.clip`` by a schedule; leaves σ_t to the run or another method.

    Args:
      kind: one of ``CLIP_KINDS``.
      initial: C_0 > 0 (ignored for ``function``).
      rate: r in (0, 1].
      period: ≥ 1 step.
      fn: for ``function``: step -> C_t > 0, deterministic.
      offset: added to the step before the rule (1 gives the paper's 1-based t).
    """

    kind: str
    initial: float = 1.0
    rate: float = 1.0
    period: int = 1
    fn: Callable[[int], float] | None = None
    offset: int = 0

    def __post_init__(self) -> None:
        require(self.kind in CLIP_KINDS, "kind", self.kind, f"one of {list(CLIP_KINDS)}")
        require(self.initial > 0, "initial", self.initial, "> 0")
        require(
            0 < self.rate <= 1,
            "rate",
            self.rate,
            "in (0, 1]",
            "r < 1 shrinks the clip; r = 1 keeps it constant",
        )
        require(self.period >= 1, "period", self.period, ">= 1")
        require(
            (self.fn is not None) == (self.kind == "function"),
            "fn",
            self.fn,
            "given exactly when kind = 'function'",
        )
        require(self.offset >= 0, "offset", self.offset, ">= 0")

    sets = frozenset({"clip"})
    example_options = {"kind": "exponential", "initial": 1.0, "rate": 0.9}

    def clip(self, step: int) -> float:
        t = step + self.offset
        if self.kind == "function":
            assert self.fn is not None  # __post_init__ requires fn for kind 'function'
            c = float(self.fn(step))
            require(c > 0, "fn(step)", c, "> 0", f"The clip function returned {c} at step {step}")
            return c
        exponent = t / self.period if self.kind == "exponential" else t // self.period
        return self.initial * self.rate**exponent

    def plan(self, state: None, plan: StepPlan) -> StepPlan:
        return replace(plan, clip=self.clip(plan.step))
